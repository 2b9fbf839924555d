package allocator_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/store"
	"github.com/poolalloc/poolalloc/syncer"
)

// failingStore is a store whose Allocate fails.
type failingStore struct{ *store.InMemory }

func (failingStore) Allocate(types.NamespacedName, store.Holder, []string) error { return errStoreDown }

// rogue is a strategy that hands out a pod that is not a candidate.
type rogue struct{}

func (rogue) Plan(in algorithm.Input) (algorithm.Action, error) {
	act, err := algorithm.Packed{}.Plan(in)
	for i := range act.Allocate {
		act.Allocate[i].Pods = append(act.Allocate[i].Pods, "no-such-pod")
	}
	return act, err
}

// TestEveryErrorPathMatchesItsSentinel drives Round into each documented
// failure on one claim c of pool ns/p and checks that the error matches
// its sentinel with errors.Is, names the pool, and names the claim once.
func TestEveryErrorPathMatchesItsSentinel(t *testing.T) {
	failClaimPatch := &interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if _, ok := obj.(*testenv.Claim); ok {
			return apierrors.NewInternalError(errors.New("etcd unavailable"))
		}
		return c.Patch(ctx, obj, patch, opts...)
	}}
	failPodPatch := &interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if obj.GetObjectKind().GroupVersionKind().Kind == "Pod" || strings.HasPrefix(obj.GetName(), "p-") {
			return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, obj.GetName(), errors.New("no patch on pods"))
		}
		return c.Patch(ctx, obj, patch, opts...)
	}}
	for _, tc := range []struct {
		name     string
		funcs    *interceptor.Funcs
		opts     []allocator.Option
		edit     func(t *testing.T, c client.Client, in *allocator.Input) // before the round
		sentinel error
		claim    bool // the error names claim ns/c
	}{
		{name: "invalid input", sentinel: allocator.ErrInvalidInput,
			edit: func(t *testing.T, c client.Client, in *allocator.Input) { in.Claims[0].Want = -1 }},
		{name: "pool blocked", sentinel: allocator.ErrPoolBlocked, claim: true,
			edit: func(t *testing.T, c client.Client, in *allocator.Input) {
				cl := in.Claims[0].Object.(*testenv.Claim)
				cl.Annotations = map[string]string{syncer.DefaultKeys().Allocated: `{"pods":["p-0","p-0"]}`}
			}},
		{name: "plan rejected", sentinel: allocator.ErrPlan, opts: []allocator.Option{allocator.WithAlgorithm(rogue{})}},
		{name: "record write failed", sentinel: allocator.ErrWrite, claim: true, funcs: failClaimPatch},
		{name: "mark write failed", sentinel: allocator.ErrWrite, claim: true, funcs: failPodPatch},
		{name: "store failed", sentinel: allocator.ErrStore, claim: true,
			opts: []allocator.Option{allocator.WithStore(failingStore{store.NewInMemory()})}},
		{name: "cancelled", sentinel: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClient(t, tc.funcs)
			_, pool, _ := regressionPoolOn(t, c, 2, 1)
			a, err := allocator.New(c, tc.opts...)
			require.NoError(t, err)
			ctx := context.Background()
			in, err := world.Input(ctx, c, pool)
			require.NoError(t, err)
			if tc.edit != nil {
				tc.edit(t, c, &in)
			}
			if tc.sentinel == context.Canceled {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				cancel()
			}
			_, err = a.Round(ctx, in)
			require.ErrorIs(t, err, tc.sentinel)
			require.Contains(t, err.Error(), "pool ns/p")
			if tc.claim {
				require.Equal(t, 1, strings.Count(err.Error(), "claim ns/c"), "the claim is named once: %v", err)
				var ce *allocator.ClaimError
				require.ErrorAs(t, err, &ce)
				require.Equal(t, types.NamespacedName{Namespace: "ns", Name: "c"}, ce.Claim)
			}
		})
	}
}

// TestRecycleFailureMatchesErrRecycle gives a pod back through a recycler
// that fails: ErrRecycle, naming the claim and the pod.
func TestRecycleFailureMatchesErrRecycle(t *testing.T) {
	ctx := context.Background()
	c, pool, cl := regressionPool(t, 2, 1)
	boom := errors.New("scrubber down")
	a, err := allocator.New(c, allocator.WithRecycler(func(context.Context, allocator.RecycleRequest) (bool, error) { return false, boom }))
	require.NoError(t, err)
	held := firstRound(t, a, c, pool).Allocated[0].Pods
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	cl.Spec.Replicas = 0
	require.NoError(t, c.Update(ctx, cl))
	_, err = world.Round(ctx, a, c, pool)
	require.ErrorIs(t, err, allocator.ErrRecycle)
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "pool ns/p: claim ns/c: ")
	require.ErrorContains(t, err, held[0])
}
