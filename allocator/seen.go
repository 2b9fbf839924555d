package allocator

import "slices"

// stamped is an entry of a seenList: a *podInfo or a *claimInfo, which
// keeps its own place in the list.
type stamped interface {
	comparable
	seenIdx() *int32
	// listedRef is the entry's ref: empty, or the key string (a pod's
	// name, a claim's UID) a listing gave it when scan last found it by
	// content in the pool's index, which it is then the index's entry
	// under. Its address finds the entry's stamp in the pool's refTable
	// (docs/design.md §13).
	listedRef() *string
}

func (pi *podInfo) seenIdx() *int32      { return &pi.idx }
func (ci *claimInfo) seenIdx() *int32    { return &ci.idx }
func (pi *podInfo) listedRef() *string   { return &pi.ref }
func (ci *claimInfo) listedRef() *string { return &ci.ref }

// stamp is an entry and the gen of the round that last listed it.
type stamp[T stamped] struct {
	v    T
	seen uint64
}

// seenList holds every entry of one kind in a pool, each at its place, so
// that a round finds the entries missing from its listing by scanning a
// dense array. Add and remove cost O(1).
type seenList[T stamped] []stamp[T]

// add gives v, not in the list, its place.
func (l *seenList[T]) add(v T) {
	*v.seenIdx() = int32(len(*l))
	*l = append(*l, stamp[T]{v: v})
}

// addSeen is add, then see in round gen.
func (l *seenList[T]) addSeen(v T, gen uint64) {
	*v.seenIdx() = int32(len(*l))
	*l = append(*l, stamp[T]{v: v, seen: gen})
}

// remove takes v's place back; v not in the list is ignored.
func (l *seenList[T]) remove(v T) {
	if l.at(v) == nil {
		return
	}
	s := *l
	i := *v.seenIdx()
	last := len(s) - 1
	s[i] = s[last]
	*s[i].v.seenIdx() = i
	s[last] = stamp[T]{}
	*l = s[:last]
	*v.seenIdx() = -1
	*v.listedRef() = ""
	if cap(*l) > 64 && len(*l) < cap(*l)/4 {
		*l = slices.Clone(*l)
	}
}

// at returns v's stamp, nil when v is not in the list.
func (l seenList[T]) at(v T) *stamp[T] {
	if i := *v.seenIdx(); i >= 0 && int(i) < len(l) && l[i].v == v {
		return &l[i]
	}
	return nil
}

// see records that v is listed in round gen.
func (l seenList[T]) see(v T, gen uint64) {
	if s := l.at(v); s != nil {
		s.seen = gen
	}
}

// seenIn reports whether v was listed in round gen.
func (l seenList[T]) seenIn(v T, gen uint64) bool {
	s := l.at(v)
	return s != nil && s.seen == gen
}
