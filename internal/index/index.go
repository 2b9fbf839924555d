// Package index is a hash table of entries found by a string key each entry
// carries (a pod's name, a claim's UID): the entries themselves, not a map
// from a key to an entry, so a key costs no string header of its own.
package index

import (
	"hash/maphash"
	"iter"
)

// Index finds entries by the key each entry carries. It is a hash table of
// the entries themselves: 9 bytes a slot (the pointer and a tag from its
// hash) instead of the 25 of a Go map from a string to a pointer. At
// 40,000 or 50,000 entries that is 0.6 MiB against 1.7.
//
// It uses linear probing with deletion by backward shift (no tombstones)
// and keeps at least one slot in eight empty. Slots come in groups of
// eight whose tags are stored next to their entries, so that a probe
// reads one place in memory, as a Go map's does. An Index with only Key
// set is empty and ready to use. Iteration (All) must not run while the
// index changes.
type Index[E comparable] struct {
	// Key returns the key of an entry; it must not change while the
	// entry is in the index.
	Key  func(E) string
	seed maphash.Seed
	// groups hold the slots, slot i at groups[i/8] place i%8; mask is
	// the number of slots less one (a power of two less one), n the
	// number of entries.
	groups []group[E]
	mask   int
	n      int
}

// group is eight slots: tags[j] is 0 where entries[j] is empty, else 1
// plus the low 7 bits of the entry's key's hash.
type group[E comparable] struct {
	tags    [8]uint8
	entries [8]E
}

// New returns an empty index keyed by key, sized for n entries.
func New[E comparable](key func(E) string, n int) Index[E] {
	x := Index[E]{Key: key, seed: maphash.MakeSeed()}
	x.Grow(n)
	return x
}

// size is the number of slots.
func (x *Index[E]) size() int { return len(x.groups) * 8 }

func (x *Index[E]) tag(i int) *uint8 { return &x.groups[i>>3].tags[i&7] }
func (x *Index[E]) entry(i int) *E   { return &x.groups[i>>3].entries[i&7] }

// resize rehashes what the index holds into size slots, a power of two
// of at least 8.
func (x *Index[E]) resize(size int) {
	if x.seed == (maphash.Seed{}) {
		x.seed = maphash.MakeSeed()
	}
	old := x.groups
	x.groups, x.mask, x.n = make([]group[E], size/8), size-1, 0
	for g := range old {
		for j, t := range old[g].tags {
			if t != 0 {
				x.put(old[g].entries[j])
			}
		}
	}
}

func (x *Index[E]) hash(k string) (start int, tag uint8) {
	h := maphash.String(x.seed, k)
	return int(h>>7) & x.mask, uint8(h&0x7f) + 1
}

// Get returns the entry with key k, or the zero E.
func (x *Index[E]) Get(k string) E {
	var zero E
	if x.n == 0 {
		return zero
	}
	i, tag := x.hash(k)
	for {
		g := &x.groups[i>>3]
		switch t := g.tags[i&7]; {
		case t == 0:
			return zero
		case t == tag && x.Key(g.entries[i&7]) == k:
			return g.entries[i&7]
		}
		i = (i + 1) & x.mask
	}
}

// ManyMax is the most keys GetMany looks up at once.
const ManyMax = 64

// GetMany sets out[i] to Get(keys[i]) for each of keys, at most ManyMax
// of them (out has room for them). It looks them up in stages: every key's
// hash, then every key's home slot, then every entry its tag leads to,
// then every entry's key compared. The cache misses of one stage are of
// different keys, independent of each other, so that the processor waits
// for them at once rather than one after another: for keys in no
// particular order in an index larger than the caches, that is several
// times faster than as many Gets.
func (x *Index[E]) GetMany(keys []string, out []E) {
	var zero E
	if x.n == 0 {
		clear(out[:len(keys)])
		return
	}
	var (
		at  [ManyMax]int32 // the slot where a key's probe stopped
		tag [ManyMax]uint8
		key [ManyMax]string // the key of the entry at that slot
	)
	for i, k := range keys {
		s, t := x.hash(k)
		at[i], tag[i] = int32(s), t
	}
	for i := range keys {
		// The first slot that holds k's tag, or is empty.
		s := int(at[i])
		for {
			t := x.groups[s>>3].tags[s&7]
			if t == 0 || t == tag[i] {
				break
			}
			s = (s + 1) & x.mask
		}
		at[i] = int32(s)
	}
	for i := range keys {
		s := int(at[i])
		g := &x.groups[s>>3]
		if g.tags[s&7] == 0 {
			out[i] = zero
			continue
		}
		out[i] = g.entries[s&7]
		key[i] = x.Key(out[i])
	}
	for i, k := range keys {
		if out[i] != zero && key[i] != k {
			out[i] = x.Get(k) // another key with the same tag came first
		}
	}
}

// Set puts e in the index, in place of the entry with its key if any.
func (x *Index[E]) Set(e E) {
	x.room()
	x.put(e)
}

// Insert puts e in the index unless an entry with its key is there: it
// returns that entry and false then, e and true otherwise. It looks the
// key up once, where Get then Set would twice.
func (x *Index[E]) Insert(e E) (E, bool) {
	x.room()
	i, tag, found := x.find(x.Key(e))
	if found {
		return *x.entry(i), false
	}
	*x.tag(i), *x.entry(i) = tag, e
	x.n++
	return e, true
}

// Grow makes room for n entries in all, so that adding up to n costs no
// resize: the index takes the smallest power of two of slots, 8 or more,
// with n at most 7/8 of it.
func (x *Index[E]) Grow(n int) {
	size := max(8, x.size())
	for size-size/8 < n {
		size *= 2
	}
	if size > x.size() {
		x.resize(size)
	}
}

// room makes room for one more entry.
func (x *Index[E]) room() {
	switch {
	case len(x.groups) == 0:
		x.resize(8)
	case x.n+1 > x.size()-x.size()/8:
		x.resize(2 * x.size())
	}
}

// put is Set without the check for room.
func (x *Index[E]) put(e E) {
	i, tag, found := x.find(x.Key(e))
	if !found {
		*x.tag(i) = tag
		x.n++
	}
	*x.entry(i) = e
}

// find returns the slot of the entry with key k and true, or the empty
// slot where it would go and false; tag is k's. The index has room.
func (x *Index[E]) find(k string) (i int, tag uint8, found bool) {
	i, tag = x.hash(k)
	for {
		switch t := *x.tag(i); {
		case t == 0:
			return i, tag, false
		case t == tag && x.Key(*x.entry(i)) == k:
			return i, tag, true
		}
		i = (i + 1) & x.mask
	}
}

// Del removes the entry with key k, if any.
func (x *Index[E]) Del(k string) {
	if x.n == 0 {
		return
	}
	i, tag := x.hash(k)
	for {
		t := *x.tag(i)
		if t == 0 {
			return
		}
		if t == tag && x.Key(*x.entry(i)) == k {
			break
		}
		i = (i + 1) & x.mask
	}
	// Shift back the entries after i that probed past it, so that every
	// entry stays reachable from its home slot without gaps.
	var zero E
	for j := (i + 1) & x.mask; *x.tag(j) != 0; j = (j + 1) & x.mask {
		home, _ := x.hash(x.Key(*x.entry(j)))
		// The entry at j may move to i when i lies on its probe path:
		// cyclically in [home, j).
		if (j-home)&x.mask >= (j-i)&x.mask {
			*x.tag(i), *x.entry(i) = *x.tag(j), *x.entry(j)
			i = j
		}
	}
	*x.tag(i), *x.entry(i) = 0, zero
	x.n--
}

// Len is the number of entries.
func (x *Index[E]) Len() int { return x.n }

// All yields every entry, in no fixed order.
func (x *Index[E]) All() iter.Seq[E] {
	return func(yield func(E) bool) {
		for g := range x.groups {
			for j, t := range x.groups[g].tags {
				if t != 0 && !yield(x.groups[g].entries[j]) {
					return
				}
			}
		}
	}
}

// Entries returns every entry, for a caller that changes the index as it
// goes through them.
func (x *Index[E]) Entries() []E {
	out := make([]E, 0, x.n)
	for e := range x.All() {
		out = append(out, e)
	}
	return out
}
