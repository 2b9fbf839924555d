package allocator

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/internal/testenv"
)

// BenchmarkScan times scan alone on a pool of 50,000 pods and 40,000
// claims, every object unchanged, listed as a cache's List gives them
// (BenchmarkRoundCacheListing): deep copies in a fresh list, in name order
// or in a new order each time (docs/design.md §13).
func BenchmarkScan(b *testing.B) {
	const pods, claims = 50000, 40000
	ctx := context.Background()
	scheme, err := testenv.NewScheme()
	if err != nil {
		b.Fatal(err)
	}
	al, err := New(fake.NewClientBuilder().WithScheme(scheme).Build(), WithPodMarks(false), WithInvariantChecks(false))
	if err != nil {
		b.Fatal(err)
	}
	a := al.(*defaultAllocator)
	d := &listingDraw{ns: "ns"}
	base := Input{Pool: types.NamespacedName{Namespace: "ns", Name: "p"}}
	for i := range pods {
		base.Pods = append(base.Pods, d.pod("pod-"+strconv.Itoa(i)))
	}
	for i := range claims {
		base.Claims = append(base.Claims, d.claim("claim-"+strconv.Itoa(i)))
	}
	if _, err := a.Round(ctx, base); err != nil {
		b.Fatal(err)
	}
	for _, order := range []string{"fixed", "cache"} {
		b.Run("order="+order, func(b *testing.B) {
			rnd := rand.New(rand.NewPCG(1, 2))
			for b.Loop() {
				b.StopTimer()
				perm := func(n int) []int {
					if order == "cache" {
						return rnd.Perm(n)
					}
					out := make([]int, n)
					for i := range out {
						out[i] = i
					}
					return out
				}
				in := Input{Pool: base.Pool, Pods: make([]corev1.Pod, pods), Claims: make([]Claim, claims)}
				for k, j := range perm(pods) {
					base.Pods[j].DeepCopyInto(&in.Pods[k])
				}
				items := make([]testenv.Claim, claims)
				for k, j := range perm(claims) {
					base.Claims[j].Object.(*testenv.Claim).DeepCopyInto(&items[k])
					in.Claims[k] = Claim{Object: &items[k]}
				}
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
