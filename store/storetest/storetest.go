package storetest

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"

	"github.com/poolalloc/poolalloc/store"
)

// Fixtures shared by the subtests. poolA and poolB have the same name in
// two namespaces; claimX and claimXAgain have the same name and different
// UIDs, as a claim deleted and created again.
var (
	poolA = types.NamespacedName{Namespace: "team-a", Name: "pool"}
	poolB = types.NamespacedName{Namespace: "team-b", Name: "pool"}

	claimX      = store.Holder{UID: "uid-x", Claim: types.NamespacedName{Namespace: "team-a", Name: "claim-x"}}
	claimY      = store.Holder{UID: "uid-y", Claim: types.NamespacedName{Namespace: "team-a", Name: "claim-y"}}
	claimXAgain = store.Holder{UID: "uid-x2", Claim: claimX.Claim}
)

// Run runs the conformance suite against the AllocationStore that
// newStore returns. newStore is called once per subtest and must return an
// empty store each time.
func Run(t *testing.T, newStore func() store.AllocationStore) {
	t.Helper()
	fresh := func(t *testing.T) store.AllocationStore {
		t.Helper()
		s := newStore()
		if s == nil {
			t.Fatal("newStore returned nil")
		}
		return guard(t, s)
	}
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, store.AllocationStore)
	}{
		{"Empty", testEmpty},
		{"Allocate", testAllocate},
		{"AllocateHeldIsAllOrNothing", testAllocateHeld},
		{"AllocateInvalidArgument", testAllocateInvalid},
		{"Free", testFree},
		{"FreeNotHeldIsAllOrNothing", testFreeNotHeld},
		{"FreeInvalidArgument", testFreeInvalid},
		{"Sorted", testSorted},
		{"DeletePool", testDeletePool},
		{"PoolsIsolated", testPoolsIsolated},
		{"ClaimsByUID", testClaimsByUID},
		{"InputsNotModifiedOrRetained", testInputs},
		{"OutputsOwnedByCaller", testOutputs},
		{"ConcurrentAllocate", testConcurrentAllocate},
		{"ConcurrentPools", testConcurrentPools},
		{"AllocateAll", testAllocateAll},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, fresh(t)) })
	}
	t.Run("Model", func(t *testing.T) { testModel(t, newStore) })
}

// guarded wraps the store under test so that every Writer call, in every
// subtest, is checked for what it does to its pods argument: the store is
// handed a copy, which must be unchanged when the call returns, and which
// guarded then overwrites, so that a store that kept the slice shows the
// overwritten names in later reads.
type guarded struct {
	store.AllocationStore
	t errorer
}

// errorer is what guarded reports to: a *testing.T or a *rapid.T. Errorf
// may be called from any goroutine.
type errorer interface {
	Errorf(format string, args ...any)
}

func guard(t errorer, s store.AllocationStore) store.AllocationStore {
	g := guarded{AllocationStore: s, t: t}
	if _, ok := s.(store.BulkWriter); ok {
		return guardedBulk{g}
	}
	return g
}

// guardedBulk is guarded for a store that is a store.BulkWriter too.
type guardedBulk struct{ guarded }

func (g guardedBulk) AllocateAll(pool types.NamespacedName, allocs []store.Allocation) (int, error) {
	arg := make([]store.Allocation, len(allocs))
	for i, a := range allocs {
		arg[i] = store.Allocation{Holder: a.Holder, Pods: slices.Clone(a.Pods)}
	}
	k, err := g.AllocationStore.(store.BulkWriter).AllocateAll(pool, arg)
	for i := range arg {
		if arg[i].Holder != allocs[i].Holder {
			g.t.Errorf("AllocateAll(%s, …) modified the holder of allocation %d", pool, i)
		}
		g.check("AllocateAll", pool, allocs[i].Pods, arg[i].Pods)
	}
	return k, err
}

// retainedName replaces each pod name in a guarded call's argument after
// the call returned.
const retainedName = "storetest-overwrote-this-name-after-the-call-returned"

func (g guarded) Allocate(pool types.NamespacedName, h store.Holder, pods []string) error {
	arg := slices.Clone(pods)
	err := g.AllocationStore.Allocate(pool, h, arg)
	g.check("Allocate", pool, pods, arg)
	return err
}

func (g guarded) Free(pool types.NamespacedName, uid types.UID, pods []string) error {
	arg := slices.Clone(pods)
	err := g.AllocationStore.Free(pool, uid, arg)
	g.check("Free", pool, pods, arg)
	return err
}

func (g guarded) check(call string, pool types.NamespacedName, want, got []string) {
	if !slices.Equal(want, got) {
		g.t.Errorf("%s(%s, …, %q) modified its pods argument to %q", call, pool, want, got)
	}
	for i := range got {
		got[i] = retainedName
	}
}

// checkPool requires that pool's state in s is exactly want (pod →
// holder), through every read method. absent lists pods to check are held
// by no claim; pods in want are never absent.
func checkPool(t require.TestingT, s store.AllocationStore, pool types.NamespacedName, want map[string]store.Holder, absent ...string) {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	snap, err := s.Snapshot(pool)
	require.NoError(t, err, "Snapshot(%s)", pool)
	if len(want) == 0 {
		require.Empty(t, snap, "Snapshot(%s)", pool)
	} else {
		require.Equal(t, want, snap, "Snapshot(%s)", pool)
	}

	for _, pod := range slices.Sorted(maps.Keys(want)) {
		h, ok, err := s.HolderOf(pool, pod)
		require.NoError(t, err, "HolderOf(%s, %s)", pool, pod)
		require.True(t, ok, "HolderOf(%s, %s): want held", pool, pod)
		require.Equal(t, want[pod], h, "HolderOf(%s, %s)", pool, pod)
	}
	for _, pod := range slices.Concat(absent, []string{retainedName}) {
		if _, held := want[pod]; held {
			continue
		}
		h, ok, err := s.HolderOf(pool, pod)
		require.NoError(t, err, "HolderOf(%s, %s)", pool, pod)
		require.False(t, ok, "HolderOf(%s, %s): want held by no claim, got %s", pool, pod, h)
	}

	byUID := map[types.UID][]string{}
	holderSet := map[store.Holder]struct{}{}
	for pod, h := range want {
		byUID[h.UID] = append(byUID[h.UID], pod)
		holderSet[h] = struct{}{}
	}
	for uid, pods := range byUID {
		slices.Sort(pods)
		got, err := s.Held(pool, uid)
		require.NoError(t, err, "Held(%s, %s)", pool, uid)
		require.Equal(t, pods, got, "Held(%s, %s)", pool, uid)
		requireCount(t, s, pool, uid, len(pods))
	}
	// A UID that holds nothing anywhere counts none.
	requireCount(t, s, pool, "uid-never-used", 0)

	holders, err := s.Holders(pool)
	require.NoError(t, err, "Holders(%s)", pool)
	wantHolders := slices.SortedFunc(maps.Keys(holderSet), compareHolders)
	if len(wantHolders) == 0 {
		require.Empty(t, holders, "Holders(%s)", pool)
	} else {
		require.Equal(t, wantHolders, holders, "Holders(%s)", pool)
	}
}

// requireCount requires that Count(pool, uid) is want.
func requireCount(t require.TestingT, s store.Reader, pool types.NamespacedName, uid types.UID, want int) {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	n, err := s.Count(pool, uid)
	require.NoError(t, err, "Count(%s, %s)", pool, uid)
	require.Equal(t, want, n, "Count(%s, %s)", pool, uid)
}

// checkPools requires that Pools returns exactly want.
func checkPools(t require.TestingT, s store.AllocationStore, want ...types.NamespacedName) {
	got, err := s.Pools()
	require.NoError(t, err, "Pools")
	if len(want) == 0 {
		require.Empty(t, got, "Pools")
		return
	}
	require.Equal(t, want, got, "Pools")
}

func compareHolders(a, b store.Holder) int {
	if c := comparePools(a.Claim, b.Claim); c != 0 {
		return c
	}
	return strings.Compare(string(a.UID), string(b.UID))
}

func comparePools(a, b types.NamespacedName) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// hold builds a want map: every pod held by h.
func hold(h store.Holder, pods ...string) map[string]store.Holder {
	m := make(map[string]store.Holder, len(pods))
	for _, p := range pods {
		m[p] = h
	}
	return m
}

// union merges want maps.
func union(ms ...map[string]store.Holder) map[string]store.Holder {
	out := map[string]store.Holder{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

func testEmpty(t *testing.T, s store.AllocationStore) {
	checkPool(t, s, poolA, nil, "a", "b")
	held, err := s.Held(poolA, claimX.UID)
	require.NoError(t, err)
	require.Empty(t, held)
	requireCount(t, s, poolA, claimX.UID, 0)
	requireCount(t, s, poolA, "", 0)
	checkPools(t, s)
	require.NoError(t, s.DeletePool(poolA), "DeletePool of an unknown pool")
	checkPools(t, s)
}

func testAllocate(t *testing.T, s store.AllocationStore) {
	require.NoError(t, s.Allocate(poolA, claimX, []string{"c", "a"}))
	checkPool(t, s, poolA, hold(claimX, "a", "c"), "b", "d")
	checkPools(t, s, poolA)

	// A claim can gain pods in several calls.
	require.NoError(t, s.Allocate(poolA, claimX, []string{"b"}))
	require.NoError(t, s.Allocate(poolA, claimY, []string{"e", "d"}))
	checkPool(t, s, poolA, union(hold(claimX, "a", "b", "c"), hold(claimY, "d", "e")), "f")
	checkPools(t, s, poolA)
}

func testAllocateHeld(t *testing.T, s store.AllocationStore) {
	require.NoError(t, s.Allocate(poolA, claimX, []string{"b"}))
	want := hold(claimX, "b")

	// Another claim asks for a held pod among free ones.
	err := s.Allocate(poolA, claimY, []string{"a", "b", "c"})
	requireHeldError(t, err, poolA, "b", claimX)
	checkPool(t, s, poolA, want, "a", "c")

	// The holder itself asks again: still held, still nothing changes.
	err = s.Allocate(poolA, claimX, []string{"a", "b"})
	requireHeldError(t, err, poolA, "b", claimX)
	checkPool(t, s, poolA, want, "a", "c")

	// Several held pods: the error names one of them, with its holder.
	require.NoError(t, s.Allocate(poolA, claimY, []string{"d"}))
	want["d"] = claimY
	err = s.Allocate(poolA, claimXAgain, []string{"e", "d", "b"})
	var he *store.HeldError
	require.ErrorAs(t, err, &he)
	require.Contains(t, []string{"b", "d"}, he.Pod)
	require.Equal(t, want[he.Pod], he.Holder)
	checkPool(t, s, poolA, want, "a", "c", "e")
	checkPools(t, s, poolA)
}

// requireHeldError requires err to match ErrPodHeld and to be a
// *HeldError naming pool, pod and holder.
func requireHeldError(t require.TestingT, err error, pool types.NamespacedName, pod string, holder store.Holder) {
	require.ErrorIs(t, err, store.ErrPodHeld)
	var he *store.HeldError
	require.ErrorAs(t, err, &he)
	require.Equal(t, pool, he.Pool, "HeldError.Pool")
	require.Equal(t, pod, he.Pod, "HeldError.Pod")
	require.Equal(t, holder, he.Holder, "HeldError.Holder")
}

func testAllocateInvalid(t *testing.T, s store.AllocationStore) {
	require.NoError(t, s.Allocate(poolA, claimX, []string{"held"}))
	want := hold(claimX, "held")
	noUID := store.Holder{Claim: claimY.Claim}
	for _, tc := range []struct {
		name string
		h    store.Holder
		pods []string
	}{
		{"empty UID", noUID, []string{"a"}},
		{"empty pod name", claimY, []string{"a", "", "b"}},
		{"pod listed twice", claimY, []string{"a", "b", "a"}},
		{"pod listed twice, adjacent", claimY, []string{"a", "a"}},
	} {
		err := s.Allocate(poolA, tc.h, tc.pods)
		require.ErrorIs(t, err, store.ErrInvalidArgument, tc.name)
		checkPool(t, s, poolA, want, "a", "b")
		// The same in a pool the store has never seen: it stays unknown.
		err = s.Allocate(poolB, tc.h, tc.pods)
		require.ErrorIs(t, err, store.ErrInvalidArgument, tc.name)
		checkPool(t, s, poolB, nil, "a", "b")
		checkPools(t, s, poolA)
	}
}

// testAllocateAll checks store.BulkWriter, for a store that has it:
// allocations made in order, up to the first that fails.
func testAllocateAll(t *testing.T, s store.AllocationStore) {
	b, ok := s.(store.BulkWriter)
	if !ok {
		t.Skip("not a store.BulkWriter")
	}
	claimZ := store.Holder{UID: "uid-z", Claim: types.NamespacedName{Namespace: poolA.Namespace, Name: "claim-z"}}
	k, err := b.AllocateAll(poolA, []store.Allocation{
		{Holder: claimX, Pods: []string{"c", "a"}},
		{Holder: claimY, Pods: nil},
		{Holder: claimY, Pods: []string{"d"}},
		{Holder: claimX, Pods: []string{"b"}},
	})
	require.NoError(t, err)
	require.Equal(t, 4, k)
	want := union(hold(claimX, "a", "b", "c"), hold(claimY, "d"))
	checkPool(t, s, poolA, want, "e", "f")
	checkPools(t, s, poolA)

	// The third asks for a pod the first took: the first two are made, the
	// third changes nothing, the fourth is not made.
	k, err = b.AllocateAll(poolA, []store.Allocation{
		{Holder: claimZ, Pods: []string{"e"}},
		{Holder: claimY, Pods: []string{"g"}},
		{Holder: claimXAgain, Pods: []string{"h", "e"}},
		{Holder: claimZ, Pods: []string{"f"}},
	})
	require.Equal(t, 2, k)
	requireHeldError(t, err, poolA, "e", claimZ)
	want = union(want, hold(claimZ, "e"), hold(claimY, "g"))
	checkPool(t, s, poolA, want, "f", "h")

	// An invalid argument stops it as well; one in a pool the store has
	// never seen leaves the pool unknown.
	k, err = b.AllocateAll(poolA, []store.Allocation{
		{Holder: claimZ, Pods: []string{"f"}},
		{Holder: claimY, Pods: []string{"i", "", "j"}},
	})
	require.Equal(t, 1, k)
	require.ErrorIs(t, err, store.ErrInvalidArgument)
	want = union(want, hold(claimZ, "f"))
	checkPool(t, s, poolA, want, "i", "j")
	k, err = b.AllocateAll(poolB, []store.Allocation{{Holder: store.Holder{Claim: claimY.Claim}, Pods: []string{"a"}}})
	require.Equal(t, 0, k)
	require.ErrorIs(t, err, store.ErrInvalidArgument)
	checkPool(t, s, poolB, nil, "a")
	checkPools(t, s, poolA)

	// Nothing to make.
	k, err = b.AllocateAll(poolB, nil)
	require.NoError(t, err)
	require.Equal(t, 0, k)
	checkPools(t, s, poolA)
}

func testFree(t *testing.T, s store.AllocationStore) {
	require.NoError(t, s.Allocate(poolA, claimX, []string{"a", "b", "c"}))
	require.NoError(t, s.Allocate(poolA, claimY, []string{"d"}))

	require.NoError(t, s.Free(poolA, claimX.UID, []string{"c", "a"}))
	checkPool(t, s, poolA, union(hold(claimX, "b"), hold(claimY, "d")), "a", "c")

	require.NoError(t, s.Free(poolA, claimX.UID, []string{"b"}))
	checkPool(t, s, poolA, hold(claimY, "d"), "a", "b", "c")
	held, err := s.Held(poolA, claimX.UID)
	require.NoError(t, err)
	require.Empty(t, held, "Held of a claim that freed all its pods")
	requireCount(t, s, poolA, claimX.UID, 0)
	checkPools(t, s, poolA)

	// A freed pod can be allocated again, to anyone.
	require.NoError(t, s.Allocate(poolA, claimY, []string{"a"}))
	require.NoError(t, s.Free(poolA, claimY.UID, []string{"a", "d"}))
	checkPool(t, s, poolA, nil, "a", "b", "c", "d")
	checkPools(t, s)
}

func testFreeNotHeld(t *testing.T, s store.AllocationStore) {
	require.NoError(t, s.Allocate(poolA, claimX, []string{"a", "b"}))
	require.NoError(t, s.Allocate(poolA, claimY, []string{"c"}))
	want := union(hold(claimX, "a", "b"), hold(claimY, "c"))

	for _, tc := range []struct {
		name string
		pool types.NamespacedName
		uid  types.UID
		pods []string
	}{
		{"pod held by another claim", poolA, claimX.UID, []string{"a", "c", "b"}},
		{"pod held by no claim", poolA, claimX.UID, []string{"a", "free"}},
		{"claim holding nothing", poolA, "uid-unknown", []string{"a"}},
		{"unknown pool", poolB, claimX.UID, []string{"a"}},
	} {
		err := s.Free(tc.pool, tc.uid, tc.pods)
		require.ErrorIs(t, err, store.ErrNotHeld, tc.name)
		checkPool(t, s, poolA, want, "free")
		checkPool(t, s, poolB, nil, "a")
		checkPools(t, s, poolA)
	}
}

func testFreeInvalid(t *testing.T, s store.AllocationStore) {
	require.NoError(t, s.Allocate(poolA, claimX, []string{"a", "b"}))
	want := hold(claimX, "a", "b")
	for _, tc := range []struct {
		name string
		uid  types.UID
		pods []string
	}{
		{"empty UID", "", []string{"a"}},
		{"empty pod name", claimX.UID, []string{"a", ""}},
		{"pod listed twice", claimX.UID, []string{"a", "b", "a"}},
	} {
		err := s.Free(poolA, tc.uid, tc.pods)
		require.ErrorIs(t, err, store.ErrInvalidArgument, tc.name)
		checkPool(t, s, poolA, want)
	}
}

func testSorted(t *testing.T, s store.AllocationStore) {
	// Holders differ in namespace, then name, then UID only.
	hs := []store.Holder{
		{UID: "u-3", Claim: types.NamespacedName{Namespace: "b", Name: "a"}},
		{UID: "u-2", Claim: types.NamespacedName{Namespace: "a", Name: "z"}},
		{UID: "u-9", Claim: types.NamespacedName{Namespace: "a", Name: "b"}},
		{UID: "u-1", Claim: types.NamespacedName{Namespace: "a", Name: "b"}},
	}
	for i, h := range hs {
		require.NoError(t, s.Allocate(poolA, h, []string{fmt.Sprintf("pod-%d-z", i), fmt.Sprintf("pod-%d-a", i)}))
	}
	got, err := s.Holders(poolA)
	require.NoError(t, err)
	require.Equal(t, []store.Holder{hs[3], hs[2], hs[1], hs[0]}, got, "Holders order")

	require.NoError(t, s.Allocate(poolA, claimX, []string{"m", "c", "x", "a"}))
	held, err := s.Held(poolA, claimX.UID)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "c", "m", "x"}, held, "Held order")

	pools := []types.NamespacedName{
		{Namespace: "b", Name: "a"},
		{Namespace: "a", Name: "b"},
		{Namespace: "", Name: "z"},
		{Namespace: "a", Name: "a"},
	}
	for _, p := range pools {
		require.NoError(t, s.Allocate(p, claimY, []string{"a"}))
	}
	checkPools(t, s, pools[2], pools[3], pools[1], pools[0], poolA)
}

func testDeletePool(t *testing.T, s store.AllocationStore) {
	require.NoError(t, s.Allocate(poolA, claimX, []string{"a", "b"}))
	require.NoError(t, s.Allocate(poolB, claimX, []string{"a", "b"}))

	require.NoError(t, s.DeletePool(poolA))
	checkPool(t, s, poolA, nil, "a", "b")
	requireCount(t, s, poolA, claimX.UID, 0)
	checkPool(t, s, poolB, hold(claimX, "a", "b"))
	checkPools(t, s, poolB)
	require.ErrorIs(t, s.Free(poolA, claimX.UID, []string{"a"}), store.ErrNotHeld)

	// Recreated, the pool starts empty: its old pods are free for anyone.
	require.NoError(t, s.Allocate(poolA, claimY, []string{"b", "c"}))
	checkPool(t, s, poolA, hold(claimY, "b", "c"), "a")
	checkPools(t, s, poolA, poolB)

	require.NoError(t, s.DeletePool(poolA))
	require.NoError(t, s.DeletePool(poolA), "DeletePool twice")
	checkPools(t, s, poolB)
}

func testPoolsIsolated(t *testing.T, s store.AllocationStore) {
	// The same pod names, in two pools of the same name.
	require.NoError(t, s.Allocate(poolA, claimX, []string{"a", "b"}))
	require.NoError(t, s.Allocate(poolB, claimY, []string{"a"}))
	require.NoError(t, s.Allocate(poolB, claimX, []string{"c"}))
	checkPool(t, s, poolA, hold(claimX, "a", "b"), "c")
	checkPool(t, s, poolB, union(hold(claimY, "a"), hold(claimX, "c")), "b")

	// A conflict is judged in the pool of the call only.
	requireHeldError(t, s.Allocate(poolB, claimX, []string{"b", "a"}), poolB, "a", claimY)
	require.NoError(t, s.Allocate(poolB, claimX, []string{"b"}))

	// Freeing in one pool leaves the other alone.
	require.ErrorIs(t, s.Free(poolB, claimY.UID, []string{"b"}), store.ErrNotHeld)
	require.NoError(t, s.Free(poolA, claimX.UID, []string{"a", "b"}))
	checkPool(t, s, poolA, nil, "a", "b", "c")
	checkPool(t, s, poolB, union(hold(claimY, "a"), hold(claimX, "b", "c")))
	checkPools(t, s, poolB)
}

func testClaimsByUID(t *testing.T, s store.AllocationStore) {
	require.NoError(t, s.Allocate(poolA, claimX, []string{"a", "b"}))

	// A new claim with the old one's name holds nothing and frees nothing.
	held, err := s.Held(poolA, claimXAgain.UID)
	require.NoError(t, err)
	require.Empty(t, held)
	requireCount(t, s, poolA, claimXAgain.UID, 0)
	require.ErrorIs(t, s.Free(poolA, claimXAgain.UID, []string{"a"}), store.ErrNotHeld)
	requireHeldError(t, s.Allocate(poolA, claimXAgain, []string{"c", "b"}), poolA, "b", claimX)

	// Both can hold pods at once and are listed apart.
	require.NoError(t, s.Allocate(poolA, claimXAgain, []string{"c"}))
	checkPool(t, s, poolA, union(hold(claimX, "a", "b"), hold(claimXAgain, "c")))

	require.NoError(t, s.Free(poolA, claimX.UID, []string{"a", "b"}))
	checkPool(t, s, poolA, hold(claimXAgain, "c"), "a", "b")
}

func testInputs(t *testing.T, s store.AllocationStore) {
	// Unsorted on purpose: sorting in place would show.
	in := []string{"c", "a", "b"}
	require.NoError(t, s.Allocate(poolA, claimX, in))
	require.Equal(t, []string{"c", "a", "b"}, in, "Allocate modified its pods argument")
	in[0], in[1], in[2] = "x", "y", "z"
	checkPool(t, s, poolA, hold(claimX, "a", "b", "c"), "x", "y", "z")

	in = []string{"c", "a"}
	require.NoError(t, s.Free(poolA, claimX.UID, in))
	require.Equal(t, []string{"c", "a"}, in, "Free modified its pods argument")
	in[0], in[1] = "b", "b"
	checkPool(t, s, poolA, hold(claimX, "b"), "a", "c")

	// Failed calls leave their argument alone too.
	in = []string{"d", "b"}
	require.ErrorIs(t, s.Allocate(poolA, claimY, in), store.ErrPodHeld)
	require.Equal(t, []string{"d", "b"}, in, "failed Allocate modified its pods argument")
	in = []string{"b", "d"}
	require.ErrorIs(t, s.Free(poolA, claimX.UID, in), store.ErrNotHeld)
	require.Equal(t, []string{"b", "d"}, in, "failed Free modified its pods argument")
	in = []string{"e", "d", "e"}
	require.ErrorIs(t, s.Allocate(poolA, claimY, in), store.ErrInvalidArgument)
	require.Equal(t, []string{"e", "d", "e"}, in, "failed Allocate modified its pods argument")

	// A slice with spare capacity: appending to it later must not show.
	in = make([]string, 1, 8)
	in[0] = "p"
	require.NoError(t, s.Allocate(poolB, claimY, in))
	_ = append(in, "q", "r")
	checkPool(t, s, poolB, hold(claimY, "p"), "q", "r")
	checkPool(t, s, poolA, hold(claimX, "b"), "a", "c", "d", "e")
}

func testOutputs(t *testing.T, s store.AllocationStore) {
	require.NoError(t, s.Allocate(poolA, claimX, []string{"a", "b"}))
	require.NoError(t, s.Allocate(poolA, claimY, []string{"c"}))
	want := union(hold(claimX, "a", "b"), hold(claimY, "c"))

	held, err := s.Held(poolA, claimX.UID)
	require.NoError(t, err)
	held[0] = "zzz"
	_ = append(held[:1], "yyy")

	holders, err := s.Holders(poolA)
	require.NoError(t, err)
	holders[0] = claimXAgain
	holders[1].UID = "changed"

	snap, err := s.Snapshot(poolA)
	require.NoError(t, err)
	snap["a"] = claimY
	delete(snap, "b")
	snap["new"] = claimX

	pools, err := s.Pools()
	require.NoError(t, err)
	pools[0] = poolB

	checkPool(t, s, poolA, want, "new", "zzz", "yyy")
	checkPools(t, s, poolA)

	// Results already returned do not change when the store does.
	held, err = s.Held(poolA, claimX.UID)
	require.NoError(t, err)
	snap, err = s.Snapshot(poolA)
	require.NoError(t, err)
	holders, err = s.Holders(poolA)
	require.NoError(t, err)
	require.NoError(t, s.Free(poolA, claimX.UID, []string{"a"}))
	require.NoError(t, s.Allocate(poolA, claimX, []string{"d"}))
	require.NoError(t, s.DeletePool(poolA))
	require.Equal(t, []string{"a", "b"}, held, "Held result changed after the store did")
	require.Equal(t, want, snap, "Snapshot result changed after the store did")
	require.Equal(t, []store.Holder{claimX, claimY}, holders, "Holders result changed after the store did")
}

// testConcurrentAllocate races many claims for overlapping pods of one
// pool. Every pod must end with exactly one holder, and exactly one
// Allocate call that listed it must have succeeded: the one of its holder.
func testConcurrentAllocate(t *testing.T, s store.AllocationStore) {
	const (
		workers = 16
		nPods   = 200
	)
	pods := make([]string, nPods)
	for i := range pods {
		pods[i] = fmt.Sprintf("pod-%03d", i)
	}
	type success struct {
		h    store.Holder
		pods []string
	}
	var (
		mu        sync.Mutex
		successes []success
		failures  []error
	)
	var wg sync.WaitGroup
	for w := range workers {
		h := store.Holder{
			UID:   types.UID(fmt.Sprintf("uid-%02d", w)),
			Claim: types.NamespacedName{Namespace: "team-a", Name: fmt.Sprintf("claim-%02d", w)},
		}
		rng := rand.New(rand.NewPCG(uint64(w), 1))
		wg.Go(func() {
			try := func(call []string) {
				err := s.Allocate(poolA, h, call)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					successes = append(successes, success{h, call})
					return
				}
				var he *store.HeldError
				if !errors.As(err, &he) || !errors.Is(err, store.ErrPodHeld) || he.Pool != poolA ||
					!slices.Contains(call, he.Pod) || he.Holder.UID == "" {
					failures = append(failures, fmt.Errorf("Allocate(%v) by %s: unexpected error %w", call, h, err))
				}
			}
			// Overlapping windows of several pods, then every pod alone,
			// each in its own order, so every pod is asked for until held.
			for range 40 {
				start, n := rng.IntN(nPods), 1+rng.IntN(8)
				call := make([]string, 0, n)
				for i := range n {
					call = append(call, pods[(start+i)%nPods])
				}
				try(call)
				// Readers run alongside the writers.
				if _, _, err := s.HolderOf(poolA, call[0]); err != nil {
					mu.Lock()
					failures = append(failures, fmt.Errorf("HolderOf: %w", err))
					mu.Unlock()
				}
			}
			for _, i := range rng.Perm(nPods) {
				try([]string{pods[i]})
			}
			held, err := s.Held(poolA, h.UID)
			if err != nil {
				mu.Lock()
				failures = append(failures, fmt.Errorf("Held(%s, %s): %w", poolA, h.UID, err))
				mu.Unlock()
			}
			// Only this goroutine allocates for h, and it is done.
			if n, err := s.Count(poolA, h.UID); err != nil || n != len(held) {
				mu.Lock()
				failures = append(failures, fmt.Errorf("Count(%s, %s) = %d, %v; Held has %d", poolA, h.UID, n, err, len(held)))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Empty(t, failures)

	want := map[string]store.Holder{}
	for _, sc := range successes {
		for _, pod := range sc.pods {
			if prev, ok := want[pod]; ok {
				t.Fatalf("pod %s: two Allocate calls succeeded for it, by %s and %s", pod, prev, sc.h)
			}
			want[pod] = sc.h
		}
	}
	require.Len(t, want, nPods, "every pod must end up held")
	checkPool(t, s, poolA, want)
}

// testConcurrentPools runs a claim on each of several pools at once,
// allocating and freeing, with readers alongside and with Allocate, Free
// and DeletePool racing on one more pool; every pool ends as its own
// goroutine left it, and the raced pool ends consistent.
func testConcurrentPools(t *testing.T, s store.AllocationStore) {
	const (
		nPools = 8
		rounds = 200
	)
	pools := make([]types.NamespacedName, nPools)
	for i := range pools {
		pools[i] = types.NamespacedName{Namespace: fmt.Sprintf("ns-%d", i%2), Name: fmt.Sprintf("pool-%d", i/2)}
	}
	churn := types.NamespacedName{Namespace: "ns-churn", Name: "pool"}
	errs := make(chan error, 4*nPools+8)
	var wg sync.WaitGroup
	for i, pool := range pools {
		h := store.Holder{UID: types.UID(fmt.Sprintf("uid-%d", i)), Claim: types.NamespacedName{Namespace: pool.Namespace, Name: "claim"}}
		wg.Go(func() {
			for r := range rounds {
				call := []string{fmt.Sprintf("p-%d", r%5), fmt.Sprintf("q-%d", r%5)}
				if err := s.Allocate(pool, h, call); err != nil {
					errs <- fmt.Errorf("Allocate(%s, %v): %w", pool, call, err)
					return
				}
				if r != rounds-1 {
					if err := s.Free(pool, h.UID, call); err != nil {
						errs <- fmt.Errorf("Free(%s, %v): %w", pool, call, err)
						return
					}
				}
			}
		})
		wg.Go(func() {
			for range rounds {
				if _, err := s.Snapshot(pool); err != nil {
					errs <- err
					return
				}
				if _, err := s.Holders(pool); err != nil {
					errs <- err
					return
				}
				if n, err := s.Count(pool, h.UID); err != nil || n > 2 {
					errs <- fmt.Errorf("Count(%s, %s) = %d, %v; want at most 2", pool, h.UID, n, err)
					return
				}
				if _, err := s.Pools(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Allocate, Free and DeletePool race on one more pool; whatever the
	// interleaving, its index must stay consistent.
	const churnRounds = 2000
	for w := range 4 {
		h := store.Holder{UID: types.UID(fmt.Sprintf("uid-churn-%d", w)), Claim: types.NamespacedName{Namespace: "ns-churn", Name: fmt.Sprintf("c-%d", w)}}
		wg.Go(func() {
			for r := range churnRounds {
				call := []string{fmt.Sprintf("p-%d", r%3)}
				err := s.Allocate(churn, h, call)
				if err != nil && !errors.Is(err, store.ErrPodHeld) {
					errs <- fmt.Errorf("Allocate(%s): %w", churn, err)
					return
				}
				err = s.Free(churn, h.UID, call)
				if err != nil && !errors.Is(err, store.ErrNotHeld) {
					errs <- fmt.Errorf("Free(%s): %w", churn, err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range churnRounds {
			if err := s.DeletePool(churn); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}

	for i, pool := range pools {
		h := store.Holder{UID: types.UID(fmt.Sprintf("uid-%d", i)), Claim: types.NamespacedName{Namespace: pool.Namespace, Name: "claim"}}
		checkPool(t, s, pool, hold(h, "p-4", "q-4"), "p-0", "q-0")
	}
	snap, err := s.Snapshot(churn)
	require.NoError(t, err)
	checkPool(t, s, churn, snap)
	require.NoError(t, s.DeletePool(churn))
	checkPools(t, s, slices.SortedFunc(slices.Values(pools), comparePools)...)
}

// model is the reference the store is compared with in testModel: a plain
// map pool → pod → holder, holding only pods that are held.
type model map[types.NamespacedName]map[string]store.Holder

func (m model) heldBy(pool types.NamespacedName, uid types.UID) []string {
	var out []string
	for pod, h := range m[pool] {
		if h.UID == uid {
			out = append(out, pod)
		}
	}
	slices.Sort(out)
	return out
}

func (m model) free(pool types.NamespacedName) []string {
	var out []string
	for _, pod := range modelPods {
		if _, held := m[pool][pod]; !held {
			out = append(out, pod)
		}
	}
	return out
}

// clone returns a copy of m.
func (m model) clone() model {
	out := model{}
	for p, pods := range m {
		out[p] = maps.Clone(pods)
	}
	return out
}

// conflicts returns the pods of pods that are held in pool.
func (m model) conflicts(pool types.NamespacedName, pods []string) []string {
	var out []string
	for _, pod := range pods {
		if _, held := m[pool][pod]; held {
			out = append(out, pod)
		}
	}
	return out
}

// hold records that h holds pods in pool.
func (m model) hold(pool types.NamespacedName, h store.Holder, pods []string) {
	if m[pool] == nil {
		m[pool] = map[string]store.Holder{}
	}
	for _, pod := range pods {
		m[pool][pod] = h
	}
}

// allocated checks err, what the store returned for an Allocate(pool, h,
// pods), against the model, and records what it made.
func (m model) allocated(t *rapid.T, pool types.NamespacedName, h store.Holder, pods []string, err error) {
	invalid := h.UID == "" || invalidPods(pods)
	conflicts := m.conflicts(pool, pods)
	var he *store.HeldError
	switch {
	case invalid && len(conflicts) > 0:
		// Both apply; the contract does not rank them.
		if !errors.Is(err, store.ErrInvalidArgument) {
			require.ErrorAs(t, err, &he, "Allocate(%s, %s, %q)", pool, h, pods)
		}
	case invalid:
		require.ErrorIs(t, err, store.ErrInvalidArgument, "Allocate(%s, %s, %q)", pool, h, pods)
	case len(conflicts) > 0:
		require.ErrorIs(t, err, store.ErrPodHeld, "Allocate(%s, %s, %q)", pool, h, pods)
		require.ErrorAs(t, err, &he, "Allocate(%s, %s, %q)", pool, h, pods)
	default:
		require.NoError(t, err, "Allocate(%s, %s, %q)", pool, h, pods)
		m.hold(pool, h, pods)
	}
	if he != nil {
		require.Equal(t, pool, he.Pool, "HeldError.Pool")
		require.Contains(t, conflicts, he.Pod, "HeldError.Pod")
		require.Equal(t, m[pool][he.Pod], he.Holder, "HeldError.Holder")
	}
}

// drawHolder draws a holder of modelHolders, now and then without a UID.
func drawHolder(t *rapid.T) store.Holder {
	h := rapid.SampledFrom(modelHolders).Draw(t, "holder")
	if rapid.IntRange(0, 19).Draw(t, "noUID") == 1 {
		h.UID = ""
	}
	return h
}

var (
	modelPools   = []types.NamespacedName{poolA, poolB}
	modelPods    = []string{"p0", "p1", "p2", "p3", "p4", "p5"}
	modelHolders = []store.Holder{claimX, claimY, claimXAgain,
		{UID: "uid-z", Claim: types.NamespacedName{Namespace: "team-b", Name: "claim-z"}}}
	// modelUIDs adds a UID that never holds anything and the empty UID.
	modelUIDs = []types.UID{claimX.UID, claimY.UID, claimXAgain.UID, "uid-z", "uid-none", ""}
)

// drawPods draws a pods argument: often from candidates (free pods for
// Allocate, held ones for Free), else any names; now and then with a
// repeat or an empty name.
func drawPods(t *rapid.T, candidates []string) []string {
	var pods []string
	if len(candidates) > 0 && rapid.Bool().Draw(t, "fromCandidates") {
		pods = rapid.SliceOfNDistinct(rapid.SampledFrom(candidates), 1, len(candidates), rapid.ID).Draw(t, "pods")
	} else {
		pods = rapid.SliceOfN(rapid.SampledFrom(modelPods), 1, 4).Draw(t, "pods")
	}
	switch rapid.IntRange(0, 9).Draw(t, "spoil") {
	case 1:
		at := rapid.IntRange(0, len(pods)).Draw(t, "emptyAt")
		pods = slices.Insert(pods, at, "")
	case 2:
		at := rapid.IntRange(0, len(pods)).Draw(t, "repeatAt")
		pods = slices.Insert(pods, at, pods[rapid.IntRange(0, len(pods)-1).Draw(t, "repeatOf")])
	}
	return pods
}

func invalidPods(pods []string) bool {
	if slices.Contains(pods, "") {
		return true
	}
	seen := map[string]bool{}
	for _, p := range pods {
		if seen[p] {
			return true
		}
		seen[p] = true
	}
	return false
}

// testModel compares the store with a model over random sequences of
// calls on two pools of the same name in two namespaces.
func testModel(t *testing.T, newStore func() store.AllocationStore) {
	rapid.Check(t, func(t *rapid.T) {
		s := newStore()
		if s == nil {
			t.Fatal("newStore returned nil")
		}
		s = guard(t, s)
		m := model{}
		pool := rapid.SampledFrom(modelPools)

		t.Repeat(map[string]func(*rapid.T){
			"Allocate": func(t *rapid.T) {
				p := pool.Draw(t, "pool")
				h := drawHolder(t)
				pods := drawPods(t, m.free(p))
				arg := slices.Clone(pods)
				err := s.Allocate(p, h, arg)
				require.Equal(t, pods, arg, "Allocate modified its pods argument")
				m.allocated(t, p, h, pods, err)
			},
			"AllocateAll": func(t *rapid.T) {
				b, ok := s.(store.BulkWriter)
				if !ok {
					t.Skip("not a store.BulkWriter")
				}
				p := pool.Draw(t, "pool")
				free := m.free(p)
				allocs := make([]store.Allocation, rapid.IntRange(0, 3).Draw(t, "allocs"))
				for i := range allocs {
					allocs[i] = store.Allocation{Holder: drawHolder(t), Pods: drawPods(t, free)}
				}
				// The first that Allocate would refuse at its turn.
				want := len(allocs)
				after := m.clone()
				for i, a := range allocs {
					if a.Holder.UID == "" || invalidPods(a.Pods) || len(after.conflicts(p, a.Pods)) > 0 {
						want = i
						break
					}
					after.hold(p, a.Holder, a.Pods)
				}
				k, err := b.AllocateAll(p, allocs)
				require.Equal(t, want, k, "AllocateAll(%s, %v) stopped at %d: %v", p, allocs, k, err)
				for _, a := range allocs[:k] {
					m.hold(p, a.Holder, a.Pods)
				}
				if k < len(allocs) {
					require.Error(t, err)
					m.allocated(t, p, allocs[k].Holder, allocs[k].Pods, err)
				} else {
					require.NoError(t, err)
				}
			},
			"Free": func(t *rapid.T) {
				p := pool.Draw(t, "pool")
				uid := rapid.SampledFrom(modelUIDs).Draw(t, "uid")
				pods := drawPods(t, m.heldBy(p, uid))
				arg := slices.Clone(pods)
				err := s.Free(p, uid, arg)
				require.Equal(t, pods, arg, "Free modified its pods argument")

				invalid := uid == "" || invalidPods(pods)
				notHeld := false
				for _, pod := range pods {
					if h, held := m[p][pod]; !held || h.UID != uid {
						notHeld = true
					}
				}
				switch {
				case invalid && notHeld:
					if !errors.Is(err, store.ErrInvalidArgument) {
						require.ErrorIs(t, err, store.ErrNotHeld, "Free(%s, %s, %q)", p, uid, pods)
					}
				case invalid:
					require.ErrorIs(t, err, store.ErrInvalidArgument, "Free(%s, %s, %q)", p, uid, pods)
				case notHeld:
					require.ErrorIs(t, err, store.ErrNotHeld, "Free(%s, %s, %q)", p, uid, pods)
				default:
					require.NoError(t, err, "Free(%s, %s, %q)", p, uid, pods)
					for _, pod := range pods {
						delete(m[p], pod)
					}
				}
			},
			"DeletePool": func(t *rapid.T) {
				p := pool.Draw(t, "pool")
				require.NoError(t, s.DeletePool(p))
				delete(m, p)
			},
			"HolderOf": func(t *rapid.T) {
				p := pool.Draw(t, "pool")
				pod := rapid.SampledFrom(modelPods).Draw(t, "pod")
				h, ok, err := s.HolderOf(p, pod)
				require.NoError(t, err)
				want, wantOK := m[p][pod]
				require.Equal(t, wantOK, ok, "HolderOf(%s, %s) ok", p, pod)
				require.Equal(t, want, h, "HolderOf(%s, %s)", p, pod)
			},
			"Held": func(t *rapid.T) {
				p := pool.Draw(t, "pool")
				uid := rapid.SampledFrom(modelUIDs).Draw(t, "uid")
				got, err := s.Held(p, uid)
				require.NoError(t, err)
				want := m.heldBy(p, uid)
				if len(want) == 0 {
					require.Empty(t, got, "Held(%s, %s)", p, uid)
				} else {
					require.Equal(t, want, got, "Held(%s, %s)", p, uid)
				}
				for i := range got { // the caller owns it
					got[i] = "scribbled"
				}
			},
			"Count": func(t *rapid.T) {
				p := pool.Draw(t, "pool")
				uid := rapid.SampledFrom(modelUIDs).Draw(t, "uid")
				n, err := s.Count(p, uid)
				require.NoError(t, err)
				require.Equal(t, len(m.heldBy(p, uid)), n, "Count(%s, %s)", p, uid)
			},
			"Snapshot": func(t *rapid.T) {
				p := pool.Draw(t, "pool")
				got, err := s.Snapshot(p)
				require.NoError(t, err)
				if len(m[p]) == 0 {
					require.Empty(t, got, "Snapshot(%s)", p)
				} else {
					require.Equal(t, m[p], got, "Snapshot(%s)", p)
					clear(got) // the caller owns it
				}
			},
			"": func(t *rapid.T) {
				var live []types.NamespacedName
				for _, p := range modelPools {
					checkPool(t, s, p, m[p], modelPods...)
					if len(m[p]) > 0 {
						live = append(live, p)
					}
				}
				checkPools(t, s, live...)
			},
		})
	})
}
