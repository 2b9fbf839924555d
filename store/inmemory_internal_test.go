package store

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
)

// TestDeletePoolBetweenLookupAndLock runs DeletePool after Allocate or Free
// looked the pool's index up and before it locked it: Allocate must land
// in the pool's new index, and Free must find the pool empty.
func TestDeletePoolBetweenLookupAndLock(t *testing.T) {
	pool := types.NamespacedName{Namespace: "ns", Name: "pool"}
	h := Holder{UID: "uid-a", Claim: types.NamespacedName{Namespace: "ns", Name: "a"}}
	s := NewInMemory()
	require.NoError(t, s.Allocate(pool, h, []string{"old"}))

	deleteOnce := func() {
		testHookLookedUp = nil
		require.NoError(t, s.DeletePool(pool))
	}
	t.Cleanup(func() { testHookLookedUp = nil })

	testHookLookedUp = deleteOnce
	require.NoError(t, s.Allocate(pool, h, []string{"new"}))
	snap, err := s.Snapshot(pool)
	require.NoError(t, err)
	require.Equal(t, map[string]Holder{"new": h}, snap, "the allocation must survive in the recreated pool")
	pools, err := s.Pools()
	require.NoError(t, err)
	require.Equal(t, []types.NamespacedName{pool}, pools)

	testHookLookedUp = deleteOnce
	require.ErrorIs(t, s.Free(pool, h.UID, []string{"new"}), ErrNotHeld)
	snap, err = s.Snapshot(pool)
	require.NoError(t, err)
	require.Empty(t, snap)
}

// TestReadDeadIndex reads an index that DeletePool removed after a reader
// looked it up: it reads as empty.
func TestReadDeadIndex(t *testing.T) {
	pool := types.NamespacedName{Namespace: "ns", Name: "pool"}
	h := Holder{UID: "uid-a", Claim: types.NamespacedName{Namespace: "ns", Name: "a"}}
	s := NewInMemory()
	require.NoError(t, s.Allocate(pool, h, []string{"x"}))
	p := s.lookup(pool)
	require.NoError(t, s.DeletePool(pool))
	require.True(t, p.dead)
	require.Empty(t, p.pods)
	require.Zero(t, p.claims.Len())
	// A new Allocate does not reuse the dead index.
	require.NoError(t, s.Allocate(pool, h, []string{"x"}))
	require.NotSame(t, p, s.lookup(pool))
}

// check reports the first way p's two maps disagree, or nil. The caller
// holds p.mu.
func (p *poolIndex) check() error {
	if p.dead {
		if p.pods != nil || p.claims.Len() != 0 {
			return fmt.Errorf("dead index keeps %d pods, %d claims", len(p.pods), p.claims.Len())
		}
		return nil
	}
	for pod, c := range p.pods {
		if c == nil || !slices.Contains(c.pods, pod) {
			return fmt.Errorf("pod %s: its claim does not list it", pod)
		}
		if p.claims.Get(string(c.uid)) != c {
			return fmt.Errorf("pod %s: its claim %s is not the pool's claim with that UID", pod, c.holder())
		}
	}
	n := 0
	for c := range p.claims.All() {
		if p.claims.Get(string(c.uid)) != c {
			return fmt.Errorf("claim %s is not found under its UID", c.holder())
		}
		if len(c.pods) == 0 {
			return fmt.Errorf("claim %s holds nothing but is listed", c.holder())
		}
		for _, pod := range c.pods {
			if p.pods[pod] != c || countOf(c.pods, pod) != 1 {
				return fmt.Errorf("claim %s lists pod %s, which is not recorded as its own or is listed twice", c.holder(), pod)
			}
		}
		n += len(c.pods)
	}
	if n != len(p.pods) {
		return fmt.Errorf("claims list %d pods, the pool holds %d", n, len(p.pods))
	}
	return nil
}

// TestInMemoryIndexConsistent checks after every random step that each
// pool's two maps agree.
func TestInMemoryIndexConsistent(t *testing.T) {
	checkAfterRandomCalls(t, func(*rapid.T) (AllocationStore, func() error) {
		s := NewInMemory()
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

// TestInMemoryShrinksClaim frees most of a large claim's pods: its slice
// of names shrinks instead of keeping its peak capacity.
func TestInMemoryShrinksClaim(t *testing.T) {
	pool := types.NamespacedName{Namespace: "ns", Name: "pool"}
	h := Holder{UID: "uid-a", Claim: types.NamespacedName{Namespace: "ns", Name: "a"}}
	s := NewInMemory()
	pods := make([]string, 1000)
	for i := range pods {
		pods[i] = fmt.Sprintf("pod-%04d", i)
	}
	require.NoError(t, s.Allocate(pool, h, pods))
	require.NoError(t, s.Free(pool, h.UID, pods[10:]))
	p := s.lookup(pool)
	require.NoError(t, p.check())
	c := p.claims.Get(string(h.UID))
	require.Len(t, c.pods, 10)
	require.LessOrEqual(t, cap(c.pods), 64)
	held, err := s.Held(pool, h.UID)
	require.NoError(t, err)
	require.Equal(t, pods[:10], held)
}

func countOf(pods []string, pod string) int {
	n := 0
	for _, p := range pods {
		if p == pod {
			n++
		}
	}
	return n
}
