package allocator

import (
	"cmp"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// byAddress is a stable sort by address, zero ones first, whatever the
// addresses' spread.
func TestByAddressIsAStableSort(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base := uintptr(rapid.Uint64Range(1, 1<<47).Draw(t, "base")) // addresses of a process: 48 bits
		addrs := rapid.SliceOfN(rapid.OneOf(
			rapid.Just(uintptr(0)),
			rapid.Map(rapid.Uint16(), func(d uint16) uintptr { return base + uintptr(d) }),
			rapid.Map(rapid.Uint64Range(0, 1<<47), func(d uint64) uintptr { return base + uintptr(d) }),
		), 0, 300).Draw(t, "addrs")
		n := len(addrs)
		var count [1 << 16]int32
		got := byAddress(addrs, make([]int32, n), make([]int32, n), make([]uintptr, n), &count)
		want := make([]int32, n)
		for i := range want {
			want[i] = int32(i)
		}
		slices.SortStableFunc(want, func(a, b int32) int {
			x, y := addrs[a], addrs[b]
			if (x == 0) != (y == 0) {
				return cmp.Compare(min(x, 1), min(y, 1))
			}
			return cmp.Compare(x, y)
		})
		if !slices.Equal(got, want) {
			t.Fatalf("byAddress(%v) = %v, want %v", addrs, got, want)
		}
	})
}

// reorder keeps every entry once, the ones given first in their order,
// each knowing its place.
func TestSeenListReorder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var l seenList[*podInfo]
		n := rapid.IntRange(0, 30).Draw(t, "n")
		for i := range n {
			l.addSeen(newPodInfo("p"+string(rune('a'+i)), ""), uint64(i))
		}
		all := make([]*podInfo, n)
		for i, s := range l {
			all[i] = s.v
		}
		first := rapid.SliceOfNDistinct(rapid.SampledFrom(append([]*podInfo{nil}, all...)), 0, n, func(pi *podInfo) *podInfo { return pi }).Draw(t, "first")
		first = slices.DeleteFunc(first, func(pi *podInfo) bool { return pi == nil })
		seen := make(map[*podInfo]uint64, n)
		for _, s := range l {
			seen[s.v] = s.seen
		}
		l.reorder(first)
		if len(l) != n {
			t.Fatalf("%d entries after reorder, want %d", len(l), n)
		}
		for i, s := range l {
			if int(s.v.idx) != i || l.at(s.v) != &l[i] || seen[s.v] != s.seen {
				t.Fatalf("entry %d: %s at %d, stamp %d, want %d", i, s.v.name(), s.v.idx, s.seen, seen[s.v])
			}
			if i < len(first) && s.v != first[i] {
				t.Fatalf("entry %d is %s, want %s", i, s.v.name(), first[i].name())
			}
		}
		rest := slices.DeleteFunc(slices.Clone(all), func(pi *podInfo) bool { return slices.Contains(first, pi) })
		for i, pi := range rest {
			if l[len(first)+i].v != pi {
				t.Fatalf("entry %d is %s, want %s (the others keep their order)", len(first)+i, l[len(first)+i].v.name(), pi.name())
			}
		}
	})
}
