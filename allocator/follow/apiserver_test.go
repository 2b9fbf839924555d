package follow_test

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/allocator/follow"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// TestFollowsInformersOnAPIServer runs a Follower as an operator would: a
// controller-runtime manager's informers feed it through PodEvents and
// ClaimEvents, and each reconcile of the pool is a Sync. Claims created,
// scaled and deleted on the real API server are served and given back,
// with rounds after the first taking only the events.
func TestFollowsInformersOnAPIServer(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(ctx, t)
	pool := types.NamespacedName{Namespace: ns, Name: "p"}
	_, err := testenv.CreatePods(ctx, env.Client, ns, "p", 4, true)
	require.NoError(t, err)

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	require.NoError(t, err)
	alloc, err := allocator.New(mgr.GetClient(), allocator.WithAPIReader(mgr.GetAPIReader()),
		allocator.WithClaimType(&testenv.Claim{}), allocator.WithRecycler(allocator.RecycleNoop))
	require.NoError(t, err)
	var lists, syncs atomic.Int32
	f, err := follow.New(follow.Config{
		Allocator: alloc,
		PodPool:   podPool,
		ClaimPool: claimPool,
		Claim: func(o client.Object) allocator.Claim {
			cl := o.(*testenv.Claim)
			return allocator.Claim{Want: int(cl.Spec.Replicas), Priority: cl.Spec.Priority}
		},
		List: func(ctx context.Context, pool types.NamespacedName) (allocator.Input, error) {
			lists.Add(1)
			return world.Input(ctx, mgr.GetClient(), pool)
		},
	})
	require.NoError(t, err)
	err = ctrl.NewControllerManagedBy(mgr).Named("follow-test").
		Watches(&corev1.Pod{}, f.PodEvents()).
		Watches(&testenv.Claim{}, f.ClaimEvents()).
		Complete(reconcile.Func(func(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
			syncs.Add(1)
			res, _, err := f.Sync(ctx, req.NamespacedName)
			if err != nil {
				return ctrl.Result{}, err
			}
			if len(res.Recycling) > 0 || res.Shortfall > 0 {
				return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
			}
			return ctrl.Result{}, nil
		}))
	require.NoError(t, err)
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	held := func(name string) []string {
		cl := &testenv.Claim{}
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, cl); err != nil {
			return nil
		}
		rec, err := alloc.Record(cl)
		if err != nil {
			return nil
		}
		return rec.Held()
	}
	a := testenv.NewClaim(ns, "a", "p", 1)
	require.NoError(t, env.Client.Create(ctx, a))
	require.Eventually(t, func() bool { return len(held("a")) == 1 }, 30*time.Second, 50*time.Millisecond)
	b := testenv.NewClaim(ns, "b", "p", 3)
	require.NoError(t, env.Client.Create(ctx, b))
	require.Eventually(t, func() bool { return len(held("b")) == 3 }, 30*time.Second, 50*time.Millisecond)
	require.NotContains(t, held("b"), held("a")[0])

	// b scales down, a leaves: their pods come back, and a new claim takes
	// all four.
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(b), b))
	b.Spec.Replicas = 0
	require.NoError(t, env.Client.Update(ctx, b))
	require.NoError(t, env.Client.Delete(ctx, a))
	c := testenv.NewClaim(ns, "c", "p", 4)
	require.NoError(t, env.Client.Create(ctx, c))
	require.Eventually(t, func() bool { return len(held("c")) == 4 }, 30*time.Second, 50*time.Millisecond)
	require.Empty(t, held("b"))
	snap, err := alloc.Store().Snapshot(pool)
	require.NoError(t, err)
	require.Len(t, snap, 4)
	for _, h := range snap {
		require.Equal(t, "c", h.Claim.Name)
	}
	require.Equal(t, int32(1), lists.Load(), "one listing, at the first Sync; %d Syncs", syncs.Load())
	require.Greater(t, syncs.Load(), int32(3))
}
