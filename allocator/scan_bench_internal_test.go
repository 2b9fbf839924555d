package allocator

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/internal/testenv"
)

// BenchmarkScan times scan alone on a pool of 50,000 pods and 40,000
// claims, every object unchanged, listed as a cache's List gives them
// (BenchmarkRoundCacheListing): deep copies in a fresh list, in name order
// (order=fixed), in the order of an informer's indexer (order=cache) or in
// a new random order each time (order=random). Each order's pool is
// recovered from a listing in that order, as an operator's allocator
// recovers from its cache (docs/design.md §13).
func BenchmarkScan(b *testing.B) {
	const pods, claims = 50000, 40000
	ctx := context.Background()
	scheme, err := testenv.NewScheme()
	if err != nil {
		b.Fatal(err)
	}
	d := &listingDraw{ns: "ns"}
	base := Input{Pool: types.NamespacedName{Namespace: "ns", Name: "p"}}
	for i := range pods {
		base.Pods = append(base.Pods, d.pod("pod-"+strconv.Itoa(i)))
	}
	for i := range claims {
		base.Claims = append(base.Claims, d.claim("claim-"+strconv.Itoa(i)))
	}
	// The informer order: two indexers (a cache's two informers).
	podIdx := func() []int {
		o := NewCacheOrder()
		for j := range base.Pods {
			if err := o.Add(&base.Pods[j], j); err != nil {
				b.Fatal(err)
			}
		}
		perm, err := o.Order(base.Pool.Namespace)
		if err != nil {
			b.Fatal(err)
		}
		return perm
	}
	claimIdx := func() []int {
		o := NewCacheOrder()
		for j := range base.Claims {
			if err := o.Add(base.Claims[j].Object, j); err != nil {
				b.Fatal(err)
			}
		}
		perm, err := o.Order(base.Pool.Namespace)
		if err != nil {
			b.Fatal(err)
		}
		return perm
	}
	for _, order := range []string{"fixed", "cache", "random"} {
		b.Run("order="+order, func(b *testing.B) {
			rnd := rand.New(rand.NewPCG(1, 2))
			var podCache, claimCache []int
			if order == "cache" {
				podCache, claimCache = podIdx(), claimIdx()
			}
			list := func() Input {
				var podPerm, claimPerm []int
				switch order {
				case "fixed":
					podPerm, claimPerm = identity(pods), identity(claims)
				case "cache":
					podPerm, claimPerm = podCache, claimCache
				default:
					podPerm, claimPerm = rnd.Perm(pods), rnd.Perm(claims)
				}
				in := Input{Pool: base.Pool, Pods: make([]corev1.Pod, pods), Claims: make([]Claim, claims)}
				for k, j := range podPerm {
					base.Pods[j].DeepCopyInto(&in.Pods[k])
				}
				items := make([]testenv.Claim, claims)
				for k, j := range claimPerm {
					base.Claims[j].Object.(*testenv.Claim).DeepCopyInto(&items[k])
					in.Claims[k] = Claim{Object: &items[k]}
				}
				return in
			}
			al, err := New(fake.NewClientBuilder().WithScheme(scheme).Build(), WithPodMarks(false), WithInvariantChecks(false))
			if err != nil {
				b.Fatal(err)
			}
			a := al.(*defaultAllocator)
			if _, err := a.Round(ctx, list()); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				b.StopTimer()
				in := list()
				runtime.GC()
				p := a.lookupPool(in.Pool)
				p.mu.Lock()
				r := &round{a: a, p: p, ctx: ctx, now: time.Now(), res: &Result{Pool: in.Pool}}
				p.gen++
				b.StartTimer()
				changedPods, changedClaims, err := r.scan(in.Pods, in.Claims)
				b.StopTimer()
				p.mu.Unlock()
				if err != nil || len(changedPods) != 0 || len(changedClaims) != 0 {
					b.Fatalf("scan: %v, %d pods and %d claims changed", err, len(changedPods), len(changedClaims))
				}
				b.StartTimer()
			}
		})
	}
}

// CacheOrder gives a listing the order of an informer's cache: it keeps
// the listing's objects in a client-go indexer indexed by namespace, as
// controller-runtime's cache indexes them, and reads them back by that
// index, as controller-runtime's List of one namespace does (in the order
// of a Go map, which changes little from one List to the next).
type CacheOrder struct {
	idx cache.Indexer
	at  map[string]int // an object's place in the listing, by name
}

// NewCacheOrder returns an empty CacheOrder.
func NewCacheOrder() *CacheOrder {
	return &CacheOrder{
		idx: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		at:  make(map[string]int),
	}
}

// Add puts obj, at place i of the listing, in the cache.
func (o *CacheOrder) Add(obj client.Object, i int) error {
	o.at[obj.GetName()] = i
	return o.idx.Add(obj)
}

// Order returns the places of namespace ns's objects in the cache's order.
func (o *CacheOrder) Order(ns string) ([]int, error) {
	objs, err := o.idx.ByIndex(cache.NamespaceIndex, ns)
	if err != nil {
		return nil, err
	}
	perm := make([]int, len(objs))
	for k, obj := range objs {
		perm[k] = o.at[obj.(metav1.Object).GetName()]
	}
	return perm, nil
}

// identity returns 0, 1, ..., n-1.
func identity(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
