package store_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolalloc/poolalloc/store"
	"github.com/poolalloc/poolalloc/store/storetest"
)

// implementations are the stores of this package, each with a
// constructor returning a new, empty one.
var implementations = []struct {
	name     string
	newStore func() store.AllocationStore
}{
	{"InMemory", func() store.AllocationStore { return store.NewInMemory() }},
	{"Sorted", func() store.AllocationStore { return store.NewSorted() }},
}

// TestConformance runs the public conformance suite against every
// implementation, made by its constructor and as a zero value.
func TestConformance(t *testing.T) {
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) { storetest.Run(t, impl.newStore) })
	}
	t.Run("InMemoryZeroValue", func(t *testing.T) {
		storetest.Run(t, func() store.AllocationStore { return new(store.InMemory) })
	})
	t.Run("SortedZeroValue", func(t *testing.T) {
		storetest.Run(t, func() store.AllocationStore { return new(store.Sorted) })
	})
}

// TestCountDoesNotAllocate checks Count's promise to hot paths.
func TestCountDoesNotAllocate(t *testing.T) {
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) {
			s := impl.newStore()
			require.NoError(t, s.Allocate(pool, claimA, []string{"x", "y"}))
			var n int
			allocs := testing.AllocsPerRun(100, func() {
				n, _ = s.Count(pool, claimA.UID)
				m, _ := s.Count(pool, claimB.UID)
				k, _ := s.Count(types.NamespacedName{Name: "unknown"}, claimA.UID)
				n += m + k
			})
			require.Equal(t, 2, n)
			require.Zero(t, allocs, "allocations per Count")
		})
	}
}

var (
	pool   = types.NamespacedName{Namespace: "ns", Name: "pool"}
	claimA = store.Holder{UID: "uid-a", Claim: types.NamespacedName{Namespace: "ns", Name: "a"}}
	claimB = store.Holder{UID: "uid-b", Claim: types.NamespacedName{Namespace: "ns", Name: "b"}}
)

// TestErrors checks what both implementations add to the contract: which
// error wins when several apply, and the context in the messages.
func TestErrors(t *testing.T) {
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) { testErrors(t, impl.newStore()) })
	}
}

func testErrors(t *testing.T, s store.AllocationStore) {
	require.NoError(t, s.Allocate(pool, claimA, []string{"x", "y"}))

	for _, tc := range []struct {
		name    string
		err     error
		is      error
		mention []string
	}{
		{"held pod, first in call order", s.Allocate(pool, claimB, []string{"free", "y", "x"}), store.ErrPodHeld,
			[]string{"pool ns/pool", "pod y", "ns/a"}},
		{"duplicate wins over held", s.Allocate(pool, claimB, []string{"x", "z", "x"}), store.ErrInvalidArgument,
			[]string{"pool ns/pool", "pod x", "twice"}},
		{"empty name wins over held", s.Allocate(pool, claimB, []string{"x", ""}), store.ErrInvalidArgument,
			[]string{"pool ns/pool", "index 1"}},
		{"empty UID", s.Allocate(pool, store.Holder{Claim: claimB.Claim}, []string{"z"}), store.ErrInvalidArgument,
			[]string{"pool ns/pool", "ns/b", "UID"}},
		{"one UID, two claim names", s.Allocate(pool, store.Holder{UID: claimA.UID, Claim: claimB.Claim}, []string{"z"}),
			store.ErrInvalidArgument, []string{"pool ns/pool", "uid-a", "ns/a"}},
		{"free of another claim's pod", s.Free(pool, claimB.UID, []string{"x"}), store.ErrNotHeld,
			[]string{"pool ns/pool", "pod x", "uid-b", "ns/a"}},
		{"free, duplicate wins over not held", s.Free(pool, claimA.UID, []string{"x", "free", "x"}), store.ErrInvalidArgument,
			[]string{"pool ns/pool", "pod x", "twice"}},
		{"free, unknown pool", s.Free(types.NamespacedName{Namespace: "o", Name: "p"}, claimA.UID, []string{"x"}), store.ErrNotHeld,
			[]string{"pool o/p", "pod x"}},
		{"free, empty UID", s.Free(pool, "", []string{"x"}), store.ErrInvalidArgument, []string{"pool ns/pool"}},
	} {
		require.ErrorIs(t, tc.err, tc.is, tc.name)
		for _, want := range tc.mention {
			require.Contains(t, tc.err.Error(), want, tc.name)
		}
	}
	snap, err := s.Snapshot(pool)
	require.NoError(t, err)
	require.Equal(t, map[string]store.Holder{"x": claimA, "y": claimA}, snap)

	// A long call takes the map-based duplicate check.
	long := make([]string, 100)
	for i := range long {
		long[i] = fmt.Sprintf("long-%d", i)
	}
	long[99] = "long-50"
	require.ErrorIs(t, s.Allocate(pool, claimB, long), store.ErrInvalidArgument)
	require.ErrorIs(t, s.Free(pool, claimA.UID, append([]string{"x", "y"}, long...)), store.ErrInvalidArgument)
	snap, err = s.Snapshot(pool)
	require.NoError(t, err)
	require.Len(t, snap, 2)

	// Nothing to do is not an error.
	require.NoError(t, s.Allocate(pool, claimB, nil))
	require.NoError(t, s.Free(pool, claimB.UID, []string{}))
	require.False(t, errors.Is(s.Allocate(pool, claimB, long[:99]), store.ErrInvalidArgument))
}

// TestErrorMessagePrefix pins the message format that the sentinel errors
// share: pool first, then pod.
func TestErrorMessagePrefix(t *testing.T) {
	for _, impl := range implementations {
		s := impl.newStore()
		require.NoError(t, s.Allocate(pool, claimA, []string{"x"}))
		for _, err := range []error{
			s.Allocate(pool, claimB, []string{"x"}),
			s.Allocate(pool, claimB, []string{"z", "z"}),
			s.Free(pool, claimB.UID, []string{"x"}),
			s.Free(pool, claimA.UID, []string{"z"}),
		} {
			require.True(t, strings.HasPrefix(err.Error(), "pool ns/pool: pod "), "%s: %v", impl.name, err)
		}
	}
}

// BenchmarkAllocateFree measures one Allocate and one Free of 4 pods for a
// new claim in a pool whose other pods are all held, two per claim. For
// InMemory the cost per op should not depend on the pool's size; for
// Sorted it grows with it.
func BenchmarkAllocateFree(b *testing.B) {
	for _, impl := range implementations {
		for _, size := range []int{1_000, 10_000, 50_000} {
			b.Run(fmt.Sprintf("%s/pool=%d", impl.name, size), func(b *testing.B) {
				benchmarkAllocateFree(b, impl.newStore(), size)
			})
		}
	}
}

func benchmarkAllocateFree(b *testing.B, s store.AllocationStore, size int) {
	pods := make([]string, size)
	for i := range pods {
		pods[i] = fmt.Sprintf("pod-%05d", i)
	}
	const free = 4
	for i := 0; i < size-free; i += 2 {
		h := store.Holder{
			UID:   types.UID(fmt.Sprintf("uid-%05d", i)),
			Claim: types.NamespacedName{Namespace: pool.Namespace, Name: fmt.Sprintf("claim-%05d", i)},
		}
		if err := s.Allocate(pool, h, pods[i:min(i+2, size-free)]); err != nil {
			b.Fatal(err)
		}
	}
	// The new claim's pods sort into the middle of the pool.
	call := pods[size-free:]
	for i := range call {
		call[i] = fmt.Sprintf("pod-%05d-new", size/2+i)
	}
	h := store.Holder{UID: "uid-new", Claim: types.NamespacedName{Namespace: pool.Namespace, Name: "claim-new"}}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Allocate(pool, h, call); err != nil {
			b.Fatal(err)
		}
		if err := s.Free(pool, h.UID, call); err != nil {
			b.Fatal(err)
		}
	}
}
