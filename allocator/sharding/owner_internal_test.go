package sharding

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
)

func pools(n int) []types.NamespacedName {
	out := make([]types.NamespacedName, n)
	for i := range out {
		out[i] = types.NamespacedName{Namespace: fmt.Sprintf("ns-%d", i%7), Name: fmt.Sprintf("pool-%d", i)}
	}
	return out
}

// A member that joins takes pools only for itself, and so one that leaves
// (the same change backwards) gives up only its own; every pool has an
// owner among the members.
func TestOwnerMovesOnlyWhatItMust(t *testing.T) {
	ps := pools(300)
	rapid.Check(t, func(t *rapid.T) {
		ids := rapid.SliceOfNDistinct(rapid.StringMatching(`[a-z][a-z0-9-]{0,8}`), 1, 12, rapid.ID).Draw(t, "members")
		joiner := rapid.StringMatching(`[a-z][a-z0-9-]{0,8}`).Filter(func(s string) bool {
			for _, id := range ids {
				if id == s {
					return false
				}
			}
			return true
		}).Draw(t, "joiner")
		with := append(append([]string{}, ids...), joiner)
		for _, p := range ps {
			before, after := owner(ids, p), owner(with, p)
			if before == "" {
				t.Fatalf("pool %s has no owner among %v", p, ids)
			}
			if before != after && after != joiner {
				t.Fatalf("pool %s moved from %s to %s, not to the joiner %s", p, before, after, joiner)
			}
		}
	})
}

// Pools spread about evenly: at 10,000 pools over N members each holds
// within 20% of 1/N.
func TestOwnerSpreadsPools(t *testing.T) {
	ps := pools(10000)
	for _, n := range []int{2, 4, 8, 16} {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("replica-%d", i)
		}
		count := map[string]int{}
		for _, p := range ps {
			count[owner(ids, p)]++
		}
		fair := float64(len(ps)) / float64(n)
		for _, id := range ids {
			if c := float64(count[id]); c < 0.8*fair || c > 1.2*fair {
				t.Errorf("%d members: %s owns %v pools, fair is %v", n, id, c, fair)
			}
		}
	}
}

// By namespace, the members' ranges cover the hash space once: every hash
// falls in the ranges of exactly its owner; a member that joins takes
// namespaces only for itself.
func TestRingRangesPartitionTheHashSpace(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ids := rapid.SliceOfNDistinct(rapid.StringMatching(`[a-z][a-z0-9]{0,6}`), 1, 8, rapid.ID).Draw(t, "members")
		spans := map[string][]span{}
		for _, id := range ids {
			spans[id] = ranges(ids, id)
		}
		in := func(h uint64, s span) bool { return h >= s.start && (s.end == 0 || h < s.end) }
		joiner := "zz-joiner"
		with := append(append([]string{}, ids...), joiner)
		for range 200 {
			h := rapid.Uint64().Draw(t, "hash")
			own := ringOwner(ids, h)
			holders := 0
			for id, ss := range spans {
				for _, s := range ss {
					if in(h, s) {
						holders++
						if id != own {
							t.Fatalf("hash %x is in a range of %s, owner %s", h, id, own)
						}
					}
				}
			}
			if holders != 1 {
				t.Fatalf("hash %x is in %d ranges", h, holders)
			}
			if after := ringOwner(with, h); after != own && after != joiner {
				t.Fatalf("hash %x moved from %s to %s, not to the joiner", h, own, after)
			}
		}
	})
}
