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
	b := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&corev1.Pod{}, &testenv.Claim{})
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
