package allocator_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
)

func newFakeClient(t *testing.T, funcs *interceptor.Funcs) client.Client {
	t.Helper()
	scheme, err := testenv.NewScheme()
	require.NoError(t, err)
	b := fake.NewClientBuilder().WithGlobalResourceVersionCounter().WithScheme(scheme).WithStatusSubresource(&corev1.Pod{}, &testenv.Claim{})
	if funcs != nil {
		b = b.WithInterceptorFuncs(*funcs)
	}
	return b.Build()
}

func TestFakeLifecycleSmoke(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	_, err := testenv.CreatePods(ctx, c, "ns", "p", 5, true)
	require.NoError(t, err)
	a, err := allocator.New(c)
	require.NoError(t, err)

	ca := testenv.NewClaim("ns", "a", "p", 2)
	cb := testenv.NewClaim("ns", "b", "p", 2)
	ca.UID, cb.UID = "uid-a", "uid-b" // the fake client assigns none
	require.NoError(t, c.Create(ctx, ca))
	require.NoError(t, c.Create(ctx, cb))
	res, err := world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Len(t, res.Allocated, 2)
	require.Len(t, res.Idle, 1)
	require.Zero(t, res.Shortfall)

	// Scale a down to 1: one pod is recycled (no-op) and released.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(ca), ca))
	ca.Spec.Replicas = 1
	require.NoError(t, c.Update(ctx, ca))
	res, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Len(t, res.Released, 1)
	require.Len(t, res.Idle, 2)

	// Delete b: it terminates, its pods are released, then it is gone.
	require.NoError(t, c.Delete(ctx, cb))
	res, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Len(t, res.Idle, 4)
	err = c.Get(ctx, client.ObjectKeyFromObject(cb), &testenv.Claim{})
	require.True(t, client.IgnoreNotFound(err) == nil && err != nil, "claim b should be gone, got %v", err)

	// Restart: a new allocator recovers exactly a's one pod.
	before, err := a.Store().Snapshot(pool)
	require.NoError(t, err)
	require.Len(t, before, 1)
	a2, err := allocator.New(c)
	require.NoError(t, err)
	_, err = world.Round(ctx, a2, c, pool)
	require.NoError(t, err)
	after, err := a2.Store().Snapshot(pool)
	require.NoError(t, err)
	require.Equal(t, before, after)
}

func TestUpdateFollowsChanges(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	pods, err := testenv.CreatePods(ctx, c, "ns", "p", 3, true)
	require.NoError(t, err)
	a, err := allocator.New(c)
	require.NoError(t, err)

	_, err = a.Update(ctx, allocator.Changes{Pool: pool, Pods: pods})
	require.ErrorIs(t, err, allocator.ErrInvalidInput, "Update before the first Round")

	_, err = a.Round(ctx, allocator.Input{Pool: pool, Pods: pods})
	require.NoError(t, err)

	cl := testenv.NewClaim("ns", "a", "p", 2)
	cl.UID = "uid-a"
	require.NoError(t, c.Create(ctx, cl))
	res, err := a.Update(ctx, allocator.Changes{Pool: pool, Claims: []allocator.Claim{{Object: cl, Want: 2}}})
	require.NoError(t, err)
	require.Len(t, res.Allocated, 1)
	held := res.Allocated[0].Pods
	require.Len(t, held, 2)
	require.Nil(t, res.Idle, "Update does not list idle pods")
	require.Equal(t, 1, res.IdleCount)

	// A held pod is deleted: reported lost, through the change alone.
	res, err = a.Update(ctx, allocator.Changes{Pool: pool, DeletedPods: []string{held[0]}})
	require.NoError(t, err)
	require.Len(t, res.Lost, 1)
	require.Equal(t, held[0], res.Lost[0].Pod)
	require.True(t, res.Lost[0].Missing)

	// The claim is force-deleted: its remaining pod is recycled and freed.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Finalizers = nil
	require.NoError(t, c.Update(ctx, cl))
	require.NoError(t, c.Delete(ctx, cl))
	res, err = a.Update(ctx, allocator.Changes{Pool: pool, DeletedClaims: []types.UID{"uid-a"}})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{held[0], held[1]}, res.Released[0].Pods)
	snap, err := a.Store().Snapshot(pool)
	require.NoError(t, err)
	require.Empty(t, snap)
	require.Equal(t, 2, res.IdleCount)
}
