package store

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
)

// check reports the first way p's rows and tally disagree, or nil. The
// caller holds p.mu.
func (p *sortedPool) check() error {
	counted := map[types.UID]tallied{}
	for i, r := range p.rows {
		if r.pod == "" || r.holder.UID == "" {
			return fmt.Errorf("row %d: empty name or UID: %+v", i, r)
		}
		if i > 0 && p.rows[i-1].pod >= r.pod {
			return fmt.Errorf("rows %d and %d out of order: %s, %s", i-1, i, p.rows[i-1].pod, r.pod)
		}
		t := counted[r.holder.UID]
		if t.pods > 0 && t.holder != r.holder {
			return fmt.Errorf("UID %s held pods as %s and as %s", r.holder.UID, t.holder, r.holder)
		}
		counted[r.holder.UID] = tallied{holder: r.holder, pods: t.pods + 1}
	}
	if len(counted) != len(p.tally) {
		return fmt.Errorf("rows name %d claims, the tally %d", len(counted), len(p.tally))
	}
	for uid, want := range counted {
		if got := p.tally[uid]; got != want {
			return fmt.Errorf("claim %s: tally %+v, rows %+v", uid, got, want)
		}
	}
	return nil
}

// TestSortedIndexConsistent checks after every random step that each
// pool's rows are sorted and agree with its tally.
func TestSortedIndexConsistent(t *testing.T) {
	checkAfterRandomCalls(t, func(*rapid.T) (AllocationStore, func() error) {
		s := NewSorted()
		return s, func() error {
			for name, p := range s.pools {
				p.mu.RLock()
				err := p.check()
				p.mu.RUnlock()
				if err != nil {
					return fmt.Errorf("pool %s: %w", name, err)
				}
			}
			return nil
		}
	})
}

// TestSortedShrinks frees most of a large pool: its rows shrink instead
// of keeping their peak capacity.
func TestSortedShrinks(t *testing.T) {
	pool := types.NamespacedName{Namespace: "ns", Name: "pool"}
	h := Holder{UID: "uid-a", Claim: types.NamespacedName{Namespace: "ns", Name: "a"}}
	s := NewSorted()
	pods := make([]string, 1000)
	for i := range pods {
		pods[i] = fmt.Sprintf("pod-%04d", i)
	}
	if err := s.Allocate(pool, h, pods); err != nil {
		t.Fatal(err)
	}
	if err := s.Free(pool, h.UID, pods[10:]); err != nil {
		t.Fatal(err)
	}
	p := s.pools[pool]
	if err := p.check(); err != nil {
		t.Fatal(err)
	}
	if len(p.rows) != 10 || cap(p.rows) > 64 {
		t.Fatalf("rows: len %d, cap %d; want 10, at most 64", len(p.rows), cap(p.rows))
	}
}
