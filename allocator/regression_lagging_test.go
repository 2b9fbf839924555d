package allocator_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
)

// A fresh allocator first sees a pod marked for a claim whose record (from
// a lagging claim listing) does not list it: a hand-out may be in flight,
// so the pod is reserved for the claim. A newer record that lists the pod
// released, not held, must end that reservation: counted against what the
// claim wants, it made the allocator give back another pod the claim held
// (the many-allocator machine, I7).
func TestRegressionNewerRecordEndsReservation(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	_, err := testenv.CreatePods(ctx, c, "ns", "p", 4, true)
	require.NoError(t, err)
	podsEarly, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	cl := testenv.NewClaim("ns", "c", "p", 2)
	cl.UID = "uid-c"
	require.NoError(t, c.Create(ctx, cl))
	claimsEarly, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	a, err := allocator.New(c)
	require.NoError(t, err)
	res, err := world.Round(ctx, a, c, pool)
	require.NoError(t, err)
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
	var early []corev1.Pod
	for _, p := range podsEarly.Pods {
		if p.Name == want[0] || p.Name == want[1] {
			if p.Name != first[1] {
				continue // the listing lags: the newer hand-out is missing
			}
		}
		early = append(early, p)
	}
	res, err = b.Round(ctx, allocator.Input{Pool: pool, Pods: early, Claims: fresh.Claims})
	// The second listing's pods lag more than its claims (another cache).
	require.Empty(t, res.Allocated)
	require.Equal(t, want, recordOn(t, c, "c").Held(), "the claim keeps both pods its record lists")
}
