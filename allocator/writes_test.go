package allocator_test

// Writes per hand-out and per release (issue 24, item 4): every write
// the allocator makes, counted on the real API server and the fake
// client.

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
)

// scaleIn sets claim name's replicas to want.
func scaleIn(t *testing.T, c client.Client, ns, name string, want int32) {
	t.Helper()
	f := &fixture{t: t, ctx: context.Background(), c: c, ns: ns}
	f.scale(name, want)
}

// handOutAndRelease hands one pod to a claim, then scales the claim to 0
// and runs rounds until the pod's release is recorded and it is unmarked;
// it returns the writes of the hand-out and of the release, and the pod.
// settle runs before each release round (a kubelet finishing a deletion).
func handOutAndRelease(t *testing.T, counted, plain client.Client, ns string, w *writeLog, settle func(pod string), opts ...allocator.Option) (handOut, release map[string]int, pod string) {
	t.Helper()
	ctx := context.Background()
	pool, _ := poolIn(t, plain, ns, 2)
	newClaimIn(t, plain, ns, "c", 1)
	a, err := allocator.New(counted, opts...)
	require.NoError(t, err)
	res, err := world.Round(ctx, a, plain, pool)
	require.NoError(t, err)
	require.Len(t, res.Allocated, 1)
	pod = res.Allocated[0].Pods[0]
	handOut = w.take()

	scaleIn(t, plain, ns, "c", 0)
	for range 4 {
		if settle != nil {
			settle(pod)
		}
		_, err = world.Round(ctx, a, plain, pool)
		require.NoError(t, err)
	}
	require.Empty(t, recordIn(t, plain, ns, "c").Held())
	require.Equal(t, []string{pod}, recordIn(t, plain, ns, "c").Released)
	require.NoError(t, allocator.CheckInvariants(a))
	return handOut, w.take(), pod
}

// TestWritesPerHandOut: a hand-out with pod marks is one pod write (the
// mark) and one claim write (the record and the finalizer).
func TestWritesPerHandOut(t *testing.T) {
	onBothCounted(t, func(t *testing.T, counted, plain client.Client, ns string, w *writeLog) {
		handOut, _, _ := handOutAndRelease(t, counted, plain, ns, w, nil)
		require.Equal(t, map[string]int{"pod": 1, "claim": 1}, handOut)
	})
}

// TestRecycleNoopReleaseWritesNoFence: a pod given back with the default
// recycler, RecycleNoop, which writes nothing to the pod, costs the
// release record and the unmark: no fence before a recycler that does
// nothing, and no recycling stamp ever shows on the pod.
func TestRecycleNoopReleaseWritesNoFence(t *testing.T) {
	for _, opts := range [][]allocator.Option{nil, {allocator.WithRecycler(allocator.RecycleNoop)}} {
		onBothCounted(t, func(t *testing.T, counted, plain client.Client, ns string, w *writeLog) {
			_, release, pod := handOutAndRelease(t, counted, plain, ns, w, nil, opts...)
			require.Equal(t, map[string]int{"pod": 1, "claim": 1}, release, "the released record and the unmark")
			p := getPod(t, plain, ns, pod)
			require.Empty(t, p.Annotations)
		})
	}
}

// TestRecycleFenceForARecyclerOfYourOwn: a recycler of the caller's own is
// fenced by default (a pod write that stamps the recycle before it runs);
// WithRecycleFence(false) drops the fence, WithRecycleFence(true) keeps it
// for RecycleNoop too.
func TestRecycleFenceForARecyclerOfYourOwn(t *testing.T) {
	own := func(context.Context, allocator.RecycleRequest) (bool, error) { return true, nil }
	for _, tc := range []struct {
		name string
		opts []allocator.Option
		pods int
	}{
		{"own recycler", []allocator.Option{allocator.WithRecycler(own)}, 2},
		{"own recycler, no fence", []allocator.Option{allocator.WithRecycler(own), allocator.WithRecycleFence(false)}, 1},
		{"RecycleNoop, fenced", []allocator.Option{allocator.WithRecycleFence(true)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			onBothCounted(t, func(t *testing.T, counted, plain client.Client, ns string, w *writeLog) {
				_, release, _ := handOutAndRelease(t, counted, plain, ns, w, nil, tc.opts...)
				require.Equal(t, map[string]int{"pod": tc.pods, "claim": 1}, release)
			})
		})
	}
}

// TestRecycleDeleteWithoutFence: RecycleDelete with WithRecycleFence(false)
// deletes the pod under the resourceVersion at which the allocator knows
// it marked for the claim, without stamping it first: the delete and the
// released record, and no unmark (the pod is gone).
func TestRecycleDeleteWithoutFence(t *testing.T) {
	onBothCounted(t, func(t *testing.T, counted, plain client.Client, ns string, w *writeLog) {
		// A kubelet finishes a graceful deletion; the fake client deletes
		// at once.
		settle := func(pod string) {
			var p corev1.Pod
			err := plain.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: pod}, &p)
			if err == nil && p.DeletionTimestamp != nil {
				require.NoError(t, client.IgnoreNotFound(plain.Delete(context.Background(), &p, client.GracePeriodSeconds(0))))
			}
		}
		_, release, pod := handOutAndRelease(t, counted, plain, ns, w, settle,
			allocator.WithRecycler(allocator.RecycleDelete(counted)), allocator.WithRecycleFence(false))
		require.Equal(t, map[string]int{"pod": 1, "claim": 1}, release, "the delete and the released record")
		pods, err := testenv.ListPods(context.Background(), plain, ns, "p")
		require.NoError(t, err)
		for _, p := range pods {
			require.NotEqual(t, pod, p.Name, "deleted")
		}
	})
}

// TestUnfencedRecycleDeleteOnAStaleListing: without the fence, RecycleDelete's
// precondition is what keeps a stale allocator off a pod. An allocator on
// a listing from before the pod's claim was force-deleted, recycled and
// the pod handed to another claim, recycles the pod for the gone claim:
// its delete, under the version it knows, fails, and the pod stays with
// the claim that holds it now.
func TestUnfencedRecycleDeleteOnAStaleListing(t *testing.T) {
	onBoth(t, func(t *testing.T, c client.Client, ns string) {
		ctx := context.Background()
		pool, pods := poolIn(t, c, ns, 1)
		p := pods[0].Name
		cl := newClaimIn(t, c, ns, "c", 1)
		a, err := allocator.New(c)
		require.NoError(t, err)
		_, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		forceDeleteClaim(t, c, cl)
		stale, err := world.Input(ctx, c, pool) // p marked for c, c gone
		require.NoError(t, err)
		for range 2 {
			_, err = world.Round(ctx, a, c, pool)
			require.NoError(t, err)
		}
		d := newClaimIn(t, c, ns, "d", 1)
		_, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(d), d))
		require.Equal(t, "d/"+string(d.UID), getPod(t, c, ns, p).Annotations[allocator.DefaultPodMarkKey])

		var calls []allocator.RecycleRequest
		del := allocator.RecycleDelete(c)
		b, err := allocator.New(c, allocator.WithClaimType(&testenv.Claim{}), allocator.WithRecycleFence(false),
			allocator.WithRecycler(func(ctx context.Context, req allocator.RecycleRequest) (bool, error) {
				calls = append(calls, req)
				return del(ctx, req)
			}))
		require.NoError(t, err)
		for _, cl := range stale.Claims {
			require.NotEqual(t, "d", cl.Object.GetName())
		}
		for range 2 {
			_, _ = b.Round(ctx, stale)
		}
		got := getPod(t, c, ns, p)
		require.Nil(t, got.DeletionTimestamp, "not deleted (recycler called %d times)", len(calls))
		require.Equal(t, "d/"+string(d.UID), got.Annotations[allocator.DefaultPodMarkKey])
		require.Equal(t, []string{p}, recordIn(t, c, ns, "d").Held())
		t.Logf("recycler called %d times", len(calls))
	})
}
