package store

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
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
	require.Empty(t, p.claims)
	// A new Allocate does not reuse the dead index.
	require.NoError(t, s.Allocate(pool, h, []string{"x"}))
	require.NotSame(t, p, s.lookup(pool))
}
