package allocator_test

// Plain regression tests for bugs the property machines found while pod
// marks became the fence (issue 9). Each names the bug it pins.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

// A claim force-deleted while it held several pods: after a restart every
// one of its marked pods is held by the orphan and recycled, not only the
// first one met (the others were taken for hand-outs still in flight).
func TestRegressionOrphanPodsAllHeldAfterRestart(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	_, err := testenv.CreatePods(ctx, c, "ns", "p", 4, true)
	require.NoError(t, err)
	keep := testenv.NewClaim("ns", "keep", "p", 0)
	gone := testenv.NewClaim("ns", "gone", "p", 3)
	keep.UID, gone.UID = "uid-keep", "uid-gone"
	require.NoError(t, c.Create(ctx, keep))
	require.NoError(t, c.Create(ctx, gone))
	a, err := allocator.New(c)
	require.NoError(t, err)
	res, err := world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Len(t, res.Allocated, 1)
	require.Len(t, res.Allocated[0].Pods, 3)
	handed := res.Allocated[0].Pods

	// Force-delete it while no allocator runs.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(gone), gone))
	gone.Finalizers = nil
	require.NoError(t, c.Update(ctx, gone))
	require.NoError(t, c.Delete(ctx, gone))

	rec := &recordingRecycler{}
	b, err := allocator.New(c, allocator.WithRecycler(rec.recycle))
	require.NoError(t, err)
	res, err = world.Round(ctx, b, c, pool)
	require.NoError(t, err)
	for _, uid := range rec.claimUIDs() {
		require.Equal(t, types.UID("uid-gone"), uid, "recycled for the orphan")
	}
	require.ElementsMatch(t, handed, rec.recycled(), "every pod of the orphan is recycled in the first round")
	require.NoError(t, allocator.CheckInvariants(b))
	res, err = world.Round(ctx, b, c, pool)
	require.NoError(t, err)
	require.Len(t, res.Idle, 4, "and free after its marks are gone")
}

// A claim's write of unknown outcome that landed, then a round on a listing
// from before the claim existed: the claim looks gone, and the write that
// gives its held pod back (based on a live read) must keep the pods the
// landed write added, not drop them unreleased.
func TestRegressionLiveBasedWriteKeepsReservedPods(t *testing.T) {
	ctx := context.Background()
	var failNext, failGet atomic.Bool
	c := newFakeClient(t, &interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, claim := obj.(*testenv.Claim); claim && failNext.CompareAndSwap(true, false) {
				if err := c.Patch(ctx, obj, patch, opts...); err != nil {
					return err
				}
				failGet.Store(true) // and the read-back fails: the outcome stays unknown
				return apierrors.NewTimeoutError("injected: landed, then timed out", 1)
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, claim := obj.(*testenv.Claim); claim && failGet.CompareAndSwap(true, false) {
				return apierrors.NewTimeoutError("injected read timeout", 1)
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	_, err := testenv.CreatePods(ctx, c, "ns", "p", 3, true)
	require.NoError(t, err)
	stale, err := world.Input(ctx, c, pool) // before the claim exists
	require.NoError(t, err)
	cl := testenv.NewClaim("ns", "c", "p", 1)
	cl.UID = "uid-c"
	require.NoError(t, c.Create(ctx, cl))
	a, err := allocator.New(c, allocator.WithClock(clocktesting.NewFakeClock(time.Now())))
	require.NoError(t, err)
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Spec.Replicas = 3
	require.NoError(t, c.Update(ctx, cl))
	failNext.Store(true)
	_, err = world.Round(ctx, a, c, pool)
	require.ErrorIs(t, err, allocator.ErrWrite)
	before := recordOn(t, c, "c")
	require.Len(t, before.Held(), 3, "the write landed")

	_, _ = a.Round(ctx, stale)
	require.NoError(t, allocator.CheckInvariants(a))
	after := recordOn(t, c, "c")
	for _, p := range before.Held() {
		if !slices.Contains(after.Held(), p) {
			require.Contains(t, after.Released, p, "pod %s left the record without being released", p)
		}
	}
}

// recordOn reads claim name's record (default keys) from the server.
func recordOn(t *testing.T, c client.Client, name string) syncer.Record {
	t.Helper()
	var cl testenv.Claim
	require.NoError(t, c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, &cl))
	s, err := syncer.NewAnnotationSyncer(c, syncer.DefaultKeys())
	require.NoError(t, err)
	rec, err := s.Read(&cl)
	require.NoError(t, err)
	return rec
}

// A pool whose only claim was force-deleted while no allocator ran is
// listed with no claims: the allocator cannot learn the claim type from the
// listing to confirm the claim is gone. With WithClaimType it can, and the
// orphan's pod is recycled; without it the pod stays out of the pool and
// the round says why (the liveness check of the many-allocator machine).
func TestRegressionOrphanInPoolWithoutClaims(t *testing.T) {
	for _, withType := range []bool{true, false} {
		t.Run(map[bool]string{true: "with-claim-type", false: "without"}[withType], func(t *testing.T) {
			ctx := context.Background()
			c := newFakeClient(t, nil)
			pool := types.NamespacedName{Namespace: "ns", Name: "p"}
			_, err := testenv.CreatePods(ctx, c, "ns", "p", 2, true)
			require.NoError(t, err)
			cl := testenv.NewClaim("ns", "c", "p", 1)
			cl.UID = "uid-c"
			require.NoError(t, c.Create(ctx, cl))
			a, err := allocator.New(c)
			require.NoError(t, err)
			_, err = world.Round(ctx, a, c, pool)
			require.NoError(t, err)
			require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
			cl.Finalizers = nil
			require.NoError(t, c.Update(ctx, cl))
			require.NoError(t, c.Delete(ctx, cl))

			clk := clocktesting.NewFakeClock(time.Now())
			opts := []allocator.Option{allocator.WithClock(clk)}
			if withType {
				opts = append(opts, allocator.WithClaimType(&testenv.Claim{}))
			}
			b, err := allocator.New(c, opts...)
			require.NoError(t, err)
			var res allocator.Result
			for range 2 {
				res, err = world.Round(ctx, b, c, pool)
				clk.Step(allocator.DefaultQuarantine) // no claim listed may lag that long
			}
			if withType {
				require.NoError(t, err)
				require.Len(t, res.Idle, 2, "the orphan's pod is recycled and free")
				return
			}
			require.Error(t, err)
			require.ErrorContains(t, err, "type is unknown")
			require.Len(t, res.Idle, 1, "the orphan's pod stays out of the pool")
		})
	}
}

// A pod being settled for a claim (marked for it, not in its record) whose
// mark another allocator removes meanwhile is free again: it must not stay
// out of the pool for good (the many-allocator machine's liveness check).
func TestRegressionSettlingPodFreedWhenItsMarkGoes(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	pods, err := testenv.CreatePods(ctx, c, "ns", "p", 1, true)
	require.NoError(t, err)
	cl := testenv.NewClaim("ns", "c", "p", 0)
	cl.UID = "uid-c"
	require.NoError(t, c.Create(ctx, cl))
	// Another allocator marked p-0 for c, then c changed: its record, newer
	// than the mark, does not list the pod.
	pod := &pods[0]
	markPod(t, c, pod, "c/uid-c")
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Spec.Replicas = 1
	require.NoError(t, c.Update(ctx, cl))

	a, err := allocator.New(c, allocator.WithRecycler(func(context.Context, allocator.RecycleRequest) (bool, error) {
		return false, nil // not yet
	}))
	require.NoError(t, err)
	res, err := world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Empty(t, res.Allocated, "the pod is settled for c, not handed out as it is")
	require.Equal(t, 1, res.Shortfall)

	// The other allocator finishes first and removes the mark.
	markPod(t, c, pod, "")
	res, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.NoError(t, allocator.CheckInvariants(a))
	require.Equal(t, []string{"p-0"}, grantsTo(res, "c"), "free again, and handed out")
}

// A listing that lags a live read of a pod must not make the allocator
// forget the pod's mark: a write would then drop the held pod from its
// claim's record (the many-allocator machine's I11 check).
func TestRegressionStalePodListingDoesNotUndoALiveRead(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	_, err := testenv.CreatePods(ctx, c, "ns", "p", 2, true)
	require.NoError(t, err)
	staleIn, err := world.Input(ctx, c, pool) // pods unmarked
	require.NoError(t, err)
	cl := testenv.NewClaim("ns", "c", "p", 1)
	cl.UID = "uid-c"
	require.NoError(t, c.Create(ctx, cl))
	other, err := allocator.New(c)
	require.NoError(t, err)
	_, err = world.Round(ctx, other, c, pool) // marks a pod for c, writes c's record
	require.NoError(t, err)
	held := recordOn(t, c, "c").Held()
	require.Len(t, held, 1)

	// A second allocator: its pod listing lags (pods unmarked), its claim
	// listing does not. It reads the pod live to settle that, then gets the
	// stale pod listing again while c wants a second pod.
	a, err := allocator.New(c)
	require.NoError(t, err)
	fresh, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	in := allocator.Input{Pool: pool, Pods: staleIn.Pods, Claims: fresh.Claims}
	_, err = a.Round(ctx, in)
	require.NoError(t, err)
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Spec.Replicas = 2
	require.NoError(t, c.Update(ctx, cl))
	fresh, err = world.Input(ctx, c, pool)
	require.NoError(t, err)
	in = allocator.Input{Pool: pool, Pods: staleIn.Pods, Claims: fresh.Claims}
	_, _ = a.Round(ctx, in)
	require.Subset(t, recordOn(t, c, "c").Held(), held, "the held pod stays in the record")
}

// recordingRecycler records the pods it is asked to recycle, and for which
// claims, and reports them done. It is safe for concurrent use, as a
// Recycler must be.
type recordingRecycler struct {
	mu     sync.Mutex
	pods   []string
	claims []types.UID
}

func (r *recordingRecycler) recycle(_ context.Context, req allocator.RecycleRequest) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pods = append(r.pods, req.Pod)
	r.claims = append(r.claims, req.Claim.UID)
	return true, nil
}

func (r *recordingRecycler) recycled() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.pods)
}

func (r *recordingRecycler) claimUIDs() []types.UID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.claims)
}

// markPod sets (or, with "", removes) pod's mark annotation.
func markPod(t *testing.T, c client.Client, pod *corev1.Pod, mark string) {
	t.Helper()
	require.NoError(t, c.Get(context.Background(), client.ObjectKeyFromObject(pod), pod))
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	if mark == "" {
		delete(pod.Annotations, allocator.DefaultPodMarkKey)
	} else {
		pod.Annotations[allocator.DefaultPodMarkKey] = mark
	}
	require.NoError(t, c.Update(context.Background(), pod))
}

// A second allocator whose pod listing lags its claim listing (two informer
// caches) sees a record listing a pod its pod listing lacks. It must not
// write the pod out of the record the claim is using (a swap, I7): the pod
// is read live, and as it exists marked for the claim it stays held, as a
// lost pod, until a listing shows it (the many-allocator machine).
func TestRegressionLaggingPodListingKeepsHeldPod(t *testing.T) {
	ctx := context.Background()
	c, pool, _ := regressionPool(t, 3, 1)
	a, err := allocator.New(c)
	require.NoError(t, err)
	res := firstRound(t, a, c, pool)
	held := res.Allocated[0].Pods
	require.Len(t, held, 1)

	b, err := allocator.New(c)
	require.NoError(t, err)
	in, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	in.Pods = slices.DeleteFunc(in.Pods, func(p corev1.Pod) bool { return p.Name == held[0] })
	res, err = b.Round(ctx, in)
	require.NoError(t, err)
	require.Empty(t, res.Allocated, "the claim holds its pod: nothing new")
	require.Empty(t, res.Released)
	require.Equal(t, held, recordOn(t, c, "c").Held(), "the record keeps the pod the claim uses")
	require.Len(t, res.Lost, 1)
	require.Equal(t, held[0], res.Lost[0].Pod)

	// Once a listing shows the pod, it is held as usual.
	res, err = world.Round(ctx, b, c, pool)
	require.NoError(t, err)
	require.Empty(t, res.Allocated)
	require.Empty(t, res.Lost)
	require.Equal(t, held, recordOn(t, c, "c").Held())
	require.Len(t, res.Idle, 2)
}

// regressionPool sets up namespace ns with pool p of n ready pods and claim
// c (UID uid-c) wanting want, on a fake client with global
// resourceVersions.
func regressionPool(t *testing.T, n int, want int32) (client.Client, types.NamespacedName, *testenv.Claim) {
	t.Helper()
	return regressionPoolOn(t, newFakeClient(t, nil), n, want)
}

// firstRound runs a's first round on pool, which must hand out pods to one
// claim.
func firstRound(t *testing.T, a allocator.Allocator, c client.Client, pool types.NamespacedName) allocator.Result {
	t.Helper()
	res, err := world.Round(context.Background(), a, c, pool)
	require.NoError(t, err)
	require.Len(t, res.Allocated, 1)
	return res
}

// regressionPoolOn is regressionPool on the client c.
func regressionPoolOn(t *testing.T, c client.Client, n int, want int32) (client.Client, types.NamespacedName, *testenv.Claim) {
	t.Helper()
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	_, err := testenv.CreatePods(context.Background(), c, "ns", "p", n, true)
	require.NoError(t, err)
	cl := testenv.NewClaim("ns", "c", "p", want)
	cl.UID = "uid-c"
	require.NoError(t, c.Create(context.Background(), cl))
	return c, pool, cl
}

// A fresh allocator first sees a pod marked for a claim whose record (from
// a lagging claim listing) does not list it: a hand-out may be in flight,
// so the pod is reserved for the claim. A newer record that lists the pod
// released, not held, must end that reservation: counted against what the
// claim wants, it made the allocator give back another pod the claim held
// (the many-allocator machine, I7).
func TestRegressionNewerRecordEndsReservation(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 4, 2)
	// Pods unmarked, the claim without a record.
	early, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	podsEarly, claimsEarly := early, early
	a, err := allocator.New(c)
	require.NoError(t, err)
	res := firstRound(t, a, c, pool)
	first := res.Allocated[0].Pods
	podsMarked, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	// The owner releases the first pod; a new pod joins; A serves again.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Annotations["poolalloc.io/release"] = `{"pods":["` + first[0] + `"]}`
	require.NoError(t, c.Update(ctx, cl))
	for range 3 {
		res, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
	}
	want := recordOn(t, c, "c").Held()
	fresh, err := world.Input(ctx, c, pool)
	require.NoError(t, err)

	b, err := allocator.New(c)
	require.NoError(t, err)
	res, err = b.Round(ctx, allocator.Input{Pool: pool, Pods: podsMarked.Pods, Claims: claimsEarly.Claims})
	require.NoError(t, err)
	require.Empty(t, res.Allocated, "the marked pods are reserved for the claim")
	var lagging []corev1.Pod
	for _, p := range podsEarly.Pods {
		if p.Name == want[0] || p.Name == want[1] {
			if p.Name != first[1] {
				continue // the listing lags: the newer hand-out is missing
			}
		}
		lagging = append(lagging, p)
	}
	res, _ = b.Round(ctx, allocator.Input{Pool: pool, Pods: lagging, Claims: fresh.Claims})
	// The second listing's pods lag more than its claims (another cache);
	// the round may report what it read live, but hands nothing out.
	require.Empty(t, res.Allocated)
	require.Equal(t, want, recordOn(t, c, "c").Held(), "the claim keeps both pods its record lists")
}

// A claim missing from a claim listing that lags for a quarantine is taken
// for one that left the pool (the contract bounds listing lag by a
// Quarantine): its pods are given back, but recorded released only after
// the recycler finished them (docs/design.md I6). Found by the single-allocator
// machine while trying to write a moved claim's pods out of its record
// before recycling them.
func TestRegressionStaleClaimListingPastQuarantineRecyclesFirst(t *testing.T) {
	ctx := context.Background()
	c, pool, _ := regressionPool(t, 2, 1)
	stale, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	stale.Claims = nil // from before the claim existed
	var finish atomic.Bool
	clk := clocktesting.NewFakeClock(time.Now())
	a, err := allocator.New(c, allocator.WithClock(clk),
		allocator.WithRecycler(func(context.Context, allocator.RecycleRequest) (bool, error) { return finish.Load(), nil }))
	require.NoError(t, err)
	res := firstRound(t, a, c, pool)
	held := res.Allocated[0].Pods

	_, err = a.Round(ctx, stale)
	require.NoError(t, err)
	require.Equal(t, held, recordOn(t, c, "c").Held(), "missing for less than a quarantine: nothing given back")
	clk.Step(allocator.DefaultQuarantine)
	res, err = a.Round(ctx, stale)
	require.NoError(t, err)
	require.Equal(t, held, res.Recycling, "given back through the recycler")
	rec := recordOn(t, c, "c")
	require.Equal(t, held, rec.Held(), "not recorded released while the recycler holds it")
	require.Empty(t, rec.Released)

	finish.Store(true)
	_, err = a.Round(ctx, stale)
	require.NoError(t, err)
	rec = recordOn(t, c, "c")
	require.Empty(t, rec.Held())
	require.Equal(t, held, rec.Released, "recorded released once recycled")
}

// A pod a claim holds drops out of one listing (lost) and then shows up in
// a lagging one at a version from before its mark. The allocator must not
// take that older version for news: it read as an unmarked pod held by a
// record, which was recycled and written out of the claim's record (the
// many-allocator machine, I7).
func TestRegressionOlderPodVersionAfterAbsence(t *testing.T) {
	ctx := context.Background()
	c, pool, _ := regressionPool(t, 2, 1)
	before, err := world.Input(ctx, c, pool) // pods unmarked
	require.NoError(t, err)
	a, err := allocator.New(c)
	require.NoError(t, err)
	res := firstRound(t, a, c, pool)
	held := res.Allocated[0].Pods

	b, err := allocator.New(c)
	require.NoError(t, err)
	fresh, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	_, err = b.Round(ctx, fresh)
	require.NoError(t, err)
	without := fresh
	without.Pods = slices.DeleteFunc(slices.Clone(fresh.Pods), func(p corev1.Pod) bool { return p.Name == held[0] })
	res, err = b.Round(ctx, without)
	require.NoError(t, err)
	require.Len(t, res.Lost, 1)
	res, err = b.Round(ctx, allocator.Input{Pool: pool, Pods: before.Pods, Claims: fresh.Claims})
	require.NoError(t, err)
	require.Empty(t, res.Recycling)
	require.Empty(t, res.Released)
	require.Empty(t, res.Allocated)
	require.Equal(t, held, recordOn(t, c, "c").Held())
	var pod corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: held[0]}, &pod))
	require.Equal(t, "c/uid-c", pod.Annotations[allocator.DefaultPodMarkKey], "its mark stays")
}

// The same claim gets a pod back after releasing it: the pod carries the
// same mark value again at a newer version. An allocator that last saw the
// first mark must not take the second for the first: a record that
// released the pod (older than the new mark) would justify removing the
// mark of the live hand-out (the many-allocator machine, I11).
func TestRegressionSameMarkAgainIsNewer(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 1, 1)
	a, err := allocator.New(c)
	require.NoError(t, err)
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	first, err := world.Input(ctx, c, pool) // p-0 marked for c, held
	require.NoError(t, err)
	b, err := allocator.New(c)
	require.NoError(t, err)
	_, err = b.Round(ctx, first)
	require.NoError(t, err)

	// The owner releases p-0; a recycles it, records it released, unmarks
	// it; the claim then gets it back (the pool's only pod).
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Annotations[syncer.DefaultKeys().Release] = `{"pods":["p-0"]}`
	require.NoError(t, c.Update(ctx, cl))
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	released, err := world.Input(ctx, c, pool) // the record with p-0 released
	require.NoError(t, err)
	require.Empty(t, recordOn(t, c, "c").Held())
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	delete(cl.Annotations, syncer.DefaultKeys().Release)
	require.NoError(t, c.Update(ctx, cl))
	res, err := world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Len(t, res.Allocated, 1, "p-0 handed to c again")
	again, err := world.Input(ctx, c, pool)
	require.NoError(t, err)

	// b: the pod as it is now (the same mark, newer), the claim as it was
	// when its record released the pod.
	_, err = b.Round(ctx, allocator.Input{Pool: pool, Pods: again.Pods, Claims: released.Claims})
	require.NoError(t, err)
	var pod corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p-0"}, &pod))
	require.Equal(t, "c/uid-c", pod.Annotations[allocator.DefaultPodMarkKey], "the live hand-out keeps its mark")
	require.Equal(t, []string{"p-0"}, recordOn(t, c, "c").Held())
}

// An allocator gives back the pods of a claim missing from its claim
// listing and writes the claim's record from a live read. A pod that
// record lists, known to the allocator only at an older version without a
// mark, is read live before the write: it is marked for the claim, so the
// write keeps it (the many-allocator machine, I7).
func TestRegressionWriteKeepsPodKnownOnlyOlder(t *testing.T) {
	ctx := context.Background()
	c, pool, _ := regressionPool(t, 2, 2)
	before, err := world.Input(ctx, c, pool) // pods unmarked
	require.NoError(t, err)
	a, err := allocator.New(c)
	require.NoError(t, err)
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Equal(t, []string{"p-0", "p-1"}, recordOn(t, c, "c").Held())
	fresh, err := world.Input(ctx, c, pool)
	require.NoError(t, err)

	// b's listings: p-0 as it is, p-1 from before its mark, no claims.
	var pods []corev1.Pod
	for i, p := range fresh.Pods {
		if p.Name == "p-1" {
			p = before.Pods[i]
		}
		pods = append(pods, p)
	}
	in := allocator.Input{Pool: pool, Pods: pods}
	clk := clocktesting.NewFakeClock(time.Now())
	b, err := allocator.New(c, allocator.WithClock(clk), allocator.WithClaimType(&testenv.Claim{}))
	require.NoError(t, err)
	_, err = b.Round(ctx, in)
	require.NoError(t, err)
	clk.Step(allocator.DefaultQuarantine)
	for range 2 {
		_, err = b.Round(ctx, in)
		require.NoError(t, err)
	}
	rec := recordOn(t, c, "c")
	require.Equal(t, []string{"p-0"}, rec.Released, "p-0, known marked for the missing claim, is given back")
	require.Equal(t, []string{"p-1"}, rec.Held(), "p-1, marked for it since, stays")
}

// An owner writes a malformed release list on its claim, which holds a
// pod; then the claim wants one more. The write that serves it must keep
// the pod the record lists: a write whose base record had a malformed
// release list used to keep none of the held pods.
func TestRegressionMalformedReleaseKeepsHeldPods(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 3, 1)
	a, err := allocator.New(c)
	require.NoError(t, err)
	res := firstRound(t, a, c, pool)
	held := res.Allocated[0].Pods

	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Annotations[syncer.DefaultKeys().Release] = `{"pods":[`
	cl.Spec.Replicas = 2
	require.NoError(t, c.Update(ctx, cl))
	res, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.ErrorIs(t, errors.Join(res.Warnings...), allocator.ErrInvalidRelease)
	require.Len(t, res.Allocated, 1)
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	s, err := syncer.NewAnnotationSyncer(c, syncer.DefaultKeys())
	require.NoError(t, err)
	rec, err := s.Read(cl)
	require.ErrorIs(t, err, syncer.ErrMalformedRelease, "the owner's list is left as the owner wrote it")
	now := rec.Held()
	require.Len(t, now, 2)
	require.Contains(t, now, held[0], "the pod it held stays in its record")
}

// A pod marked for a claim after the claim's record as known (another
// allocator's hand-out, which may be in flight) is reserved for the claim.
// The reservation must never make the claim give back a pod it holds: the
// hand-out may never land (the many-allocator machine, I7).
func TestRegressionReservationKeepsHeldPod(t *testing.T) {
	ctx := context.Background()
	c, pool, _ := regressionPool(t, 3, 1)
	a, err := allocator.New(c)
	require.NoError(t, err)
	res := firstRound(t, a, c, pool)
	held := res.Allocated[0].Pods[0]
	other := "p-1"
	if held == other {
		other = "p-2"
	}
	// Another allocator marks a second pod for the claim and has not
	// written the record yet.
	var pod corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: other}, &pod))
	pod.Annotations = map[string]string{allocator.DefaultPodMarkKey: "c/uid-c"}
	require.NoError(t, c.Update(ctx, &pod))

	res, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Empty(t, res.Released, "no pod the claim holds is given back for a reservation")
	require.Equal(t, []string{held}, recordOn(t, c, "c").Held())
	require.NoError(t, allocator.CheckInvariants(a))
}

// An allocator believes a claim holds a pod; another allocator has since
// recycled it for the claim, recorded it released, unmarked it and given
// the claim another pod. A round on a listing whose pods are fresh and
// whose claims lag sees the held pod unmarked: the claim is read live, and
// since its record no longer lists the pod the belief goes. Before, the
// pod was marked for the claim again and recycled, and the claim then gave
// back the pod it really held (the many-allocator machine, I7).
func TestRegressionUnmarkedByAnotherAllocatorIsNotTakenBack(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 2, 1)
	a, err := allocator.New(c)
	require.NoError(t, err)
	res := firstRound(t, a, c, pool)
	first := res.Allocated[0].Pods[0]
	stale, err := world.Input(ctx, c, pool) // the record a wrote
	require.NoError(t, err)

	// b serves the owner's release: the pod is recycled, recorded released
	// and unmarked; the claim gets the other pod.
	b, err := allocator.New(c)
	require.NoError(t, err)
	_, err = world.Round(ctx, b, c, pool)
	require.NoError(t, err)
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Annotations[syncer.DefaultKeys().Release] = `{"pods":["` + first + `"]}`
	require.NoError(t, c.Update(ctx, cl))
	for range 3 {
		_, err = world.Round(ctx, b, c, pool)
		require.NoError(t, err)
	}
	now := recordOn(t, c, "c").Held()
	require.Len(t, now, 1)
	require.NotEqual(t, first, now[0])
	fresh, err := world.Input(ctx, c, pool)
	require.NoError(t, err)

	for range 3 {
		// A write based on the lagging claim may conflict; that is fine.
		_, _ = a.Round(ctx, allocator.Input{Pool: pool, Pods: fresh.Pods, Claims: stale.Claims})
		require.NoError(t, allocator.CheckInvariants(a))
	}
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Equal(t, now, recordOn(t, c, "c").Held(), "the claim keeps the pod it holds")
	var pod corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: first}, &pod))
	require.Empty(t, pod.Annotations[allocator.DefaultPodMarkKey], "the released pod is not marked again")
}

// createPodUID creates a ready pod of pool ns/p with the given UID (the
// fake client assigns none).
func createPodUID(t *testing.T, c client.Client, name string, uid types.UID) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: uid, Labels: map[string]string{testenv.PoolLabel: "p"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: testenv.PodImage}}},
	}
	require.NoError(t, c.Create(ctx, pod))
	require.NoError(t, testenv.SetPodReady(ctx, c, pod, true))
}

func setReplicas(t *testing.T, c client.Client, cl *testenv.Claim, n int32) {
	t.Helper()
	require.NoError(t, c.Get(context.Background(), client.ObjectKeyFromObject(cl), cl))
	cl.Spec.Replicas = n
	require.NoError(t, c.Update(context.Background(), cl))
}

func withoutPod(in allocator.Input, name string) allocator.Input {
	in.Pods = slices.DeleteFunc(slices.Clone(in.Pods), func(p corev1.Pod) bool { return p.Name == name })
	return in
}

// A pod given back while the listing lacked it counts as recycled without
// a call (a pod that no longer exists needs none). When the write that
// records its release fails and the pod is listed again, it was never
// recycled: it must go through the recycler before its release is
// recorded. Before, it was remembered as recycled and released dirty (the
// many-allocator machine, I13).
func TestRegressionAbsentPodRecycledAfterFailedRelease(t *testing.T) {
	ctx := context.Background()
	var failClaim atomic.Bool
	c := newFakeClient(t, &interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, claim := obj.(*testenv.Claim); claim && failClaim.CompareAndSwap(true, false) {
				return apierrors.NewConflict(schema.GroupResource{Group: "test.poolalloc.io", Resource: "claims"}, obj.GetName(), errors.New("injected"))
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	c, pool, cl := regressionPoolOn(t, c, 1, 1)
	rec := &recordingRecycler{}
	a, err := allocator.New(c, allocator.WithRecycler(rec.recycle))
	require.NoError(t, err)
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Equal(t, []string{"p-0"}, recordOn(t, c, "c").Held())

	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Annotations[syncer.DefaultKeys().Release] = `{"pods":["p-0"]}`
	require.NoError(t, c.Update(ctx, cl))
	in, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	failClaim.Store(true)
	_, err = a.Round(ctx, withoutPod(in, "p-0")) // a listing that lacks p-0
	require.ErrorIs(t, err, allocator.ErrWrite)
	require.Empty(t, rec.recycled())
	require.Equal(t, []string{"p-0"}, recordOn(t, c, "c").Held(), "the release was not recorded")

	res, err := world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.NoError(t, allocator.CheckInvariants(a))
	require.Len(t, res.Released, 1)
	require.Contains(t, recordOn(t, c, "c").Released, "p-0")
	require.Equal(t, []string{"p-0"}, rec.recycled(), "p-0 was recycled before its release was recorded")
}

// A claim the allocator knows, missing from a lagging claim listing, with
// a pod marked for it after its record (another allocator's hand-out, cut
// short before the record was written). The pod was taken as the claim's
// holding, as for a claim known only from marks: listed again unchanged,
// its record was never written with the pod, and the pod stayed marked for
// a claim whose record does not hold it (the many-allocator machine,
// liveness). It is reserved instead, then settled and handed out anew.
func TestRegressionKnownClaimMissingFromListingDoesNotHoldMarkedPod(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 2, 2)
	var p1 corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p-1"}, &p1))
	require.NoError(t, testenv.SetPodReady(ctx, c, &p1, false))
	empty, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	empty.Claims = nil // a claim listing from before the claim
	clk := clocktesting.NewFakeClock(time.Now())
	a, err := allocator.New(c, allocator.WithClock(clk))
	require.NoError(t, err)
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Equal(t, []string{"p-0"}, recordOn(t, c, "c").Held(), "p-1 is not ready")

	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(&p1), &p1))
	require.NoError(t, testenv.SetPodReady(ctx, c, &p1, true))
	p1.Annotations = map[string]string{allocator.DefaultPodMarkKey: "c/uid-c"}
	require.NoError(t, c.Update(ctx, &p1))
	fresh, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	_, _ = a.Round(ctx, allocator.Input{Pool: pool, Pods: fresh.Pods})
	require.NoError(t, allocator.CheckInvariants(a))
	_ = cl

	for range 6 {
		clk.Step(allocator.DefaultQuarantine + time.Second)
		_, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.NoError(t, allocator.CheckInvariants(a))
	}
	held := recordOn(t, c, "c").Held()
	require.ElementsMatch(t, []string{"p-0", "p-1"}, held)
	for _, name := range held {
		var pod corev1.Pod
		require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: name}, &pod))
		require.Equal(t, "c/uid-c", pod.Annotations[allocator.DefaultPodMarkKey])
	}
}

// WithReplaceLost drops from its claim's record a held pod that no longer
// exists. A listing that lacks a pod does not prove that: the listing may
// lag. Before, the pod was dropped and replaced at once (a swap, I7); now
// it is read live first and kept while it exists.
func TestRegressionReplaceLostKeepsPodMissingFromLaggingListing(t *testing.T) {
	ctx := context.Background()
	c, pool, _ := regressionPool(t, 2, 1)
	a, err := allocator.New(c, allocator.WithReplaceLost(true))
	require.NoError(t, err)
	res := firstRound(t, a, c, pool)
	held := res.Allocated[0].Pods[0]
	in, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	res, err = a.Round(ctx, withoutPod(in, held))
	require.NoError(t, err)
	require.Empty(t, res.Allocated, "no replacement for a pod that is still there")
	require.Equal(t, []string{held}, recordOn(t, c, "c").Held())
	require.NoError(t, allocator.CheckInvariants(a))

	// Once it is gone it is replaced.
	var pod corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: held}, &pod))
	require.NoError(t, c.Delete(ctx, &pod))
	res, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	now := recordOn(t, c, "c").Held()
	require.Len(t, now, 1)
	require.NotEqual(t, held, now[0])
}

// A lagging listing shows, under a held pod's name, the pod that had the
// name before it (deleted, then the name reused). It was taken for a newer
// pod under the name: the held pod looked gone, and its claim's pod lost.
// Every version of the older pod is older than the pod known, so the
// listing is ignored for that name (the many-allocator machine, liveness).
func TestRegressionOlderPodUnderNameIsNotANewOne(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	createPodUID(t, c, "p-0", "uid-old")
	stale, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	var old corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p-0"}, &old))
	require.NoError(t, c.Delete(ctx, &old))
	createPodUID(t, c, "p-0", "uid-new")
	cl := testenv.NewClaim("ns", "c", "p", 1)
	cl.UID = "uid-c"
	require.NoError(t, c.Create(ctx, cl))
	a, err := allocator.New(c)
	require.NoError(t, err)
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Equal(t, []string{"p-0"}, recordOn(t, c, "c").Held())

	fresh, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	res, err := a.Round(ctx, allocator.Input{Pool: pool, Pods: stale.Pods, Claims: fresh.Claims})
	require.NoError(t, err)
	require.Empty(t, res.Lost, "the held p-0 is not taken for gone")
	require.NoError(t, allocator.CheckInvariants(a))
	res, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Empty(t, res.Lost)
	require.Equal(t, []string{"p-0"}, recordOn(t, c, "c").Held())
}

// A free pod a lagging listing lacked, listed again at the version known,
// is free: the version known is the pod itself, not an older copy. Before,
// it stayed out of the pool for a quarantine.
func TestRegressionPodListedAgainAtSameVersionIsFree(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 2, 0)
	a, err := allocator.New(c)
	require.NoError(t, err)
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	in, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	_, err = a.Round(ctx, withoutPod(in, "p-1"))
	require.NoError(t, err)
	setReplicas(t, c, cl, 2)
	res, err := world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Zero(t, res.Shortfall)
	require.ElementsMatch(t, []string{"p-0", "p-1"}, recordOn(t, c, "c").Held())
}

// landedThenFails is a fake client whose next claim patch, once armed,
// lands and then reports a timeout, and whose read-back of it fails too:
// the write's outcome stays unknown to the allocator. Armed with conflict,
// the claim patch after that one fails with a conflict.
type landedThenFails struct {
	arm, readFail, conflict atomic.Bool
}

func (l *landedThenFails) client(t *testing.T) client.Client {
	return newFakeClient(t, &interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, claim := obj.(*testenv.Claim); claim {
				if l.arm.CompareAndSwap(true, false) {
					if err := c.Patch(ctx, obj, patch, opts...); err != nil {
						return err
					}
					l.readFail.Store(true)
					return apierrors.NewTimeoutError("injected: landed, then timed out", 1)
				}
				if l.conflict.CompareAndSwap(true, false) {
					return apierrors.NewConflict(schema.GroupResource{Group: "test.poolalloc.io", Resource: "claims"}, obj.GetName(), errors.New("injected"))
				}
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, claim := obj.(*testenv.Claim); claim && l.readFail.CompareAndSwap(true, false) {
				return apierrors.NewTimeoutError("injected read timeout", 1)
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
}

// onceRecycler finishes each pod the first time it is asked, and never
// again.
type onceRecycler struct {
	mu   sync.Mutex
	done map[string]int
}

func (o *onceRecycler) recycle(_ context.Context, req allocator.RecycleRequest) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done == nil {
		o.done = make(map[string]int)
	}
	o.done[req.Pod]++
	return o.done[req.Pod] == 1, nil
}

// A release whose write lands but reports a timeout (its read-back failing
// too) was recycled: the release the server may hold already is recorded
// by the next write, without a second recycle, which a recycler need not
// finish again. Before, the pod was to be recycled again, and with a
// recycler that did not finish, the pool's store went on holding a pod its
// claim's record had released (the single-allocator machine, I4; kept as
// testdata/rapid/TestPropertyFake/TestPropertyFake-landed-release-recycler-holds.fail).
func TestRegressionLandedReleaseIsNotRecycledAgain(t *testing.T) {
	for _, marks := range []bool{true, false} {
		t.Run(map[bool]string{true: "marks", false: "without-marks"}[marks], func(t *testing.T) {
			ctx := context.Background()
			var l landedThenFails
			c, pool, cl := regressionPoolOn(t, l.client(t), 2, 2)
			rec := &onceRecycler{}
			opts := []allocator.Option{allocator.WithRecycler(rec.recycle)}
			if !marks {
				opts = append(opts, allocator.WithPodMarks(false))
			}
			a, err := allocator.New(c, opts...)
			require.NoError(t, err)
			_, err = world.Round(ctx, a, c, pool)
			require.NoError(t, err)
			setReplicas(t, c, cl, 1)
			l.arm.Store(true)
			_, err = world.Round(ctx, a, c, pool)
			require.ErrorIs(t, err, allocator.ErrWrite)
			landed := recordOn(t, c, "c")
			require.Len(t, landed.Held(), 1, "the release landed")
			require.Len(t, landed.Released, 1)

			for range 3 {
				_, err = world.Round(ctx, a, c, pool)
				require.NoError(t, err)
				require.NoError(t, allocator.CheckInvariants(a))
			}
			held, err := a.Store().Held(pool, "uid-c")
			require.NoError(t, err)
			require.Equal(t, landed.Held(), held, "the store holds what the record holds")
			require.Equal(t, landed.Held(), recordOn(t, c, "c").Held())
		})
	}
}

// A claim's owner released two of its pods and the release write landed
// with an unknown outcome; one of those pods then began terminating, which
// re-dated its unchanged mark past the record that released it. The next
// round reserves that pod for the claim (a hand-out giving it back may be
// in flight), so it counts against the claim's demand, but it can never
// serve: it was left out of the shortfall too, and the pool was told to
// create one pod fewer than the claim lacks (the single-allocator machine,
// I3).
func TestRegressionTerminatingReservedPodStaysInTheShortfall(t *testing.T) {
	ctx := context.Background()
	var l landedThenFails
	c, pool, cl := regressionPoolOn(t, l.client(t), 3, 4)
	rec := &onceRecycler{}
	a, err := allocator.New(c, allocator.WithRecycler(rec.recycle))
	require.NoError(t, err)
	res, err := world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Equal(t, 1, res.Shortfall, "three pods for a claim of four")

	// The pod to terminate holds a finalizer, so that deleting it leaves
	// it listed, terminating, at a newer version.
	var p2 corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p-2"}, &p2))
	p2.Finalizers = append(p2.Finalizers, "test.poolalloc.io/hold")
	require.NoError(t, c.Update(ctx, &p2))
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	v, err := syncer.EncodePods([]string{"p-0", "p-2"})
	require.NoError(t, err)
	cl.Annotations[syncer.DefaultKeys().Release] = v
	require.NoError(t, c.Update(ctx, cl))
	l.arm.Store(true)
	_, err = world.Round(ctx, a, c, pool)
	require.ErrorIs(t, err, allocator.ErrWrite)
	require.Equal(t, []string{"p-1"}, recordOn(t, c, "c").Held(), "the release landed")
	require.NoError(t, c.Delete(ctx, &p2))

	res, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.NoError(t, allocator.CheckInvariants(a))
	held, err := a.Store().Held(pool, "uid-c")
	require.NoError(t, err)
	require.Equal(t, []string{"p-1"}, held)
	require.Equal(t, 4-len(held), res.Shortfall, "the shortfall is all the claim lacks: the terminating pod reserved for it never serves")
	require.Equal(t, map[string]int{"": 4 - len(held)}, res.ShortfallByClass)
}

// Without pod marks the next write of a claim is made from what the
// allocator holds. A terminating claim's release write landed with an
// unknown outcome, then a write based on a stale listing conflicted: its
// pods were then to be recycled again, and the next write, made from
// memory, listed a released pod as held again and put the finalizer back
// on the terminating claim (the single-allocator machine, I8; kept as
// testdata/rapid/TestPropertyFake/TestPropertyFake-nomarks-conflict-after-landed-release.fail).
func TestRegressionNoMarksConflictAfterLandedRelease(t *testing.T) {
	ctx := context.Background()
	var l landedThenFails
	c := l.client(t)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	_, err := testenv.CreatePods(ctx, c, "ns", "p", 2, true)
	require.NoError(t, err)
	cl := testenv.NewClaim("ns", "c", "p", 2)
	cl.UID = "uid-c"
	cl.Finalizers = []string{"test.poolalloc.io/keep"}
	require.NoError(t, c.Create(ctx, cl))
	rec := &onceRecycler{}
	a, err := allocator.New(c, allocator.WithPodMarks(false), allocator.WithRecycler(rec.recycle))
	require.NoError(t, err)
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	var p0 corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p-0"}, &p0))
	require.NoError(t, c.Delete(ctx, &p0)) // one pod gone: it needs no recycling
	require.NoError(t, c.Delete(ctx, cl))
	stale, err := world.Input(ctx, c, pool) // terminating, holding both
	require.NoError(t, err)
	l.arm.Store(true)
	_, err = world.Round(ctx, a, c, pool)
	require.ErrorIs(t, err, allocator.ErrWrite)
	require.Empty(t, recordOn(t, c, "c").Held(), "the release landed")

	l.conflict.Store(true)
	_, _ = a.Round(ctx, stale)
	for range 2 {
		_, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.NoError(t, allocator.CheckInvariants(a))
		got := recordOn(t, c, "c")
		require.Empty(t, got.Held(), "nothing is handed back to the terminating claim")
		var now testenv.Claim
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), &now))
		require.NotContains(t, now.Finalizers, syncer.DefaultKeys().Finalizer)
	}
}

// failingReads is a store whose reads fail while fail is set.
type failingReads struct {
	store.AllocationStore
	fail atomic.Bool
}

var errStoreDown = errors.New("injected: store unavailable")

func (s *failingReads) HolderOf(pool types.NamespacedName, pod string) (store.Holder, bool, error) {
	if s.fail.Load() {
		return store.Holder{}, false, errStoreDown
	}
	return s.AllocationStore.HolderOf(pool, pod)
}

func (s *failingReads) Held(pool types.NamespacedName, uid types.UID) ([]string, error) {
	if s.fail.Load() {
		return nil, errStoreDown
	}
	return s.AllocationStore.Held(pool, uid)
}

func (s *failingReads) Count(pool types.NamespacedName, uid types.UID) (int, error) {
	if s.fail.Load() {
		return 0, errStoreDown
	}
	return s.AllocationStore.Count(pool, uid)
}

// The store given with WithStore is the allocator's one index of holdings:
// it reads who holds what from it, not from a copy of its own. While the
// store cannot answer, no pod counts as free: nothing is handed out, the
// round says why, and once the store answers again the claim is served.
func TestStoreIsTheIndexOfHoldings(t *testing.T) {
	ctx := context.Background()
	c, pool, _ := regressionPool(t, 3, 1)
	st := &failingReads{AllocationStore: store.NewInMemory()}
	a, err := allocator.New(c, allocator.WithStore(st))
	require.NoError(t, err)
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	held := recordOn(t, c, "c").Held()
	require.Len(t, held, 1)

	d := testenv.NewClaim("ns", "d", "p", 1)
	d.UID = "uid-d"
	require.NoError(t, c.Create(ctx, d))
	st.fail.Store(true)
	res, err := world.Round(ctx, a, c, pool)
	require.ErrorIs(t, err, errStoreDown)
	require.Empty(t, res.Allocated, "no pod is free while the store cannot say who holds it")
	require.Empty(t, recordOn(t, c, "d").Held())
	require.Equal(t, held, recordOn(t, c, "c").Held())

	st.fail.Store(false)
	res, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Len(t, res.Allocated, 1)
	got := recordOn(t, c, "d").Held()
	require.Len(t, got, 1)
	require.NotEqual(t, held[0], got[0])
	require.NoError(t, allocator.CheckInvariants(a))
}

// A settled claim lets go of what it kept of its object (most claims of a
// steady pool are settled). A write it needs later without a new version
// in the input (here a held pod gone, WithReplaceLost, through Update)
// reads the claim again and is based on it when it is still the version
// known; when the claim changed meanwhile, the write waits for the input
// to show the change.
func TestSettledClaimWriteReadsTheClaimAgain(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 3, 1)
	a, err := allocator.New(c, allocator.WithReplaceLost(true))
	require.NoError(t, err)
	res := firstRound(t, a, c, pool)
	first := res.Allocated[0].Pods[0]
	_, err = world.Round(ctx, a, c, pool) // settled
	require.NoError(t, err)

	deletePod := func(name string) {
		var pod corev1.Pod
		require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: name}, &pod))
		require.NoError(t, c.Delete(ctx, &pod))
	}
	deletePod(first)
	res, err = a.Update(ctx, allocator.Changes{Pool: pool, DeletedPods: []string{first}})
	require.NoError(t, err)
	require.Len(t, res.Allocated, 1, "the gone pod is replaced")
	second := res.Allocated[0].Pods[0]
	require.Equal(t, []string{second}, recordOn(t, c, "c").Held())
	require.NoError(t, allocator.CheckInvariants(a))
	_, err = a.Update(ctx, allocator.Changes{Pool: pool}) // settled again
	require.NoError(t, err)

	// The claim changes on the server; the allocator is not shown it.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Labels = map[string]string{"touched": "yes"}
	require.NoError(t, c.Update(ctx, cl))
	deletePod(second)
	res, err = a.Update(ctx, allocator.Changes{Pool: pool, DeletedPods: []string{second}})
	require.ErrorIs(t, err, allocator.ErrWrite)
	require.True(t, apierrors.IsConflict(err), "a conflict, retried once the input shows the claim: %v", err)
	require.Empty(t, res.Allocated, "no write on a version the allocator was not shown")
	require.Equal(t, []string{second}, recordOn(t, c, "c").Held())

	// Shown the change, it writes.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	res, err = a.Update(ctx, allocator.Changes{Pool: pool, Claims: []allocator.Claim{{Object: cl, Want: 1}}})
	require.NoError(t, err)
	require.Len(t, res.Allocated, 1)
	now := recordOn(t, c, "c").Held()
	require.Len(t, now, 1)
	require.NotEqual(t, second, now[0])
	require.NoError(t, allocator.CheckInvariants(a))
}

// An allocator crashed between recording a pod released and removing its
// mark, and the pod changed afterwards (it went unready), so that a new
// allocator knows the mark only as older than the pod's version, which is
// newer than the record's. It recycles the pod for the claim and writes the
// record again, which lists it released already: on the API server such a
// patch changes nothing and keeps the claim's resourceVersion, so the mark
// could never go and the pod stayed out of the pool for good (the
// many-allocator machine on the real API server; kept as
// testdata/rapid/TestPropertyMultiFake/TestPropertyMultiFake-noop-release-write-no-fence.fail
// and its Envtest twin). Every write now makes a new version of the claim.
func TestRegressionReleaseWrittenAlreadyStillFencesTheMark(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 1)
	cl := f.claim("c", "p", 1)
	a := f.alloc()
	res := f.round(a, pool)
	require.Len(t, res.Allocated, 1)
	pod := res.Allocated[0].Pods[0]

	// The owner gives the pod back and deletes the claim, which another
	// finalizer keeps. What the crashed allocator did: it recorded the pod
	// released, then stopped before the unmark.
	f.release("c", pod)
	live := f.get("c")
	controllerutil.AddFinalizer(live, "example.com/keep")
	require.NoError(t, f.c.Update(f.ctx, live))
	require.NoError(t, f.c.Delete(f.ctx, live))
	t.Cleanup(func() {
		live := f.get("c")
		controllerutil.RemoveFinalizer(live, "example.com/keep")
		require.NoError(t, f.c.Update(f.ctx, live))
	})
	s, err := syncer.NewAnnotationSyncer(f.c, f.keys)
	require.NoError(t, err)
	_, err = s.Write(f.ctx, f.get("c"), syncer.Record{Released: []string{pod}}, false)
	require.NoError(t, err)
	var p corev1.Pod
	require.NoError(t, f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: pod}, &p))
	require.Equal(t, "c/"+string(cl.UID), p.Annotations[allocator.DefaultPodMarkKey], "the mark stays")
	// The pod changes after the record was written.
	patch := client.MergeFrom(p.DeepCopy())
	p.Labels["example.com/touched"] = "1"
	require.NoError(t, f.c.Patch(f.ctx, &p, patch))

	clk := clocktesting.NewFakeClock(time.Now())
	b := f.alloc(allocator.WithClock(clk))
	idle := 0
	for i := 0; i < 4 && idle == 0; i++ {
		res = f.round(b, pool)
		idle = len(res.Idle)
		clk.Step(allocator.DefaultQuarantine + time.Second)
	}
	require.Equal(t, 1, idle, "the pod is free again")
	require.NoError(t, f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: pod}, &p))
	require.Empty(t, p.Annotations[allocator.DefaultPodMarkKey], "its mark is gone")
	require.Empty(t, f.held("c"))
	require.NoError(t, allocator.CheckInvariants(b))
}

// noVersionSyncer breaks the AllocationSyncer contract: its Write returns
// the claim as given, at the resourceVersion it had, and writes nothing.
type noVersionSyncer struct{ syncer.AllocationSyncer }

func (noVersionSyncer) Write(_ context.Context, claim client.Object, _ syncer.Record, _ bool) (client.Object, error) {
	return claim.DeepCopyObject().(client.Object), nil
}

// nilObjectSyncer breaks the AllocationSyncer contract: its Write returns
// no object and no error.
type nilObjectSyncer struct{ syncer.AllocationSyncer }

func (nilObjectSyncer) Write(context.Context, client.Object, syncer.Record, bool) (client.Object, error) {
	return (*testenv.Claim)(nil), nil
}

// A syncer that breaks the Write contract gets a failed write naming the
// claim, not a panic and not a hand-out: one whose write makes no new
// version of the claim (the write achieved nothing: the pod's mark goes),
// and one that returns no claim (an unknown outcome, read back: nothing
// landed).
func TestSyncerBreakingWriteContractIsAnError(t *testing.T) {
	for _, tc := range []struct {
		name     string
		wrap     func(syncer.AllocationSyncer) syncer.AllocationSyncer
		msg      string
		markGone bool
	}{
		{"no new version", func(s syncer.AllocationSyncer) syncer.AllocationSyncer { return noVersionSyncer{s} },
			"claim ns/c: record write failed: write record: the syncer returned the claim at resourceVersion", true},
		{"no claim", func(s syncer.AllocationSyncer) syncer.AllocationSyncer { return nilObjectSyncer{s} },
			"claim ns/c: record write failed: write record: the syncer returned no claim", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, pool, _ := regressionPool(t, 1, 1)
			s, err := syncer.NewAnnotationSyncer(c, syncer.DefaultKeys())
			require.NoError(t, err)
			a, err := allocator.New(c, allocator.WithSyncer(tc.wrap(s)))
			require.NoError(t, err)
			res, err := world.Round(context.Background(), a, c, pool)
			require.ErrorIs(t, err, allocator.ErrWrite)
			require.ErrorContains(t, err, tc.msg)
			require.Empty(t, res.Allocated)
			held, err := a.Store().Held(pool, "uid-c")
			require.NoError(t, err)
			require.Empty(t, held)
			require.Empty(t, recordOn(t, c, "c").Held())
			if tc.markGone {
				var pod corev1.Pod
				require.NoError(t, c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "p-0"}, &pod))
				require.Empty(t, pod.Annotations[allocator.DefaultPodMarkKey], "the failed hand-out's mark is gone")
			}
			require.NoError(t, allocator.CheckInvariants(a))
		})
	}
}

// A hand-out whose record write had an unknown outcome (it did not land)
// leaves the pod reserved for the claim, and the claim's next write carries
// it again. It may only when the claim may still get the pod: not once the
// pod went unready, nor beyond what the claim now wants. Before, the
// reserved pod rode along into the record regardless (the single-allocator
// machine; kept as testdata/rapid/TestPropertyFake/TestPropertyFake-ride-along.fail).
// Without pod marks only this check keeps the pod out; with marks the
// write's mark check does too.
func TestRegressionReservedPodRidesAlongOnlyWhenItMayBeHanded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, c client.Client, cl *testenv.Claim, pod string)
	}{
		{"pod unready", func(t *testing.T, c client.Client, _ *testenv.Claim, pod string) {
			var p corev1.Pod
			require.NoError(t, c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: pod}, &p))
			require.NoError(t, testenv.SetPodReady(context.Background(), c, &p, false))
		}},
		{"want lowered", func(t *testing.T, c client.Client, cl *testenv.Claim, _ string) {
			setReplicas(t, c, cl, 0)
		}},
	} {
		for _, marks := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/marks=%t", tc.name, marks), func(t *testing.T) {
				ctx := context.Background()
				var timeout atomic.Bool
				c := newFakeClient(t, &interceptor.Funcs{
					Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
						if _, claim := obj.(*testenv.Claim); claim && timeout.CompareAndSwap(true, false) {
							return apierrors.NewTimeoutError("injected: the write was not sent", 1)
						}
						return c.Patch(ctx, obj, patch, opts...)
					},
				})
				c, pool, cl := regressionPoolOn(t, c, 1, 1)
				var opts []allocator.Option
				if !marks {
					opts = append(opts, allocator.WithPodMarks(false))
				}
				a, err := allocator.New(c, opts...)
				require.NoError(t, err)
				timeout.Store(true)
				_, err = world.Round(ctx, a, c, pool)
				require.ErrorIs(t, err, allocator.ErrWrite)
				require.Empty(t, recordOn(t, c, "c").Held(), "the first write did not land")

				tc.change(t, c, cl, "p-0")
				for range 2 {
					_, err = world.Round(ctx, a, c, pool)
					require.NoError(t, err)
					require.NoError(t, allocator.CheckInvariants(a))
					require.Empty(t, recordOn(t, c, "c").Held(), "the reserved pod must not ride along")
					held, err := a.Store().Held(pool, "uid-c")
					require.NoError(t, err)
					require.Empty(t, held)
				}
			})
		}
	}
}

// A stale listing of a claim (older than the version the allocator wrote)
// with a higher Want than the newest one: Want is read from every Claim
// (issue 10), but not from a stale copy, which would hand out an extra pod
// (docs/design.md I7). Found by the single-allocator machine while Want became an
// input of every round (its file stopped replaying once fixed).
func TestRegressionStaleListingWantIsNotTaken(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 4)
	a := f.alloc()
	f.claim("c", "p", 3)
	f.round(a, pool)
	require.Len(t, f.held("c"), 3)
	stale, err := world.Input(f.ctx, f.c, pool) // c at want 3
	require.NoError(t, err)

	f.scale("c", 1)
	f.round(a, pool)
	require.Len(t, f.held("c"), 1)

	res, err := a.Round(f.ctx, stale)
	require.NoError(t, err)
	require.Empty(t, res.Allocated, "a stale copy's Want handed out pods")
	require.Len(t, f.held("c"), 1)
	require.NoError(t, allocator.CheckInvariants(a))

	// The same version with another Want is read, though.
	in, err := world.Input(f.ctx, f.c, pool)
	require.NoError(t, err)
	in.Claims[0].Want = 2
	res, err = a.Round(f.ctx, in)
	require.NoError(t, err)
	require.Len(t, res.Allocated, 1)
	require.Len(t, f.held("c"), 2)
}

// A pod marked for a claim by a hand-out that lost its race (its record
// never listed the pod) is settled for the claim: recycled and recorded
// released (docs/design.md I13). Meanwhile another allocator handed the same pod to
// the claim again, after a scale-up, and its record lists it. An allocator
// whose listings lag (the claim missing from them, the pod still at its old
// version) settled it all the same and wrote the claim's record, read live
// at the newer version, without the pod: the claim lost a pod it held and
// wanted (I7). Found by the many-allocator machine
// (testdata/rapid/TestPropertyMultiFake/…-settle-over-newer-hand-out.fail).
func TestRegressionSettleDoesNotUndoANewerHandOut(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 3, 2)
	before, err := world.Input(ctx, c, pool) // no marks yet
	require.NoError(t, err)

	// The other allocator marks p-2 for c; its record write then loses.
	var p2 corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p-2"}, &p2))
	p2.Annotations = map[string]string{allocator.DefaultPodMarkKey: "c/uid-c"}
	require.NoError(t, c.Update(ctx, &p2))
	marked, err := world.Input(ctx, c, pool)
	require.NoError(t, err)

	// This allocator, on the listing from before the mark, serves c.
	a, err := allocator.New(c)
	require.NoError(t, err)
	res, err := a.Round(ctx, before)
	require.NoError(t, err)
	require.Equal(t, []string{"p-0", "p-1"}, grantsTo(res, "c"))

	// c is scaled to 3; the other allocator hands it p-2 (the mark it
	// wrote is still there) and records it.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Spec.Replicas = 3
	v, err := syncer.EncodePods([]string{"p-0", "p-1", "p-2"})
	require.NoError(t, err)
	cl.Annotations[syncer.DefaultKeys().Allocated] = v
	require.NoError(t, c.Update(ctx, cl))

	// This allocator's next round lags: the pods as they were after the
	// mark, the claims from before c existed.
	stale := marked
	stale.Claims = nil
	_, err = a.Round(ctx, stale)
	require.ErrorIs(t, err, allocator.ErrWrite, "the stale settle is refused as a conflict, left for the next round")
	require.Equal(t, []string{"p-0", "p-1", "p-2"}, recordOn(t, c, "c").Held(), "c keeps the pod handed to it again")

	// Once the listings catch up, all is as the newer record says.
	res, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Empty(t, res.Released)
	require.Equal(t, []string{"p-0", "p-1", "p-2"}, recordOn(t, c, "c").Held())
	require.NoError(t, allocator.CheckInvariants(a))
}

func TestTerminatingPodNeverHandedOutWhateverTheReadinessRule(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 1)
	pod := &corev1.Pod{}
	require.NoError(t, f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "p-0"}, pod))
	pod.Finalizers = append(pod.Finalizers, "example.com/hold")
	require.NoError(t, f.c.Update(f.ctx, pod))
	require.NoError(t, f.c.Delete(f.ctx, pod))
	t.Cleanup(func() {
		p := &corev1.Pod{}
		if f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "p-0"}, p) == nil {
			p.Finalizers = nil
			_ = f.c.Update(f.ctx, p)
		}
	})
	// OpenSandbox's rule: phase and the Ready condition only.
	a := f.alloc(allocator.WithReadiness(func(p *corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				return p.Status.Phase == corev1.PodRunning && c.Status == corev1.ConditionTrue
			}
		}
		return false
	}))
	f.claim("c", "p", 1)
	res := f.round(a, pool)
	require.Empty(t, res.Allocated, "a pod being deleted is not handed out")
	require.Equal(t, 1, res.Shortfall)
	require.Empty(t, res.Idle)
}

// An allocator whose pod listing lags shows the old pod under a name, while
// the claim's newer record lists the name for the pod created under it
// since, which another allocator marked for the claim and handed to it. The
// claim keeps that pod: the live read that checks the record finds the new
// pod marked for the claim, before the record was written. With
// WithPodMarkMigration, which believed the record over the old pod's mark
// for a claim that is gone, it used to drop the name from the record as
// the old pod's (the many-allocator machine, I7).
func TestRegressionRecordOfNewPodUnderNameSurvivesLaggingListing(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 1, 1)
	// The old p-0 was marked for a claim since gone.
	var p0 corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p-0"}, &p0))
	p0.Annotations = map[string]string{allocator.DefaultPodMarkKey: "gone/uid-gone"}
	require.NoError(t, c.Update(ctx, &p0))
	stale, err := world.Input(ctx, c, pool)
	require.NoError(t, err)

	// p-0 is recreated; another allocator hands the new one to c.
	var old corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p-0"}, &old))
	old.UID = "uid-p-0-old" // the fake client assigns none
	require.NoError(t, c.Delete(ctx, &old))
	stale.Pods[0].UID = old.UID
	fresh := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p-0", Labels: old.Labels, UID: "uid-p-0-new"}, Spec: old.Spec}
	require.NoError(t, c.Create(ctx, fresh))
	require.NoError(t, testenv.SetPodReady(ctx, c, fresh, true))
	other, err := allocator.New(c)
	require.NoError(t, err)
	firstRound(t, other, c, pool)
	require.Equal(t, []string{"p-0"}, recordOn(t, c, "c").Held())

	// This allocator starts on the stale pods and the current claims. With
	// migration it believes c's record, newer than the old pod's mark for
	// a claim that holds nothing.
	a, err := allocator.New(c, allocator.WithPodMarkMigration(true))
	require.NoError(t, err)
	now, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	in := now
	in.Pods = stale.Pods
	_, err = a.Round(ctx, in)
	require.NoError(t, err)
	require.Equal(t, []string{"p-0"}, recordOn(t, c, "c").Held(), "c keeps the new p-0")
	held, err := a.Store().Held(pool, cl.UID)
	require.NoError(t, err)
	require.Equal(t, []string{"p-0"}, held)
	require.NoError(t, allocator.CheckInvariants(a))

	res, err := world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Empty(t, res.Released)
	require.Empty(t, res.Recycling)
	require.Equal(t, []string{"p-0"}, recordOn(t, c, "c").Held())
	var got corev1.Pod
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p-0"}, &got))
	require.Equal(t, fresh.UID, got.UID)
	require.Equal(t, "c/uid-c", got.Annotations[allocator.DefaultPodMarkKey])
	require.NoError(t, allocator.CheckInvariants(a))
}

// A claim that moved to another pool keeps the pod its record lists and
// its mark names against an older record of another claim (here written by
// hand): a claim's resourceVersion moves on with any change to it, so
// WithPodMarkMigration's "newer record wins" waits for a live read of the
// claim the mark names, which shows it still lists the pod. Until the pod
// is recycled for the claim that moved, no other claim is marked for it
// (I11). Found by the many-allocator machine.
func TestRegressionMovedClaimKeepsItsPodFromAnOlderRecord(t *testing.T) {
	f := newFixture(t)
	p1 := f.pool("p1", 1)
	f.pool("p2", 0)
	a1 := f.alloc()
	f.claim("c4", "p1", 1)
	res := f.round(a1, p1)
	require.Len(t, grantsTo(res, "c4"), 1)
	x := grantsTo(res, "c4")[0]

	// c4 moves to p2 holding x; c1 comes to p1 with a record that lists x
	// (a copy from an older era), written after x was marked.
	c4 := f.get("c4")
	c4.Spec.PoolRef = "p2"
	require.NoError(t, f.c.Update(f.ctx, c4))
	c1 := testenv.NewClaim(f.ns, "c1", "p1", 1)
	v, err := syncer.EncodePods([]string{x})
	require.NoError(t, err)
	c1.Annotations = map[string]string{f.keys.Allocated: v}
	require.NoError(t, f.c.Create(f.ctx, c1))

	var recycledFor []string // "pod for claim", in call order
	recycler := func(_ context.Context, req allocator.RecycleRequest) (bool, error) {
		recycledFor = append(recycledFor, req.Pod+" for "+req.Claim.Claim.Name)
		return true, nil
	}
	a2 := f.alloc(allocator.WithPodMarkMigration(true), allocator.WithClaimPool(claimPoolRef), allocator.WithRecycler(recycler))
	for range 4 {
		f.round(a2, p1)
		mark := f.marks("p1")[x]
		for _, name := range []string{"c1", "c4"} {
			if slices.Contains(f.held(name), x) {
				require.Equal(t, name+"/"+string(f.get(name).UID), mark, "the record of %s lists pod %s, whose mark is %q", name, x, mark)
			}
		}
		if mark == "c1/"+string(f.get("c1").UID) {
			require.Contains(t, recycledFor, x+" for c4", "pod %s handed to c1 before it was recycled for c4", x)
		}
	}
	require.Equal(t, []string{x + " for c4"}, recycledFor)
	require.NotContains(t, f.held("c4"), x, "the pod is given back for the claim that moved")
}

// An allocator settling a pod for a claim (the pod is marked for it, and a
// record newer than the mark does not list it) whose fence fails (the pod
// changed since the listing) keeps the pod settling. A round on a claim
// listing that then lacks the claim forgot the claim, though the pod was
// still settling for it; when the claim came back, handed that pod by
// another allocator, the settling pod named the forgotten entry: the
// allocator recycled the pod the claim held and wrote its record without
// it (the many-allocator machine, I7).
func TestRegressionSettlingPodKeepsItsClaimKnown(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 1, 0)
	mark := func(v string) {
		t.Helper()
		var p corev1.Pod
		require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p-0"}, &p))
		p.Annotations = map[string]string{allocator.DefaultPodMarkKey: v}
		require.NoError(t, c.Update(ctx, &p))
	}
	recycled := 0
	a, err := allocator.New(c, allocator.WithRecycler(func(context.Context, allocator.RecycleRequest) (bool, error) {
		recycled++
		return true, nil
	}))
	require.NoError(t, err)
	_, err = world.Round(ctx, a, c, pool) // c wants nothing yet
	require.NoError(t, err)

	// Another allocator marks p-0 for c; c is then scaled to 1 (a version
	// newer than the mark, whose record does not list the pod); the other
	// allocator's hand-out fails and it unmarks the pod.
	mark("c/uid-c")
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Spec.Replicas = 1
	require.NoError(t, c.Update(ctx, cl))
	lagging, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	mark("")

	// On the listing from before the unmark, the pod is settled for c;
	// its fence fails (the pod changed), so it stays settling. The next
	// round's claim listing lacks c.
	res, err := a.Round(ctx, lagging)
	require.NoError(t, err)
	require.NotEmpty(t, res.Warnings, "the fence's conflict is a warning")
	noClaims := lagging
	noClaims.Claims = nil
	_, err = a.Round(ctx, noClaims)
	require.NoError(t, err)
	require.NoError(t, allocator.CheckInvariants(a))
	require.Zero(t, recycled, "the pod changed since the listing: not recycled")

	// The other allocator hands p-0 to c.
	mark("c/uid-c")
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	v, err := syncer.EncodePods([]string{"p-0"})
	require.NoError(t, err)
	cl.Annotations = map[string]string{syncer.DefaultKeys().Allocated: v}
	require.NoError(t, c.Update(ctx, cl))

	for range 2 {
		res, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.Empty(t, res.Released)
	}
	require.Zero(t, recycled, "c holds p-0: it is not recycled")
	require.Equal(t, []string{"p-0"}, recordOn(t, c, "c").Held())
	require.NoError(t, allocator.CheckInvariants(a))
}

// An allocator on a lagging pod listing still believes a pod is held by a
// claim it handed the pod to; that claim was deleted since, and another
// allocator released the pod and handed it to a second claim. The stale
// allocator gives the pod back for the deleted claim, and writes the
// second claim's record, which lists the pod: a belief older than that
// record does not decide, the pod is read live, and the write keeps it
// (marked for the second claim). Where the lagging listing lacked the pod,
// the write used to drop it unread, as held here by the deleted claim,
// taking it from the claim holding it (the many-allocator machine, I7).
func TestRegressionPodOfAGoneClaimStaysWithItsNewHolder(t *testing.T) {
	for _, lag := range []string{"marked for the gone claim", "missing"} {
		t.Run(lag, func(t *testing.T) {
			ctx := context.Background()
			c, pool, x := regressionPool(t, 1, 1)
			a, err := allocator.New(c)
			require.NoError(t, err)
			res, err := world.Round(ctx, a, c, pool)
			require.NoError(t, err)
			require.Equal(t, []string{"p-0"}, grantsTo(res, "c"))
			stale, err := world.Input(ctx, c, pool) // p-0 marked for c
			require.NoError(t, err)
			if lag == "missing" {
				stale.Pods = nil
			}

			// c is deleted; another allocator releases p-0, then hands it
			// to y.
			require.NoError(t, c.Delete(ctx, x))
			b, err := allocator.New(c)
			require.NoError(t, err)
			for range 2 {
				_, err = world.Round(ctx, b, c, pool)
				require.NoError(t, err)
			}
			require.True(t, apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(x), x)), "c is gone once its pod is released")
			y := testenv.NewClaim("ns", "y", "p", 1)
			y.UID = "uid-y"
			require.NoError(t, c.Create(ctx, y))
			res, err = world.Round(ctx, b, c, pool)
			require.NoError(t, err)
			require.Equal(t, []string{"p-0"}, grantsTo(res, "y"))

			// a rounds on its lagging pod listing and the claims as they
			// are.
			fresh, err := world.Input(ctx, c, pool)
			require.NoError(t, err)
			stale.Claims = fresh.Claims
			for range 3 {
				_, _ = a.Round(ctx, stale)
				require.Equal(t, []string{"p-0"}, recordOn(t, c, "y").Held(), "y keeps the pod it holds")
			}
			res, err = world.Round(ctx, a, c, pool)
			require.NoError(t, err)
			require.Empty(t, res.Released)
			require.Equal(t, []string{"p-0"}, recordOn(t, c, "y").Held())
			require.NoError(t, allocator.CheckInvariants(a))
		})
	}
}

// A pod marked for a claim by a hand-out that lost its race is settled by
// an allocator whose listing lags: a record of the claim newer than the
// mark omits it. Meanwhile another allocator handed the pod to the claim
// again, and the claim then moved to another pool. The settle's write,
// read live, met the newer record listing the pod and was refused as a
// stale decision (TestRegressionSettleDoesNotUndoANewerHandOut) so that
// the next round could see that record; but the claim no longer is in this
// pool's listing, so no round ever did, and the pool wrote a recycle fence
// and was refused again every round, its pods never given back (liveness,
// found by the many-allocator machine). A claim missing from the listing
// for the quarantine has its pods here given back whatever its record says
// (queueOrphans): settling the pod for it is that same outcome.
func TestRegressionSettleForAClaimThatLeftThePoolGoesThrough(t *testing.T) {
	for _, withPool := range []bool{true, false} {
		t.Run(map[bool]string{true: "with-claim-pool", false: "missing-for-the-quarantine"}[withPool], func(t *testing.T) {
			settleForAClaimThatLeft(t, withPool)
		})
	}
}

func settleForAClaimThatLeft(t *testing.T, withPool bool) {
	f := newFixture(t)
	p1, p2 := f.pool("p1", 1), f.pool("p2", 2)
	f.claim("x", "p2", 1)
	a0 := f.alloc()
	require.Equal(t, []string{"p2-0"}, grantsTo(f.round(a0, p2), "x"))
	mark := "x/" + string(f.get("x").UID)
	setMark := func(v string) {
		t.Helper()
		require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pod := f.getPod("p2-1")
			if v == "" {
				delete(pod.Annotations, allocator.DefaultPodMarkKey)
			} else {
				if pod.Annotations == nil {
					pod.Annotations = map[string]string{}
				}
				pod.Annotations[allocator.DefaultPodMarkKey] = v
			}
			return f.c.Update(f.ctx, pod)
		}))
	}

	// Another allocator marks p2-1 for x; its record write loses. x then
	// changes (its record still without p2-1): newer than the mark.
	setMark(mark)
	f.scale("x", 2)
	lagging, err := world.Input(f.ctx, f.c, p2)
	require.NoError(t, err)

	// That allocator hands p2-1 to x again (unmarked, marked, recorded);
	// x then moves to p1.
	setMark("")
	setMark(mark)
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c := f.get("x")
		v, err := syncer.EncodePods([]string{"p2-0", "p2-1"})
		require.NoError(t, err)
		c.Annotations[f.keys.Allocated] = v
		return f.c.Update(f.ctx, c)
	}))
	f.movePool("x", "p1")

	clk := newFakeClock()
	opts := []allocator.Option{allocator.WithClock(clk)}
	if withPool {
		opts = append(opts, allocator.WithClaimPool(claimPoolRef))
	}
	a := f.alloc(opts...)
	_, _ = a.Round(f.ctx, lagging) // settles p2-1 on x's older record
	var res2 allocator.Result
	for i := range 4 {
		clk.Step(allocator.DefaultQuarantine + time.Second)
		res2, err = world.Round(f.ctx, a, f.c, p2)
		if i > 0 {
			require.NoError(t, err, "round %d of p2", i)
		}
		_, err = world.Round(f.ctx, a, f.c, p1)
		require.NoError(t, err, "round %d of p1", i)
	}
	require.ElementsMatch(t, []string{"p2-0", "p2-1"}, res2.Idle, "x's pods of p2 are given back")
	require.Equal(t, []string{"p1-0"}, f.held("x"))
	for _, name := range []string{"p2-0", "p2-1"} {
		require.Empty(t, f.getPod(name).Annotations[allocator.DefaultPodMarkKey], "%s is unmarked", name)
	}
}

// An allocator holds a pod for a claim. Another allocator gives the pod
// back and hands it to the claim again (its record lists it, its mark names
// it). The first allocator's pod listing lags and shows the pod between
// the two, unmarked; the claim read live lists it, so the allocator took
// the pod to have lost its mark by hand, of uncertain use, and recycled it
// out of the claim's record: the claim lost a pod it held and wanted (I7,
// found by the many-allocator machine). A record lists a pod only once its
// mark names the claim, so a record newer than the pod as known proves
// nothing about the mark: the pod is read live first.
func TestRegressionUnmarkedOnALaggingListingIsReadBeforeRecycling(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 2, 1)
	var recycled []string
	var mu sync.Mutex
	a, err := allocator.New(c, allocator.WithRecycler(func(_ context.Context, req allocator.RecycleRequest) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		recycled = append(recycled, req.Pod)
		return true, nil
	}))
	require.NoError(t, err)
	// Another allocator handed the pod out; this one learns of it.
	a0, err := allocator.New(c)
	require.NoError(t, err)
	held := firstRound(t, a0, c, pool).Allocated[0].Pods
	require.Len(t, held, 1)
	name := held[0]
	_, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	keys := syncer.DefaultKeys()
	edit := func(obj client.Object, change func()) {
		t.Helper()
		require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				return err
			}
			change()
			return c.Update(ctx, obj)
		}))
	}
	encode := func(pods ...string) string {
		v, err := syncer.EncodePods(pods)
		require.NoError(t, err)
		return v
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}

	// The other allocator: released, unmarked ...
	edit(cl, func() {
		cl.Annotations[keys.Allocated] = encode()
		cl.Annotations[keys.Released] = encode(name)
	})
	edit(pod, func() { delete(pod.Annotations, allocator.DefaultPodMarkKey) })
	between, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	// ... then marked and recorded again.
	edit(pod, func() { pod.Annotations = map[string]string{allocator.DefaultPodMarkKey: "c/uid-c"} })
	edit(cl, func() {
		cl.Annotations[keys.Allocated] = encode(name)
		cl.Annotations[keys.Released] = encode()
	})

	fresh, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	for _, in := range []allocator.Input{{Pool: pool, Pods: between.Pods, Claims: fresh.Claims}, between, fresh} {
		_, _ = a.Round(ctx, in)
		require.Equal(t, []string{name}, recordOn(t, c, "c").Held(), "c keeps the pod handed to it again")
	}
	res, err := world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Empty(t, res.Released)
	require.Equal(t, []string{name}, recordOn(t, c, "c").Held())
	mu.Lock()
	require.Empty(t, recycled, "the pod the claim holds is not recycled")
	mu.Unlock()
	require.NoError(t, allocator.CheckInvariants(a))
}
