package allocator

import (
	"math/bits"
	"slices"
	"unsafe"

	"github.com/poolalloc/poolalloc/internal/index"
)

// refTable finds the place in a seenList of the entry a listed pod or claim
// is, from the address of its key string (a pod's name, a claim's UID) as
// the listing gives it, without reading the string (docs/design.md §13).
//
// An informer cache's List copies its objects but not their strings: from
// one listing to the next, an unchanged object's key string is the same
// bytes at the same address, and only the objects' order changes. An
// entry keeps the key string it was last found under by content (its ref,
// stamped.listedRef), which keeps those bytes where they are; the table
// maps the address of each ref to the entry's place in its seenList. A listed key whose address
// and length are a ref's is that ref's bytes, since a string's bytes do
// not change: finding its entry costs a probe in a table that fits in the
// processor's caches, not a read of the key and of the index.
//
// The table is a hint and may be stale: a place it gives is taken only if
// the entry there still has that ref (see sameString); anything else is
// found by content as before.
type refTable struct {
	// slots[i] is 0 when empty, else the fingerprint of a ref's address
	// (the low 32 bits of its hash) in the high half and its place plus
	// one in the low half. mask is len(slots)-1, used the number of slots
	// filled (stale ones included).
	slots []uint64
	mask  uint64
	shift uint8
	used  int
}

// refHash hashes a string's address and length.
func refHash(s string) uint64 {
	return (uint64(uintptr(unsafe.Pointer(unsafe.StringData(s)))) ^ uint64(len(s))<<52) * 0x9e3779b97f4a7c15
}

// sameString reports whether a and b are the same bytes at the same
// address, without reading them.
func sameString(a, b string) bool {
	return len(a) == len(b) && unsafe.StringData(a) == unsafe.StringData(b)
}

// start returns where the probe for hash h begins, and h's fingerprint.
func (t *refTable) start(h uint64) (uint64, uint32) {
	return h >> t.shift, uint32(h)
}

// lookup returns the place the table gives for key, -1 if none.
func (t *refTable) lookup(key string) int32 {
	if t.used == 0 || key == "" {
		return -1
	}
	return t.lookupHash(refHash(key))
}

func (t *refTable) lookupHash(h uint64) int32 {
	i, fp := t.start(h)
	for {
		v := t.slots[i]
		if v == 0 {
			return -1
		}
		if uint32(v>>32) == fp {
			return int32(uint32(v)) - 1
		}
		i = (i + 1) & t.mask
	}
}

// put records that ref is at place i. It reports false when the table is
// too full to take it: the caller rebuilds it (reset, then put for every
// ref) and tries again.
func (t *refTable) put(ref string, i int32) bool { return t.putHash(refHash(ref), i) }

func (t *refTable) putHash(h uint64, i int32) bool {
	if len(t.slots) == 0 || t.used >= len(t.slots)/4*3 {
		return false
	}
	s, fp := t.start(h)
	v := uint64(fp)<<32 | uint64(uint32(i+1))
	for {
		switch old := t.slots[s]; {
		case old == 0:
			t.slots[s] = v
			t.used++
			return true
		case uint32(old>>32) == fp:
			t.slots[s] = v
			return true
		}
		s = (s + 1) & t.mask
	}
}

// reset empties the table, sized for n refs.
func (t *refTable) reset(n int) {
	size := 64
	if n > 16 {
		size = 1 << bits.Len(uint(n*2-1)) // at least 2n
	}
	if len(t.slots) == size {
		clear(t.slots)
	} else {
		t.slots = make([]uint64, size)
	}
	t.mask, t.shift, t.used = uint64(size-1), uint8(64-bits.TrailingZeros(uint(size))), 0
}

// setRef gives the entry at place i of l its ref, key (the key the
// listing gave it), and records it in t, rebuilding t from l's refs when
// it is full.
func setRef[T stamped](t *refTable, l seenList[T], i int32, key string) {
	*l[i].v.listedRef() = key
	if t.put(key, i) {
		return
	}
	t.reset(len(l))
	for j := range l {
		if ref := *l[j].v.listedRef(); ref != "" {
			t.put(ref, int32(j))
		}
	}
}

// unorderedScratch is what scanUnordered reuses from round to round.
type unorderedScratch struct {
	at         []int32
	slow, take []int32
	podHeads   []podHead
	claimHeads []claimHead
}

// grown returns s resized to n, reusing its array when it has room (its
// elements are not cleared).
func grown[E any](s []E, n int) []E { return slices.Grow(s[:0], n)[:n] }

// place notes that head i of the rest of a listing may be the entry at
// place s of the seenList (pass 1 of scanUnordered): at[s] is i+1 unless
// s is out of range or taken, and then i is left in slow.
func (sc *unorderedScratch) place(at []int32, s int32, i int) {
	if s >= 0 && int(s) < len(at) && at[s] == 0 {
		at[s] = int32(i) + 1
	} else {
		sc.slow = append(sc.slow, int32(i))
	}
}

// begin readies the scratch for a seenList of m entries, returning at
// (its places, none noted) and emptying slow and take.
func (sc *unorderedScratch) begin(m int) []int32 {
	sc.at = grown(sc.at, m)
	clear(sc.at)
	sc.slow, sc.take = sc.slow[:0], sc.take[:0]
	return sc.at
}

// unorderedScan is the rest of a listing in no particular order, read
// into heads, for scanUnordered to find the entries of (pods, or claims).
type unorderedScan[T stamped, H any] struct {
	seen  seenList[T]
	refs  *refTable
	index *index.Index[T]
	gen   uint64
	heads []H
	// key returns the key of heads[i].
	key func(i int) string
	// one is scanPod or scanClaim for heads[i], its entry v and stamp st
	// (nil and nil for one the pool has not).
	one func(i int, v T, st *stamp[T]) (bool, error)
	// twice is the error of heads[i] when it is a second listing of an
	// entry.
	twice func(i int) error
}

// scanUnordered does what scan does for the rest of a listing in which
// the hint has missed too often (docs/design.md §13): it returns the
// places in heads of the pods or claims to observe, in order, or the error
// of the first refused one in the listing's order. It takes the listing in
// three passes:
//
//  1. (the caller's, with sc.place) Each head is looked up in a refTable
//     by the address of its key, which reads neither the key nor the
//     entry: a place is noted for it in at (in the order of
//     the seenList), or it is left in sc.slow for pass 3.
//  2. The seenList is walked in its own order: the entries read one after
//     another and only the heads (a dense array) out of order. An entry
//     whose ref is the head's key is the head's entry, scanned as scan
//     would; any other head is left for pass 3.
//  3. The heads left (new pods and claims, new strings, the second of a
//     duplicate) are found by content in the index, a chunk at a time in
//     the listing's order, and the entries found get their refs.
//
// Errors are those of scan, of the first refused head in the listing's
// order: pass 2 notes its errors with their places; pass 3 stops at the
// first of its own and after the first noted; a head of pass 3 whose entry
// pass 2 stamped from a later place is the first listing of it, and the
// later one is refused as a second.
func scanUnordered[T stamped, H any](u *unorderedScan[T, H], sc *unorderedScratch) ([]int32, error) {
	var zero T
	at, slow, take := sc.at, sc.slow, sc.take
	defer func() { sc.slow, sc.take = slow[:0], take[:0] }()
	// 2.
	errAt, firstErr := len(u.heads), error(nil)
	fail := func(i int, err error) {
		if i < errAt {
			errAt, firstErr = i, err
		}
	}
	inOrder := true
	for s, v := range at {
		if v == 0 {
			continue
		}
		i, st := int(v-1), &u.seen[s]
		if !sameString(*st.v.listedRef(), u.key(i)) {
			at[s] = 0
			slow, inOrder = append(slow, int32(i)), false
			continue
		}
		if t, err := u.one(i, st.v, st); err != nil {
			fail(i, err)
		} else if t {
			take = append(take, int32(i))
		}
	}
	if !inOrder {
		slices.Sort(slow)
	}
	// 3.
	var (
		keys   [scanChunk]string
		found  [scanChunk]T
		stamps [scanChunk]*stamp[T]
	)
	for c := 0; c < len(slow) && int(slow[c]) < errAt; c += scanChunk {
		chunk := slow[c:min(c+scanChunk, len(slow))]
		for j, i := range chunk {
			keys[j] = u.key(int(i))
		}
		u.index.GetMany(keys[:len(chunk)], found[:len(chunk)])
		stampsOf(u.seen, found[:len(chunk)], stamps[:len(chunk)])
		for j, i := range chunk {
			if int(i) >= errAt {
				break
			}
			v, st := found[j], stamps[j]
			if st != nil && st.seen == u.gen {
				if q := int(at[*v.seenIdx()]) - 1; q > int(i) {
					fail(q, u.twice(q))
					continue
				}
			}
			t, err := u.one(int(i), v, st)
			if err != nil {
				fail(int(i), err)
				break
			}
			if t {
				take = append(take, i)
			}
			if v != zero && st != nil {
				setRef(u.refs, u.seen, *v.seenIdx(), keys[j])
			}
		}
	}
	clear(keys[:])
	if firstErr != nil {
		return nil, firstErr
	}
	slices.Sort(take)
	return take, nil
}
