package allocator_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/store"
	"github.com/poolalloc/poolalloc/syncer"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// fixture is one test's namespace on the real API server.
type fixture struct {
	t    *testing.T
	ctx  context.Context
	c    client.Client
	ns   string
	keys syncer.Keys
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	return &fixture{t: t, ctx: ctx, c: env.Client, ns: env.Namespace(ctx, t), keys: syncer.DefaultKeys()}
}

func (f *fixture) pool(name string, pods int) types.NamespacedName {
	f.t.Helper()
	_, err := testenv.CreatePods(f.ctx, f.c, f.ns, name, pods, true)
	require.NoError(f.t, err)
	return types.NamespacedName{Namespace: f.ns, Name: name}
}

func (f *fixture) claim(name, pool string, want int32) *testenv.Claim {
	f.t.Helper()
	c := testenv.NewClaim(f.ns, name, pool, want)
	require.NoError(f.t, f.c.Create(f.ctx, c))
	return c
}

// allocs counts the allocators the fixtures made: every other one runs on
// store.Sorted, the second store implementation, so that the lifecycle
// tests exercise both.
var allocs atomic.Int64

func (f *fixture) alloc(opts ...allocator.Option) allocator.Allocator {
	f.t.Helper()
	if allocs.Add(1)%2 == 0 {
		opts = append([]allocator.Option{allocator.WithStore(store.NewSorted())}, opts...)
	}
	a, err := allocator.New(f.c, opts...)
	require.NoError(f.t, err)
	f.t.Cleanup(func() { require.NoError(f.t, allocator.CheckInvariants(a)) })
	return a
}

func (f *fixture) round(a allocator.Allocator, pool types.NamespacedName) allocator.Result {
	f.t.Helper()
	res, err := world.Round(f.ctx, a, f.c, pool)
	require.NoError(f.t, err)
	require.NoError(f.t, allocator.CheckInvariants(a))
	return res
}

func (f *fixture) get(name string) *testenv.Claim {
	f.t.Helper()
	c := &testenv.Claim{}
	require.NoError(f.t, f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, c))
	return c
}

func (f *fixture) gone(name string) bool {
	err := f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, &testenv.Claim{})
	return apierrors.IsNotFound(err)
}

// held returns the pods the claim's record on the server says it holds.
func (f *fixture) held(name string) []string {
	f.t.Helper()
	s, err := syncer.NewAnnotationSyncer(f.c, f.keys)
	require.NoError(f.t, err)
	rec, err := s.Read(f.get(name))
	if !errors.Is(err, syncer.ErrMalformedRelease) {
		require.NoError(f.t, err)
	}
	h := rec.Held()
	slices.Sort(h)
	return h
}

func (f *fixture) setAnnotation(name, key, value string) {
	f.t.Helper()
	c := f.get(name)
	patch := client.MergeFrom(c.DeepCopy())
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[key] = value
	require.NoError(f.t, f.c.Patch(f.ctx, c, patch))
}

func (f *fixture) release(name string, pods ...string) {
	f.t.Helper()
	v, err := syncer.EncodePods(pods)
	require.NoError(f.t, err)
	f.setAnnotation(name, f.keys.Release, v)
}

func (f *fixture) scale(name string, want int32) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c := &testenv.Claim{}
		if err := f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, c); err != nil {
			return err
		}
		c.Spec.Replicas = want
		return f.c.Update(f.ctx, c)
	})
	require.NoError(f.t, err)
}

func (f *fixture) snapshot(a allocator.Allocator, pool types.NamespacedName) map[string]string {
	f.t.Helper()
	snap, err := a.Store().Snapshot(pool)
	require.NoError(f.t, err)
	out := make(map[string]string, len(snap))
	for pod, h := range snap {
		out[pod] = h.Claim.Name
	}
	return out
}

func grantsTo(res allocator.Result, claim string) []string {
	for _, g := range res.Allocated {
		if g.Claim.Name == claim {
			return g.Pods
		}
	}
	return nil
}

func TestNewClaimGetsPodsAndFinalizer(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 3)
	a := f.alloc()
	f.claim("c", "p", 2)

	res := f.round(a, pool)
	require.Len(t, grantsTo(res, "c"), 2)
	require.Len(t, f.held("c"), 2)
	require.True(t, controllerutil.ContainsFinalizer(f.get("c"), f.keys.Finalizer))
	require.Len(t, res.Idle, 1)
	require.Zero(t, res.Shortfall)
	require.Equal(t, f.held("c"), mapKeys(f.snapshot(a, pool)))

	// A second round changes nothing: no extra pod, no write.
	rv := f.get("c").ResourceVersion
	res = f.round(a, pool)
	require.Empty(t, res.Allocated)
	require.Equal(t, rv, f.get("c").ResourceVersion)
}

func mapKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestShortPoolAllocatesPartiallyAndReportsShortfall(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 2)
	a := f.alloc()
	f.claim("c", "p", 5)

	res := f.round(a, pool)
	require.Len(t, f.held("c"), 2)
	require.Equal(t, 3, res.Shortfall)

	// The pool grows: the claim is topped up.
	_, err := testenv.CreatePods(f.ctx, f.c, f.ns, "q", 3, true) // pods named q-*, relabelled below
	require.NoError(t, err)
	for _, n := range []string{"q-0", "q-1", "q-2"} {
		pod := &corev1.Pod{}
		require.NoError(t, f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: n}, pod))
		pod.Labels[testenv.PoolLabel] = "p"
		require.NoError(t, f.c.Update(f.ctx, pod))
	}
	res = f.round(a, pool)
	require.Len(t, f.held("c"), 5)
	require.Zero(t, res.Shortfall)
}

func TestScaleUpAndDown(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 4)
	a := f.alloc()
	f.claim("c", "p", 1)
	f.round(a, pool)
	require.Len(t, f.held("c"), 1)

	f.scale("c", 3)
	f.round(a, pool)
	require.Len(t, f.held("c"), 3)

	// Scale down: the surplus is released (recycled, then recorded), not
	// kept forever.
	f.scale("c", 1)
	res := f.round(a, pool)
	require.Len(t, f.held("c"), 1)
	require.Len(t, res.Released, 1)
	require.Len(t, res.Released[0].Pods, 2)
	require.Len(t, res.Idle, 3)
	require.Len(t, f.snapshot(a, pool), 1)
}

// TestWantAndPriorityAreInputsOfEveryRound raises a claim's Want, then its
// Priority, while its object stays unchanged: Want and Priority need not
// come from the object, and are read in every round, through Round and
// Update alike.
func TestWantAndPriorityAreInputsOfEveryRound(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 3)
	a := f.alloc()
	f.claim("c", "p", 1)
	f.claim("d", "p", 1)
	// asks maps claim names to the Want and Priority the caller computes
	// from elsewhere (a policy, another resource), not from the object.
	type ask struct {
		want     int
		priority int32
	}
	asks := map[string]ask{"c": {1, 0}, "d": {1, 0}}
	round := func() allocator.Result {
		t.Helper()
		in, err := world.Input(f.ctx, f.c, pool)
		require.NoError(t, err)
		for i := range in.Claims {
			ask := asks[in.Claims[i].Object.GetName()]
			in.Claims[i].Want, in.Claims[i].Priority = ask.want, ask.priority
		}
		res, err := a.Round(f.ctx, in)
		require.NoError(t, err)
		require.NoError(t, allocator.CheckInvariants(a))
		return res
	}
	round()
	require.Len(t, f.held("c"), 1)
	require.Len(t, f.held("d"), 1)

	// Want rises from 1 to 2 on an unchanged object: served.
	rv := f.get("c").ResourceVersion
	asks["c"] = ask{2, 0}
	res := round()
	require.NotEqual(t, rv, f.get("c").ResourceVersion, "the record was written")
	require.Len(t, f.held("c"), 2)
	require.Zero(t, res.Shortfall)

	// The pool is full: d asking for one more is short.
	asks["d"] = ask{2, 0}
	res = round()
	require.Equal(t, 1, res.Shortfall)

	// c gives one back; both then ask for one more, d at a higher priority
	// on an unchanged object: d, the younger claim, gets the free pod.
	asks["c"] = ask{1, 0}
	round() // c's surplus is recycled and released
	require.Len(t, f.held("c"), 1)
	asks["c"], asks["d"] = ask{2, 0}, ask{2, 5}
	res = round()
	require.Len(t, f.held("d"), 2, "d's raised priority was read from the input")
	require.Len(t, f.held("c"), 1)
	require.Equal(t, 1, res.Shortfall)

	// Through Update: d's Want falls, c's rises, on unchanged objects.
	update := func(name string, want int, priority int32) {
		t.Helper()
		_, err := a.Update(f.ctx, allocator.Changes{Pool: pool, Claims: []allocator.Claim{{Object: f.get(name), Want: want, Priority: priority}}})
		require.NoError(t, err)
		require.NoError(t, allocator.CheckInvariants(a))
	}
	update("d", 1, 5)
	require.Len(t, f.held("d"), 1)
	update("c", 2, 0)
	require.Len(t, f.held("c"), 2)
}

// TestReleasedPodNotHandedStraightBack has a claim give back its pod
// without lowering its Want, on a full pool (RecycleNoop, the default): it
// waits, and when a new pod arrives it gets that one, not the pod it gave
// back, which stays idle for others (TestAvoidedPodsGoLast in package
// algorithm: only when no other pod is left does it get one it gave back).
func TestReleasedPodNotHandedStraightBack(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 2)
	a := f.alloc()
	f.claim("c", "p", 1)
	f.claim("d", "p", 1)
	f.round(a, pool)
	old := f.held("c")
	require.Len(t, old, 1)

	f.release("c", old[0])
	res := f.round(a, pool)
	require.Empty(t, f.held("c"), "released, and no other pod free")
	require.Equal(t, 1, res.Shortfall)
	require.Equal(t, old, res.Idle, "free once recycled, released and unmarked")

	// The operator creates a pod for the shortfall. Both are free now, the
	// old one first in the pool's list.
	_, err := testenv.CreatePods(f.ctx, f.c, f.ns, "q", 1, true)
	require.NoError(t, err)
	pod := &corev1.Pod{}
	require.NoError(t, f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "q-0"}, pod))
	pod.Labels[testenv.PoolLabel] = "p"
	require.NoError(t, f.c.Update(f.ctx, pod))
	res = f.round(a, pool)
	require.Equal(t, []string{"q-0"}, f.held("c"), "the new pod, not the one it gave back")
	require.Equal(t, old, res.Idle)
	require.Zero(t, res.Shortfall)
}

func TestReleaseRequestHonouredOnlyForHeldPods(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 4)
	// Recycling takes a round: the first call starts it, the next finishes.
	var calls sync.Map
	recycler := func(_ context.Context, req allocator.RecycleRequest) (bool, error) {
		pod := req.Pod
		_, again := calls.LoadOrStore(pod, true)
		return again, nil
	}
	a := f.alloc(allocator.WithRecycler(recycler))
	f.claim("a", "p", 2)
	f.claim("b", "p", 1)
	f.round(a, pool)
	heldA, heldB := f.held("a"), f.held("b")
	require.Len(t, heldA, 2)
	require.Len(t, heldB, 1)

	// a gives back one of its pods, and also names b's pod and a pod of no
	// one: only its own pod is released.
	f.release("a", heldA[0], heldB[0], "p-nonexistent")
	res := f.round(a, pool)
	require.Equal(t, []string{heldA[0]}, res.Recycling)
	require.Contains(t, f.held("a"), heldA[0], "nothing is released before recycling finished")
	require.Len(t, f.held("a"), 3, "a wants 2 unreleased pods, so it gets a replacement at once")
	res = f.round(a, pool)
	require.Equal(t, heldB, f.held("b"))
	require.NotContains(t, f.held("a"), heldA[0])
	require.Len(t, f.held("a"), 2, "a wants 2, so the released pod is replaced")
	rec, err := mustSyncer(t, f).Read(f.get("a"))
	require.NoError(t, err)
	require.Equal(t, []string{heldA[0]}, rec.Released)
	require.Empty(t, res.Recycling)
}

func mustSyncer(t *testing.T, f *fixture) *syncer.AnnotationSyncer {
	s, err := syncer.NewAnnotationSyncer(f.c, f.keys)
	require.NoError(t, err)
	return s
}

func TestTerminatingClaimReleasesEverythingThenLosesFinalizer(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 3)
	a := f.alloc()
	f.claim("c", "p", 2)
	f.round(a, pool)
	// Another controller's finalizer must survive ours.
	c := f.get("c")
	controllerutil.AddFinalizer(c, "example.com/other")
	require.NoError(t, f.c.Update(f.ctx, c))
	require.NoError(t, f.c.Delete(f.ctx, c))
	// While terminating, it asks for more: it gets nothing new.
	f.scale("c", 3)

	res := f.round(a, pool)
	require.Empty(t, res.Allocated)
	require.Empty(t, f.held("c"))
	got := f.get("c")
	require.NotNil(t, got.DeletionTimestamp)
	require.Equal(t, []string{"example.com/other"}, got.Finalizers)
	require.Len(t, res.Idle, 3)
	require.Empty(t, f.snapshot(a, pool))
}

// A deleted claim that only the allocation finalizer keeps: the write
// that records its pods released and removes the finalizer lets it go. The
// API server then returns its last state at the resourceVersion the write
// replaced, which is no failed write (found by the quickstart, then by the
// single-allocator machine: testdata/rapid/TestPropertyEnvtest/
// TestPropertyEnvtest-deleted-claim-write-at-same-version.fail).
func TestDeletedClaimGoesWithTheLastFinalizer(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 3)
	a := f.alloc()
	f.claim("c", "p", 2)
	f.round(a, pool)
	require.Len(t, f.held("c"), 2)
	require.NoError(t, f.c.Delete(f.ctx, f.get("c")))

	res := f.round(a, pool)
	require.Len(t, res.Released, 1)
	require.Len(t, res.Released[0].Pods, 2)
	require.True(t, f.gone("c"), "the claim is gone")
	res = f.round(a, pool)
	require.Len(t, res.Idle, 3)
	require.Empty(t, f.snapshot(a, pool))
}

func TestForceDeletedClaimPodsRecycledNeverHandedOutDirty(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 2)
	var allow atomic.Bool
	recycled := make(chan string, 8)
	recycler := func(_ context.Context, req allocator.RecycleRequest) (bool, error) {
		pod := req.Pod
		if !allow.Load() {
			return false, nil
		}
		recycled <- pod
		return true, nil
	}
	a := f.alloc(allocator.WithRecycler(recycler))
	f.claim("old", "p", 2)
	f.round(a, pool)

	// Force-delete: strip finalizers, then delete.
	f.forceDelete("old")
	f.claim("new", "p", 2)

	// Until recycling finishes, the new claim gets nothing.
	for range 2 {
		res := f.round(a, pool)
		require.Empty(t, f.held("new"))
		require.Len(t, res.Recycling, 2)
		require.Equal(t, 2, res.Shortfall)
	}
	allow.Store(true)
	f.round(a, pool) // recycled and freed
	f.round(a, pool) // handed to new
	require.Len(t, recycled, 2)
	require.Len(t, f.held("new"), 2)
}

func TestLostPodsReportedAndReplacedOnRequest(t *testing.T) {
	for _, replace := range []bool{false, true} {
		t.Run(map[bool]string{false: "report", true: "replace"}[replace], func(t *testing.T) {
			f := newFixture(t)
			pool := f.pool("p", 4)
			a := f.alloc(allocator.WithReplaceLost(replace))
			f.claim("c", "p", 2)
			f.round(a, pool)
			held := f.held("c")

			// One held pod disappears, the other becomes unready.
			require.NoError(t, f.c.Delete(f.ctx, &corev1.Pod{ObjectMeta: objMeta(f.ns, held[0])}, client.GracePeriodSeconds(0)))
			pod := &corev1.Pod{}
			require.NoError(t, f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: held[1]}, pod))
			require.NoError(t, testenv.SetPodReady(f.ctx, f.c, pod, false))

			res := f.round(a, pool)
			if !replace {
				require.ElementsMatch(t, []allocator.LostPod{
					{Claim: types.NamespacedName{Namespace: f.ns, Name: "c"}, UID: f.get("c").UID, Pod: held[0], Missing: true},
					{Claim: types.NamespacedName{Namespace: f.ns, Name: "c"}, UID: f.get("c").UID, Pod: held[1], Missing: false},
				}, res.Lost)
				require.Equal(t, held, f.held("c"))
				return
			}
			res = f.round(a, pool) // the unready pod's release is recorded; replacements follow
			res = f.round(a, pool)
			now := f.held("c")
			require.Len(t, now, 2)
			require.NotContains(t, now, held[0])
			require.NotContains(t, now, held[1])
			require.Empty(t, res.Lost)
		})
	}
}

// claimPoolRef is WithClaimPool's function for the test claims.
func claimPoolRef(o client.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.(*testenv.Claim).Spec.PoolRef}
}

func TestClaimMovedToAnotherPool(t *testing.T) {
	f := newFixture(t)
	p1, p2 := f.pool("p1", 2), f.pool("p2", 2)
	clk := clocktesting.NewFakeClock(time.Now())
	a := f.alloc(allocator.WithClock(clk))
	f.claim("c", "p1", 2)
	f.round(a, p1)
	old := f.held("c")
	require.Len(t, old, 2)

	f.movePool("c", "p2")
	// p2 serves it only once p1 has taken its pods back, which p1 does once
	// the claim, still there, has been missing from its listing for a
	// Quarantine (a lagging listing would show it again before that):
	// until then p2 counts them as the claim's lost pods, as a lagging pod
	// listing could lack pods of its own.
	res := f.round(a, p2)
	require.Empty(t, res.Allocated)
	require.Len(t, res.Lost, 2)
	require.Zero(t, res.Shortfall)
	res = f.round(a, p1)
	require.Empty(t, res.Released, "not before a quarantine")
	require.Empty(t, res.Idle, "its old pods are not free before they are recycled")
	require.Equal(t, old, f.held("c"), "nor out of its record")
	clk.Step(allocator.DefaultQuarantine)
	res = f.round(a, p1)
	require.Len(t, res.Released, 1)
	require.Len(t, res.Idle, 2)
	f.round(a, p2)
	now := f.held("c")
	require.Len(t, now, 2)
	for _, p := range now {
		require.Contains(t, p, "p2-")
	}
	require.Empty(t, f.snapshot(a, p1))
}

func TestClaimPoolGivesAMovedClaimsPodsBackAtOnce(t *testing.T) {
	f := newFixture(t)
	p1, p2 := f.pool("p1", 2), f.pool("p2", 2)
	a := f.alloc(allocator.WithClock(clocktesting.NewFakeClock(time.Now())), allocator.WithClaimPool(claimPoolRef))
	f.claim("c", "p1", 2)
	f.claim("d", "p1", 0)
	f.round(a, p1)
	old := f.held("c")
	require.Len(t, old, 2)

	// Moved: a live read finds it in p2, so p1 takes its pods back in
	// the next round, with no quarantine.
	f.movePool("c", "p2")
	res := f.round(a, p1)
	require.Len(t, res.Released, 1)
	require.ElementsMatch(t, old, res.Released[0].Pods)
	require.Empty(t, f.held("c"))
	f.round(a, p2)
	require.Len(t, f.held("c"), 2)

	// Detached from every pool (an empty poolRef): the same.
	f.scale("d", 1)
	f.round(a, p1)
	require.Len(t, f.held("d"), 1)
	f.movePool("d", "")
	res = f.round(a, p1)
	require.Len(t, res.Released, 1)
	require.Empty(t, f.held("d"))

	// A claim merely missing from a listing, still in the pool on the
	// server, keeps its pods for the quarantine.
	f.claim("e", "p1", 1)
	f.round(a, p1)
	held := f.held("e")
	require.Len(t, held, 1)
	in, err := world.Input(f.ctx, f.c, p1)
	require.NoError(t, err)
	in.Claims = slices.DeleteFunc(in.Claims, func(cl allocator.Claim) bool { return cl.Object.GetName() == "e" })
	res, err = a.Round(f.ctx, in)
	require.NoError(t, err)
	require.Empty(t, res.Released)
	require.Equal(t, held, f.held("e"))
	snap := f.snapshot(a, p1)
	require.Equal(t, "e", snap[held[0]], "still held")
}

func TestPoolDeletedAndRecreatedStartsEmpty(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 2)
	a := f.alloc()
	f.claim("c", "p", 2)
	f.round(a, pool)
	require.Len(t, f.snapshot(a, pool), 2)

	// The pool goes away with its pods and claims.
	f.forceDelete("c")
	require.NoError(t, f.c.DeleteAllOf(f.ctx, &corev1.Pod{}, client.InNamespace(f.ns), client.GracePeriodSeconds(0)))
	require.NoError(t, a.ForgetPool(pool))
	require.Empty(t, f.snapshot(a, pool))

	// Recreated under the same name, with pods of the same names.
	f.pool("p", 2)
	f.claim("c2", "p", 1)
	res := f.round(a, pool)
	require.Len(t, f.held("c2"), 1)
	require.Len(t, res.Idle, 1)
}

func TestSamePoolNameInTwoNamespacesIsolated(t *testing.T) {
	f1, f2 := newFixture(t), newFixture(t)
	pool1, pool2 := f1.pool("p", 2), f2.pool("p", 2)
	a := f1.alloc()
	f1.claim("c", "p", 2)
	f2.claim("c", "p", 1)
	f1.round(a, pool1)
	f2.round(a, pool2)
	require.Len(t, f1.snapshot(a, pool1), 2)
	require.Len(t, f2.snapshot(a, pool2), 1)
	require.NoError(t, a.ForgetPool(pool1))
	require.Len(t, f2.snapshot(a, pool2), 1)
}

func TestTypedAndUnstructuredClaims(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 4)
	a := f.alloc()
	f.claim("typed", "p", 1)
	u := testenv.NewUnstructuredClaim(f.ns, "untyped", "p", 2)
	require.NoError(t, f.c.Create(f.ctx, u))

	in, err := world.UnstructuredInput(f.ctx, f.c, pool)
	require.NoError(t, err)
	_, err = a.Round(f.ctx, in)
	require.NoError(t, err)
	require.Len(t, f.held("typed"), 1)
	require.Len(t, f.held("untyped"), 2)
	// The same claims listed typed are recognised, not allocated again.
	res := f.round(a, pool)
	require.Empty(t, res.Allocated)
}

func TestClaimRecreatedUnderSameNameInheritsNothing(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 3)
	a := f.alloc()
	f.claim("c", "p", 2)
	f.round(a, pool)
	require.Len(t, f.held("c"), 2)

	f.forceDelete("c")
	f.claim("c", "p", 1)
	f.round(a, pool) // old claim's pods recycled (no-op) and freed
	f.round(a, pool)
	now := f.held("c")
	require.Len(t, now, 1)
	snap, err := a.Store().Snapshot(pool)
	require.NoError(t, err)
	require.Len(t, snap, 1)
	for _, h := range snap {
		require.Equal(t, f.get("c").UID, h.UID)
	}
}

func TestRecoveryRebuildsExactly(t *testing.T) {
	for _, keys := range []syncer.Keys{syncer.DefaultKeys(), syncer.OpenSandboxKeys()} {
		t.Run(keys.Finalizer, func(t *testing.T) {
			f := newFixture(t)
			f.keys = keys
			pool := f.pool("p", 6)
			a := f.alloc(allocator.WithKeys(keys))
			f.claim("a", "p", 2)
			f.claim("b", "p", 3)
			f.round(a, pool)
			f.scale("b", 1)
			f.round(a, pool)
			before := f.snapshot(a, pool)
			require.Len(t, before, 3)

			b := f.alloc(allocator.WithKeys(keys))
			res := f.round(b, pool)
			require.Empty(t, res.Allocated)
			require.Equal(t, before, f.snapshot(b, pool))
		})
	}
}

func TestRecoveryAfterAPIServerRestart(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 3)
	a := f.alloc()
	f.claim("c", "p", 2)
	f.round(a, pool)
	before := f.snapshot(a, pool)
	require.NoError(t, env.RestartAPIServer(f.ctx))
	b := f.alloc()
	f.round(b, pool)
	require.Equal(t, before, f.snapshot(b, pool))
}

func TestOpenSandboxRecordRecovered(t *testing.T) {
	// A claim written by OpenSandbox's controller: its exact annotations,
	// and no pod marks.
	setup := func(t *testing.T) (*fixture, types.NamespacedName) {
		f := newFixture(t)
		f.keys = syncer.OpenSandboxKeys()
		pool := f.pool("p", 3)
		c := testenv.NewClaim(f.ns, "sbx", "p", 1)
		c.Annotations = map[string]string{
			"sandbox.opensandbox.io/alloc-status":   `{"pods":["p-0","p-2"]}`,
			"sandbox.opensandbox.io/alloc-released": `{"pods":["p-2"]}`,
		}
		c.Finalizers = []string{"pool.sandbox.opensandbox.io/pool-allocation"}
		require.NoError(t, f.c.Create(f.ctx, c))
		return f, pool
	}
	t.Run("migrate", func(t *testing.T) {
		f, pool := setup(t)
		a := f.alloc(allocator.WithKeys(syncer.OpenSandboxKeys()), allocator.WithPodMarkMigration(true))
		res := f.round(a, pool)
		require.Empty(t, res.Allocated, "it holds p-0 and wants 1")
		require.Equal(t, map[string]string{"p-0": "sbx"}, f.snapshot(a, pool))
		require.ElementsMatch(t, []string{"p-1", "p-2"}, res.Idle)
		require.Equal(t, "sbx/"+string(f.get("sbx").UID), f.marks("p")["p-0"], "migrated pods get their mark")
	})
	t.Run("without-migration-unmarked-pods-are-recycled", func(t *testing.T) {
		f, pool := setup(t)
		rec := &recordingRecycler{}
		a := f.alloc(allocator.WithKeys(syncer.OpenSandboxKeys()), allocator.WithRecycler(rec.recycle))
		res, err := world.Round(f.ctx, a, f.c, pool)
		require.NoError(t, err, "dealt with: a warning, not an error")
		warned := errors.Join(res.Warnings...)
		require.ErrorIs(t, warned, allocator.ErrUntrustedRecord)
		require.ErrorContains(t, warned, "p-0")
		require.Equal(t, []string{"p-0"}, rec.recycled(), "the pod whose owner is uncertain is recycled (I13)")
		require.Equal(t, []string{"p-0"}, f.releasedOf("sbx"), "and recorded as released")
		got := grantsTo(res, "sbx")
		require.Len(t, got, 1, "served as a claim holding nothing")
		require.NotEqual(t, "p-0", got[0], "never handed back as it was")
		f.round(a, pool)
		require.NotContains(t, f.marks("p"), "p-0", "unmarked once released")
	})
}

func TestRecoveryRefusesPodListedByTwoClaims(t *testing.T) {
	setup := func(t *testing.T) (*fixture, types.NamespacedName) {
		f := newFixture(t)
		pool := f.pool("p", 3)
		for _, n := range []string{"x", "y"} {
			f.claim(n, "p", 1)
			f.setAnnotation(n, f.keys.Allocated, `{"pods":["p-0"]}`)
		}
		return f, pool
	}
	t.Run("without-marks-the-pool-is-blocked", func(t *testing.T) {
		f, pool := setup(t)
		a := f.alloc(allocator.WithPodMarks(false))
		_, err := world.Round(f.ctx, a, f.c, pool)
		require.ErrorIs(t, err, allocator.ErrPoolBlocked)
		require.ErrorContains(t, err, "p-0")
		require.Empty(t, f.snapshot(a, pool))
	})
	t.Run("with-marks-the-pod-is-recycled-first", func(t *testing.T) {
		// Neither record is backed by a mark: whoever uses p-0 is
		// uncertain, so it is recycled before anyone gets it again, and
		// the pool goes on.
		f, pool := setup(t)
		rec := &recordingRecycler{}
		a := f.alloc(allocator.WithRecycler(rec.recycle))
		for range 3 {
			_, err := world.Round(f.ctx, a, f.c, pool)
			require.NotErrorIs(t, err, allocator.ErrPoolBlocked)
		}
		require.Equal(t, []string{"p-0"}, rec.recycled())
		x, y := f.held("x"), f.held("y")
		require.Len(t, x, 1)
		require.Len(t, y, 1)
		require.NotEqual(t, x, y)
	})
}

// releasedOf returns the pods claim name's record lists as released.
func (f *fixture) releasedOf(name string) []string {
	f.t.Helper()
	s := mustSyncer(f.t, f)
	rec, err := s.Read(f.get(name))
	require.NoError(f.t, err)
	return rec.Released
}

func TestStaleClaimListingNeverDoubleAllocates(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 4)
	a := f.alloc()
	f.claim("c", "p", 2)
	stale, err := world.Input(f.ctx, f.c, pool) // before any allocation
	require.NoError(t, err)
	f.round(a, pool)
	held := f.held("c")

	// A lagging cache shows the claim as it was before our write.
	for range 3 {
		res, err := a.Round(f.ctx, stale)
		require.NoError(t, err)
		require.Empty(t, res.Allocated)
	}
	require.Equal(t, held, f.held("c"))
	require.Len(t, f.snapshot(a, pool), 2)

	// The owner scales up; the lagging cache still shows the old claim:
	// nothing happens on its strength. Once the listing catches up, the
	// claim gets exactly one more pod.
	f.scale("c", 3)
	res, err := a.Round(f.ctx, stale)
	require.NoError(t, err)
	require.Empty(t, res.Allocated)
	f.round(a, pool)
	now := f.held("c")
	require.Len(t, now, 3)
	require.Subset(t, now, held)
}

func TestWriteOfUnknownOutcomeKeepsMemoryAndServerAgreed(t *testing.T) {
	for _, applied := range []bool{false, true} {
		t.Run(map[bool]string{false: "not-applied", true: "applied"}[applied], func(t *testing.T) {
			f := newFixture(t)
			pool := f.pool("p", 2)
			var fail atomic.Bool
			fail.Store(true)
			base, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
			require.NoError(t, err)
			c := interceptor.NewClient(base, interceptor.Funcs{
				Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					if _, isClaim := obj.(*testenv.Claim); !isClaim || !fail.Load() {
						return cl.Patch(ctx, obj, patch, opts...)
					}
					if applied {
						if err := cl.Patch(ctx, obj, patch, opts...); err != nil {
							return err
						}
					}
					return context.DeadlineExceeded
				},
			})
			a, err := allocator.New(c)
			require.NoError(t, err)
			f.claim("c", "p", 1)
			res, err := world.Round(f.ctx, a, f.c, pool)
			if applied {
				// Read back, found, adopted.
				require.NoError(t, err)
				require.Len(t, res.Allocated, 1)
			} else {
				require.ErrorIs(t, err, allocator.ErrWrite)
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.Empty(t, res.Allocated)
			}
			require.ElementsMatch(t, f.held("c"), mapKeys(f.snapshot(a, pool)), "store equals records")
			fail.Store(false)
			f.round(a, pool)
			require.Len(t, f.held("c"), 1)
			require.Equal(t, f.held("c"), mapKeys(f.snapshot(a, pool)))
		})
	}
}

func TestConcurrentRoundsOnOnePoolNeverShareAPod(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 6)
	a := f.alloc()
	for _, n := range []string{"a", "b", "c", "d"} {
		f.claim(n, "p", 2)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			if _, err := world.Round(f.ctx, a, f.c, pool); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// A round may lose a race for a claim's resourceVersion; that is
		// reported and retried, never a double hand-out.
		require.True(t, errors.Is(err, allocator.ErrWrite), "unexpected error: %v", err)
	}
	f.round(a, pool)
	seen := map[string]string{}
	total := 0
	for _, n := range []string{"a", "b", "c", "d"} {
		for _, p := range f.held(n) {
			require.NotContains(t, seen, p, "pod %s held by %s and %s", p, seen[p], n)
			seen[p] = n
			total++
		}
	}
	require.Equal(t, 6, total)
}

func TestRoundsOnDifferentPoolsRunInParallel(t *testing.T) {
	f := newFixture(t)
	p1, p2 := f.pool("p1", 1), f.pool("p2", 1)
	entered := make(chan string, 2)
	proceed := make(chan struct{})
	// The recycler of p1's round waits until p2's round has run: if rounds
	// on different pools were serialized, this would deadlock.
	recycler := func(_ context.Context, req allocator.RecycleRequest) (bool, error) {
		pool := req.Pool
		entered <- pool.Name
		if pool.Name == "p1" {
			<-proceed
		}
		return true, nil
	}
	a := f.alloc(allocator.WithRecycler(recycler))
	f.claim("c1", "p1", 1)
	f.claim("c2", "p2", 1)
	f.round(a, p1)
	f.round(a, p2)
	f.scale("c1", 0)
	f.scale("c2", 0)
	var wg sync.WaitGroup
	wg.Go(func() { f.round(a, p1) })
	require.Equal(t, "p1", <-entered)
	f.round(a, p2) // completes while p1's round is blocked
	require.Equal(t, "p2", <-entered)
	close(proceed)
	wg.Wait()
}

func objMeta(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }

func TestStaleReleaseEntryDoesNotReleaseAPodHandedBack(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 1)
	a := f.alloc()
	f.claim("c", "p", 1)
	f.round(a, pool)
	f.release("c", "p-0")
	f.round(a, pool) // recycled, released, and — the only pod — handed back
	res := f.round(a, pool)
	require.Equal(t, []string{"p-0"}, f.held("c"))
	// The owner still lists p-0 in release; it must not flap.
	for range 3 {
		res = f.round(a, pool)
		require.Empty(t, res.Released)
		require.Empty(t, res.Allocated)
		require.Equal(t, []string{"p-0"}, f.held("c"))
	}
}

func TestMalformedReleaseRefusedForThatClaimOnly(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 3)
	a := f.alloc()
	f.claim("bad", "p", 1)
	f.round(a, pool)
	held := f.held("bad")
	require.Len(t, held, 1)
	f.setAnnotation("bad", f.keys.Release, `not json`)
	f.claim("good", "p", 1)

	res, err := world.Round(f.ctx, a, f.c, pool)
	require.NoError(t, err, "refused for that claim alone: a warning, not an error")
	warned := errors.Join(res.Warnings...)
	require.ErrorIs(t, warned, allocator.ErrInvalidRelease)
	require.ErrorIs(t, warned, syncer.ErrMalformedRelease)
	var ce *allocator.ClaimError
	require.ErrorAs(t, warned, &ce)
	require.Equal(t, "bad", ce.Claim.Name)
	require.Len(t, grantsTo(res, "good"), 1, "the pool goes on")
	require.Equal(t, held, f.held("bad"), "the claim keeps its pods")

	f.setAnnotation("bad", f.keys.Release, `{"pods":["`+held[0]+`"]}`)
	f.round(a, pool)
	f.round(a, pool)
	require.Equal(t, []string{held[0]}, f.releasedOf("bad"), "fixed, the request is honoured")
}

func TestMalformedRecordsFailClosedPerPool(t *testing.T) {
	for _, tc := range []struct {
		name, key, value, reason string
	}{
		{"json", "allocated", `{"pods":["p1-1",`, "JSON"},
		{"shape", "allocated", `{"pods":"p1-1"}`, ""},
		{"twice", "allocated", `{"pods":["p1-1","p1-1"]}`, "listed twice"},
		{"invalid-name", "allocated", `{"pods":["Not_A_Pod"]}`, "Not_A_Pod"},
		{"released", "released", `{"pods":[1]}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			p1, p2 := f.pool("p1", 2), f.pool("p2", 1)
			a := f.alloc()
			f.claim("good", "p1", 1)
			f.round(a, p1)
			goodPods := f.held("good")
			f.claim("bad", "p1", 1)
			key := map[string]string{"allocated": f.keys.Allocated, "released": f.keys.Released, "release": f.keys.Release}[tc.key]
			f.setAnnotation("bad", key, tc.value)
			f.claim("other", "p2", 1)

			res, err := world.Round(f.ctx, a, f.c, p1)
			require.ErrorIs(t, err, allocator.ErrPoolBlocked)
			require.ErrorIs(t, err, syncer.ErrMalformedRecord)
			var ce *allocator.ClaimError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, "bad", ce.Claim.Name)
			require.ErrorContains(t, err, key)
			require.ErrorContains(t, err, tc.reason)
			require.Empty(t, res.Allocated)
			require.Equal(t, goodPods, f.held("good"), "nothing held is released on a guess")
			require.Equal(t, tc.value, f.get("bad").Annotations[key], "the record is left for its owner to fix")

			f.round(a, p2)
			require.Len(t, f.held("other"), 1, "other pools are served")

			// Fixed by its owner, the pool is served again.
			f.setAnnotation("bad", key, `{"pods":[]}`)
			f.round(a, p1)
			require.Len(t, f.held("bad"), 1)
		})
	}
}

// TestSameSecondClaimsServedInArrivalOrder creates zzz, then aaa, within
// one second (creation timestamps keep seconds only) on a pool of one pod:
// zzz arrived first and is served, whether both are first seen in one
// listing or zzz in an earlier round.
func TestSameSecondClaimsServedInArrivalOrder(t *testing.T) {
	for _, apart := range []bool{false, true} {
		t.Run(map[bool]string{false: "one listing", true: "two rounds"}[apart], func(t *testing.T) {
			f := newFixture(t)
			a := f.alloc()
			pool := types.NamespacedName{Namespace: f.ns, Name: "p"}
			// Retry until the two creations fall in one second.
			for try := 0; ; try++ {
				first := f.claim("zzz", "p", 1)
				if apart {
					f.round(a, pool) // zzz seen first, in a pool with no pods
				}
				second := f.claim("aaa", "p", 1)
				if first.CreationTimestamp.Equal(&second.CreationTimestamp) {
					break
				}
				require.Less(t, try, 10, "no two creations in one second")
				for _, cl := range []*testenv.Claim{first, second} {
					require.NoError(t, f.c.Delete(f.ctx, cl))
				}
				require.Eventually(t, func() bool { return f.gone("zzz") && f.gone("aaa") }, 10*time.Second, 50*time.Millisecond)
				a = f.alloc()
			}
			_, err := testenv.CreatePods(f.ctx, f.c, f.ns, "p", 1, true)
			require.NoError(t, err)
			res := f.round(a, pool)
			require.Len(t, res.Allocated, 1)
			require.Equal(t, "zzz", res.Allocated[0].Claim.Name, "the claim created first is served first")
			require.Equal(t, 1, res.Shortfall)
		})
	}
}

// TestRecyclerGetsThePodAsListed checks RecycleRequest: the pool, the pod
// (name, UID, resourceVersion and the object the round's input listed) and
// the claim it is given back by; Object is nil on an Update that leaves the
// pod out.
func TestRecyclerGetsThePodAsListed(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 2)
	var mu sync.Mutex
	var reqs []allocator.RecycleRequest
	a := f.alloc(allocator.WithRecycler(func(_ context.Context, req allocator.RecycleRequest) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		reqs = append(reqs, req)
		return len(reqs) == 3, nil // done on the third call
	}))
	cl := f.claim("c", "p", 1)
	f.round(a, pool)
	held := f.held("c")
	require.Len(t, held, 1)

	f.release("c", held[0])
	f.scale("c", 0)
	f.round(a, pool) // recycling starts in this round
	f.round(a, pool) // and goes on
	require.Len(t, reqs, 2)
	for i, req := range reqs {
		require.Equal(t, pool, req.Pool, "call %d", i)
		require.Equal(t, held[0], req.Pod, "call %d", i)
		require.Equal(t, types.NamespacedName{Namespace: f.ns, Name: "c"}, req.Claim.Claim, "call %d", i)
		require.Equal(t, cl.UID, req.Claim.UID, "call %d", i)
		require.NotNil(t, req.Object, "call %d: the pod as listed", i)
		require.Equal(t, held[0], req.Object.Name, "call %d", i)
		require.Equal(t, req.UID, req.Object.UID, "call %d", i)
		require.NotEmpty(t, req.Object.Spec.Containers, "call %d: the whole object", i)
	}

	// An Update that does not list the pod: no object to give.
	_, err := a.Update(f.ctx, allocator.Changes{Pool: pool})
	require.NoError(t, err)
	require.Len(t, reqs, 3)
	require.Nil(t, reqs[2].Object)
	require.Equal(t, held[0], reqs[2].Pod)
	require.Empty(t, f.held("c"), "recycled and released")
}

// TestRecordReadsAsTheAllocatorDoes reads claims' records through the
// allocator, with its keys: OpenSandbox's annotations here.
func TestRecordReadsAsTheAllocatorDoes(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 3)
	a := f.alloc(allocator.WithKeys(syncer.OpenSandboxKeys()))
	f.claim("c", "p", 2)
	res := f.round(a, pool)
	rec, err := a.Record(f.get("c"))
	require.NoError(t, err)
	want := slices.Clone(grantsTo(res, "c"))
	slices.Sort(want)
	got := rec.Held()
	slices.Sort(got)
	require.Equal(t, want, got)
	require.Contains(t, f.get("c").Annotations, syncer.OpenSandboxKeys().Allocated)

	bad := f.get("c")
	bad.Annotations[syncer.OpenSandboxKeys().Allocated] = "not json"
	_, err = a.Record(bad)
	require.ErrorIs(t, err, syncer.ErrMalformedRecord)
	_, err = a.Record(nil)
	require.Error(t, err)
}
