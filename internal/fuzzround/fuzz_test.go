package fuzzround_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/syncer"
)

// FuzzRound feeds a round arbitrary pod readiness, claim wants and claim
// annotations (allocated, release and released lists as raw strings), then
// runs rounds. Whatever the input, a round must not panic; when it reports
// no error, every record must list only pods of the pool, and no pod may be
// in two records or held twice in the store.
func FuzzRound(f *testing.F) {
	f.Add(uint8(0b1111), uint8(2), uint8(1), `{"pods":["p-0"]}`, ``, ``, false)
	f.Add(uint8(0b0101), uint8(3), uint8(3), `{"pods":["p-1","p-1"]}`, `{"pods":["p-1"]}`, `{"pods":["p-2"]}`, true)
	f.Add(uint8(0xff), uint8(1), uint8(2), `{"pods":["p-0"]}`, `{"pods":["p-0"]}`, `{"pods":[]}`, false)
	f.Add(uint8(0), uint8(0), uint8(9), `{"pods":`, `null`, `{"pods":["Q"]}`, true)
	f.Fuzz(func(t *testing.T, ready uint8, want1, want2 uint8, alloc2, release1, released2 string, marks bool) {
		ctx := context.Background()
		scheme, err := testenv.NewScheme()
		if err != nil {
			t.Fatal(err)
		}
		keys := syncer.DefaultKeys()
		pool := types.NamespacedName{Namespace: "ns", Name: "p"}
		var objs []client.Object
		var pods []corev1.Pod
		for i := range 6 {
			pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p-" + strconv.Itoa(i)}}
			if ready&(1<<i) != 0 {
				pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
			}
			objs = append(objs, pod.DeepCopy())
			pods = append(pods, pod)
		}
		c1 := testenv.NewClaim("ns", "c1", "p", int32(want1%8))
		c1.UID = "uid-1"
		c1.Annotations = map[string]string{keys.Release: release1}
		c2 := testenv.NewClaim("ns", "c2", "p", int32(want2%8))
		c2.UID = "uid-2"
		c2.Annotations = map[string]string{keys.Allocated: alloc2, keys.Released: released2}
		objs = append(objs, c1, c2)
		c := fake.NewClientBuilder().WithGlobalResourceVersionCounter().WithScheme(scheme).WithObjects(objs...).Build()
		var opts []allocator.Option
		if !marks {
			opts = append(opts, allocator.WithPodMarks(false))
		}
		a, err := allocator.New(c, opts...)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			in := allocator.Input{Pool: pool}
			var podList corev1.PodList
			if err := c.List(ctx, &podList); err != nil {
				t.Fatal(err)
			}
			in.Pods = podList.Items
			for _, name := range []string{"c1", "c2"} {
				cl := &testenv.Claim{}
				if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: name}, cl); err != nil {
					t.Fatal(err)
				}
				in.Claims = append(in.Claims, allocator.Claim{Object: cl, Want: int(cl.Spec.Replicas)})
			}
			res, err := a.Round(ctx, in)
			if errors.Is(err, allocator.ErrPoolBlocked) {
				return // failed closed: nothing to check
			}
			checkRecords(t, c, a, pool, pods, res)
		}
	})
}

func checkRecords(t *testing.T, c client.Client, a allocator.Allocator, pool types.NamespacedName, pods []corev1.Pod, res allocator.Result) {
	t.Helper()
	s, err := syncer.NewAnnotationSyncer(c, syncer.DefaultKeys())
	if err != nil {
		t.Fatal(err)
	}
	inPool := map[string]bool{}
	for _, p := range pods {
		inPool[p.Name] = true
	}
	snap, err := a.Store().Snapshot(pool)
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	for _, name := range []string{"c1", "c2"} {
		cl := &testenv.Claim{}
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, cl); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Read(cl)
		if err != nil {
			continue // a record the allocator did not write yet
		}
		for _, p := range rec.Held() {
			if other, dup := owner[p]; dup {
				t.Fatalf("pod %s in the records of %s and %s", p, other, name)
			}
			owner[p] = name
			if h, ok := snap[p]; ok && h.Claim.Name != name {
				t.Fatalf("pod %s in %s's record but held by %s in the store", p, name, h.Claim.Name)
			}
		}
	}
	// A record's pod missing from the pool is kept held, as lost.
	lost := map[string]bool{}
	for _, l := range res.Lost {
		lost[l.Pod] = l.Missing
	}
	for p := range snap {
		if !inPool[p] && !lost[p] {
			t.Fatalf("store holds %s, which is not a pod of the pool and not reported lost", p)
		}
	}
}
