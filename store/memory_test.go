package store_test

import (
	"fmt"
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolalloc/poolalloc/store"
)

// The shape the allocator is sized for: one pool of heapPods pods, all
// held, by heapClaims claims. The first heapPods-heapClaims claims hold
// two pods each, the rest one.
const (
	heapPods   = 50_000
	heapClaims = 40_000
)

// heapCall is one Allocate of the fill.
type heapCall struct {
	h    store.Holder
	pods []string
}

// heapFixture builds the fill's calls. Pod names and holders are built
// once and outlive every store, as they do in the allocator (pod names
// come from the pool's listing, holders from the claims), so the heap a
// store adds is its own: index entries, not the bytes of the names.
func heapFixture() []heapCall {
	calls := make([]heapCall, heapClaims)
	pod := 0
	for i := range calls {
		n := 1
		if i < heapPods-heapClaims {
			n = 2
		}
		pods := make([]string, n)
		for j := range pods {
			pods[j] = fmt.Sprintf("pool-7d9f8c6b5-%05d", pod)
			pod++
		}
		calls[i] = heapCall{
			h: store.Holder{
				UID:   types.UID(fmt.Sprintf("6f1c2a3e-0000-4000-8000-%012d", i)),
				Claim: types.NamespacedName{Namespace: pool.Namespace, Name: fmt.Sprintf("claim-%05d", i)},
			},
			pods: pods,
		}
	}
	if pod != heapPods {
		panic("heapFixture: wrong pod count")
	}
	return calls
}

func fill(tb testing.TB, s store.AllocationStore, calls []heapCall) {
	for _, c := range calls {
		if err := s.Allocate(pool, c.h, c.pods); err != nil {
			tb.Fatal(err)
		}
	}
}

// heapPerPod returns the live heap, in bytes per held pod, of a store
// filled with calls, measured after a full collection.
func heapPerPod(tb testing.TB, newStore func() store.AllocationStore, calls []heapCall) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := newStore()
	fill(tb, s, calls)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(s)
	return (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / heapPods
}

// BenchmarkHeapPerPod times filling a store with 50,000 pods held by
// 40,000 claims, and reports the live heap the filled store keeps per
// held pod (B/pod). Run it with
//
//	go test ./store/ -run '^$' -bench HeapPerPod -benchtime 5x
func BenchmarkHeapPerPod(b *testing.B) {
	for _, impl := range implementations {
		b.Run(impl.name, func(b *testing.B) {
			calls := heapFixture()
			// Measure before the timed loop: b.Loop keeps what its body
			// used alive after it, which would skew the heap figures.
			perPod := heapPerPod(b, impl.newStore, calls)
			for b.Loop() {
				fill(b, impl.newStore(), calls)
			}
			b.ReportMetric(perPod, "B/pod")
		})
	}
}
