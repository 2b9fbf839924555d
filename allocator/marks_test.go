package allocator_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
)

// marks returns each pod of the pool's mark annotation, by pod name.
func (f *fixture) marks(pool string) map[string]string {
	f.t.Helper()
	return podMarks(f.t, f.c, f.ns, pool)
}

// podMarks returns each pod of pool's mark annotation in ns, by pod name.
func podMarks(t *testing.T, c client.Client, ns, pool string) map[string]string {
	t.Helper()
	pods, err := testenv.ListPods(context.Background(), c, ns, pool)
	require.NoError(t, err)
	out := map[string]string{}
	for _, p := range pods {
		if v := p.Annotations[allocator.DefaultPodMarkKey]; v != "" {
			out[p.Name] = v
		}
	}
	return out
}

func (f *fixture) forceDelete(name string) {
	f.t.Helper()
	forceDeleteClaim(f.t, f.c, f.get(name))
	require.True(f.t, f.gone(name))
}

// gatedRecycler reports pods recycled only while allowed, and records them.
type gatedRecycler struct {
	allow    atomic.Bool
	mu       sync.Mutex
	recycled []string
}

func (g *gatedRecycler) recycle(_ context.Context, req allocator.RecycleRequest) (bool, error) {
	pod := req.Pod
	if !g.allow.Load() {
		return false, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.recycled = append(g.recycled, pod)
	return true, nil
}

func TestPodMarksFollowTheLifecycle(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 3)
	a := f.alloc(allocator.WithPodMarks(true))
	c := f.claim("c", "p", 2)
	f.round(a, pool)
	held := f.held("c")
	want := map[string]string{}
	for _, p := range held {
		want[p] = "c/" + string(c.UID)
	}
	require.Equal(t, want, f.marks("p"), "every pod handed out carries its claim's mark")

	f.scale("c", 1)
	f.round(a, pool)
	require.Len(t, f.marks("p"), 1, "a released pod loses its mark")
	require.Equal(t, f.held("c"), mapKeys(f.marks("p")))
}

func TestPodMarksRecycleForceDeletedClaimAfterRestart(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 2)
	a := f.alloc(allocator.WithPodMarks(true))
	f.claim("old", "p", 2)
	f.round(a, pool)
	dirty := f.held("old")

	// The allocator stops; meanwhile the claim is force-deleted, taking
	// its record with it.
	f.forceDelete("old")
	f.claim("new", "p", 2)

	var g gatedRecycler
	b := f.alloc(allocator.WithPodMarks(true), allocator.WithRecycler(g.recycle))
	res := f.round(b, pool)
	require.Empty(t, f.held("new"), "the pods are dirty: not handed out before recycling")
	require.Equal(t, dirty, res.Recycling)
	require.Equal(t, 2, res.Shortfall)
	g.allow.Store(true)
	f.round(b, pool) // recycled, freed, unmarked
	f.round(b, pool)
	require.ElementsMatch(t, dirty, g.recycled)
	require.Equal(t, dirty, f.held("new"))
}

func TestWithoutPodMarksForceDeleteWhileDownIsNotDetected(t *testing.T) {
	// The documented limit of records alone, kept as a test so that the
	// README's Limitations stay true.
	f := newFixture(t)
	pool := f.pool("p", 1)
	a := f.alloc(allocator.WithPodMarks(false))
	f.claim("old", "p", 1)
	f.round(a, pool)
	f.forceDelete("old")
	f.claim("new", "p", 1)
	b := f.alloc(allocator.WithPodMarks(false))
	res := f.round(b, pool)
	require.Equal(t, []string{"p-0"}, f.held("new"))
	require.Empty(t, res.Recycling)
}

func TestTwoAllocatorsWithPodMarksNeverShareAPod(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 8)
	// Different strategies, so the two make different choices: with the
	// same one they would deterministically agree and hide the race.
	a1 := f.alloc(allocator.WithPodMarks(true))
	a2 := f.alloc(allocator.WithPodMarks(true), allocator.WithAlgorithm(algorithm.Spread{}))
	// Both recover the empty pool first, as two replicas would at start:
	// from then on neither believes records it did not write.
	f.round(a1, pool)
	f.round(a2, pool)
	names := []string{"a", "b", "c", "d", "e", "f"}
	for _, n := range names {
		f.claim(n, "p", 2)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, a := range []allocator.Allocator{a1, a2} {
		wg.Go(func() {
			<-start
			for round := range 12 {
				_, _ = world.Round(f.ctx, a, f.c, pool)
				if round == 6 && i == 0 {
					f.scale("a", 0) // churn: pods go back and out again
				}
			}
		})
	}
	close(start)
	wg.Wait()
	marks := f.marks("p")
	seen := map[string]string{}
	for _, n := range names {
		uid := string(f.get(n).UID)
		for _, p := range f.held(n) {
			other, dup := seen[p]
			require.False(t, dup, "pod %s is in the records of %s and %s", p, other, n)
			seen[p] = n
			require.Equal(t, n+"/"+uid, marks[p], "pod %s is in %s's record but marked %q", p, n, marks[p])
		}
	}
	for p, m := range marks {
		owners := 0
		for _, n := range names {
			if m == n+"/"+string(f.get(n).UID) {
				owners++
			}
		}
		require.LessOrEqual(t, owners, 1, "pod %s mark %q", p, m)
	}
}

// attacker is a user who may edit claims (annotations included) and
// nothing else: no rights on pods.
func (f *fixture) attacker() client.Client {
	f.t.Helper()
	c, err := env.UserClient(f.ctx, "mallory-"+f.ns, []rbacv1.PolicyRule{{
		APIGroups: []string{testenv.Group},
		Resources: []string{"claims"},
		Verbs:     []string{"get", "list", "watch", "create", "update", "patch"},
	}}, f.ns)
	require.NoError(f.t, err)
	return c
}

func (f *fixture) annotateAs(c client.Client, claim, key, value string) {
	f.t.Helper()
	obj := &testenv.Claim{}
	require.NoError(f.t, c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: claim}, obj))
	patch := client.MergeFrom(obj.DeepCopy())
	if obj.Annotations == nil {
		obj.Annotations = map[string]string{}
	}
	obj.Annotations[key] = value
	require.NoError(f.t, c.Patch(f.ctx, obj, patch))
}

func TestClaimEditorCannotTakePods(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "live", true: "across-restart"}[restart], func(t *testing.T) {
			f := newFixture(t)
			pool := f.pool("p", 3)
			var mu sync.Mutex
			var recycled []string
			opts := []allocator.Option{allocator.WithPodMarks(true),
				allocator.WithRecycler(func(_ context.Context, req allocator.RecycleRequest) (bool, error) {
					mu.Lock()
					defer mu.Unlock()
					recycled = append(recycled, req.Pod)
					return true, nil
				})}
			a := f.alloc(opts...)
			f.claim("victim", "p", 1)
			f.round(a, pool)
			victim := f.held("victim")
			require.Len(t, victim, 1)
			mallory := f.attacker()

			// The attacker's own claim, wanting nothing.
			own := testenv.NewClaim(f.ns, "mine", "p", 0)
			require.NoError(t, mallory.Create(f.ctx, own))
			f.round(a, pool)
			var free []string
			for _, p := range []string{"p-0", "p-1", "p-2"} {
				if p != victim[0] {
					free = append(free, p)
				}
			}

			// Attack 1: list the victim's pod and a free pod as allocated to
			// the attacker's claim.
			f.annotateAs(mallory, "mine", f.keys.Allocated, `{"pods":["`+victim[0]+`","`+free[0]+`"]}`)
			// Attack 2: give back the victim's pod on the victim's behalf
			// through the attacker's own claim's release list.
			f.annotateAs(mallory, "mine", f.keys.Release, `{"pods":["`+victim[0]+`"]}`)
			// Attack 3: mark the victim's pod released in the victim's
			// record, so that it looks free.
			f.annotateAs(mallory, "victim", f.keys.Released, `{"pods":["`+victim[0]+`"]}`)
			// Pods are out of reach: the attacker cannot mark or unmark.
			pod := &corev1.Pod{}
			require.Error(t, mallory.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: victim[0]}, pod))

			b := a
			if restart {
				b = f.alloc(opts...)
			}
			for range 3 {
				_, _ = world.Round(f.ctx, b, f.c, pool)
			}
			snap := f.snapshot(b, pool)
			require.NotContains(t, slices.Collect(mapValues(snap)), "mine", "the attacker's claim holds nothing")
			require.Empty(t, f.held("mine"))
			require.Len(t, f.held("victim"), 1, "the victim is served")
			// The victim's pod, which a forged record says is released, and
			// the free pod the attacker listed are of uncertain use: neither
			// is handed out again before it is recycled.
			mu.Lock()
			require.Contains(t, recycled, victim[0])
			require.Contains(t, recycled, free[0])
			mu.Unlock()
			marks := f.marks("p")
			for _, p := range f.held("victim") {
				require.Equal(t, "victim/"+string(f.get("victim").UID), marks[p])
			}
			require.Len(t, marks, 1, "no mark is left on a pod no record holds")
		})
	}
}

func mapValues(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}
