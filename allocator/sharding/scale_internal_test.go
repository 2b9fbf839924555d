package sharding

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/syncer"
)

const (
	scalePools   = 10_000
	scalePerPool = 100
	scaleHeld    = 80 // pods of each pool held, one per claim
)

// scaleInput is pool i's listing: scalePerPool ready pods, scaleHeld of
// them held by single-pod claims whose records and pod marks say so.
func scaleInput(p types.NamespacedName, i int) allocator.Input {
	in := allocator.Input{Pool: p, Pods: make([]corev1.Pod, scalePerPool)}
	keys := syncer.DefaultKeys()
	for j := range in.Pods {
		in.Pods[j] = corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: fmt.Sprintf("%s-%03d", p.Name, j),
				UID:             types.UID(fmt.Sprintf("0a1b2c3d-%04d-4000-8000-%012d", i%10000, j)),
				ResourceVersion: strconv.Itoa(1000 + j)},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
	}
	for j := range scaleHeld {
		name := fmt.Sprintf("%s-c%03d", p.Name, j)
		cl := testenv.NewClaim(p.Namespace, name, p.Name, 1)
		cl.UID = types.UID(fmt.Sprintf("6f1c2a3e-%04d-4000-8000-%012d", i%10000, j))
		cl.ResourceVersion = strconv.Itoa(100000 + j)
		cl.CreationTimestamp = metav1.NewTime(time.Unix(int64(j), 0))
		v, err := syncer.EncodePods([]string{in.Pods[j].Name})
		if err != nil {
			panic(err)
		}
		cl.Annotations = map[string]string{keys.Allocated: v}
		cl.Finalizers = []string{keys.Finalizer}
		in.Pods[j].Annotations = map[string]string{allocator.DefaultPodMarkKey: name + "/" + string(cl.UID)}
		in.Claims = append(in.Claims, allocator.Claim{Object: cl, Want: 1})
	}
	return in
}

// BenchmarkScale places 10,000 pools of 100 pods (80 held) over 1, 2, 4, 8
// and 16 replicas and reports, for one replica: the pools it owns, the
// heap its allocator keeps for them once recovered (MiB/replica), the time
// to run one Round on each of them (resync-ms), and the fraction of all
// pools that move to a replica joining the group (moved-on-join). Run it
// with
//
//	go test ./allocator/sharding -run '^$' -bench Scale -benchtime 1x
func BenchmarkScale(b *testing.B) {
	all := make([]types.NamespacedName, scalePools)
	for i := range all {
		all[i] = types.NamespacedName{Namespace: fmt.Sprintf("team-%03d", i%100), Name: fmt.Sprintf("pool-%05d", i)}
	}
	scheme, err := testenv.NewScheme()
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 2, 4, 8, 16} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			members := make([]string, n)
			for i := range members {
				members[i] = fmt.Sprintf("replica-%02d", i)
			}
			var mine []int
			for i, p := range all {
				if owner(members, p) == members[0] {
					mine = append(mine, i)
				}
			}
			joined := append(append([]string{}, members...), "replica-new")
			moved := 0
			for _, p := range all {
				if owner(members, p) != owner(joined, p) {
					moved++
				}
			}
			var heap, resync float64
			for range b.N {
				c := fake.NewClientBuilder().WithScheme(scheme).Build()
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				a, err := allocator.New(c)
				if err != nil {
					b.Fatal(err)
				}
				for _, i := range mine {
					if _, err := a.Round(context.Background(), scaleInput(all[i], i)); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				heap = float64(after.HeapAlloc) - float64(before.HeapAlloc)
				// One resync: a Round of each pool with its listing built
				// ahead, as an informer cache holds it.
				inputs := make([]allocator.Input, len(mine))
				for k, i := range mine {
					inputs[k] = scaleInput(all[i], i)
				}
				start := time.Now()
				for _, in := range inputs {
					if _, err := a.Round(context.Background(), in); err != nil {
						b.Fatal(err)
					}
				}
				resync = float64(time.Since(start).Microseconds()) / 1000
				runtime.KeepAlive(a)
			}
			b.ReportMetric(float64(len(mine)), "pools/replica")
			b.ReportMetric(heap/(1<<20), "MiB/replica")
			b.ReportMetric(resync, "resync-ms")
			b.ReportMetric(float64(moved)/float64(len(all)), "moved-on-join")
		})
	}
}
