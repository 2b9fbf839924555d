package allocator_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

// A listing large enough that scan gives up its hint on a shuffled copy
// (maxHintMisses) and finds the rest in stages.
const bigListing = 400

// shuffled returns in with its pods and claims in an order drawn from
// seed, copied: the caller's input is not changed.
func shuffled(in allocator.Input, seed uint64) allocator.Input {
	rnd := rand.New(rand.NewPCG(seed, seed))
	out := in
	out.Pods, out.Claims = slices.Clone(in.Pods), slices.Clone(in.Claims)
	rnd.Shuffle(len(out.Pods), func(i, j int) { out.Pods[i], out.Pods[j] = out.Pods[j], out.Pods[i] })
	rnd.Shuffle(len(out.Claims), func(i, j int) { out.Claims[i], out.Claims[j] = out.Claims[j], out.Claims[i] })
	return out
}

// TestRoundOnAListingInAnyOrder runs a pool on the real API server from
// listings in a new order every round, as an informer cache gives them:
// claims are served, pods that leave the listing are seen gone, pods that
// change are seen changed, and the pool's state stays consistent
// (CheckInvariants after every round).
func TestRoundOnAListingInAnyOrder(t *testing.T) {
	f := newFixture(t)
	const pods, claims = bigListing, bigListing * 3 / 4
	pool := f.pool("p", pods)
	for i := range claims {
		f.claim("c-"+strconv.Itoa(i), "p", 1)
	}
	a := f.alloc()
	round := func(seed uint64) allocator.Result {
		t.Helper()
		in, err := world.Input(f.ctx, f.c, pool)
		require.NoError(t, err)
		res, err := a.Round(f.ctx, shuffled(in, seed))
		require.NoError(t, err)
		require.NoError(t, allocator.CheckInvariants(a))
		return res
	}
	res := round(1)
	require.Len(t, res.Allocated, claims)
	require.Equal(t, pods-claims, res.IdleCount)
	for seed := uint64(2); seed < 5; seed++ {
		res = round(seed)
		require.Empty(t, res.Allocated, "round %d", seed)
		require.Equal(t, pods-claims, res.IdleCount, "round %d", seed)
	}

	// Idle pods go, one turns unready, claims come: all seen.
	idle := slices.Sorted(slices.Values(res.Idle))
	for _, name := range idle[:3] {
		require.NoError(t, f.c.Delete(f.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}))
	}
	unready := &corev1.Pod{}
	require.NoError(t, f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: idle[3]}, unready))
	unready.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	require.NoError(t, f.c.Status().Update(f.ctx, unready))
	for i := range 5 {
		f.claim("late-"+strconv.Itoa(i), "p", 1)
	}
	res = round(9)
	require.Len(t, res.Allocated, 5)
	require.Equal(t, pods-claims-3-1-5, res.IdleCount)
	require.NotContains(t, res.Idle, idle[3])
	for _, name := range idle[:3] {
		require.NotContains(t, res.Idle, name)
	}
	for _, g := range res.Allocated {
		require.NotContains(t, idle[:4], g.Pods[0])
	}
	held, err := world.Holdings(f.ctx, f.c, pool, func(o client.Object) ([]string, error) {
		rec, err := a.Record(o)
		return rec.Held(), err
	})
	require.NoError(t, err)
	seen := map[string]string{}
	for claim, pods := range held {
		require.Len(t, pods, 1, "claim %s", claim)
		other, twice := seen[pods[0]]
		require.False(t, twice, "pod %s held by %s and %s", pods[0], claim, other)
		seen[pods[0]] = claim
	}
	require.Len(t, seen, claims+5)
}

// listingPool is a pool of n pods, n/2 of them held by single-pod claims
// recorded on a fake API server, recovered by a new allocator from a
// listing in order.
func listingPool(t *testing.T, n int) (allocator.Allocator, allocator.Input, client.Client) {
	t.Helper()
	scheme, err := testenv.NewScheme()
	require.NoError(t, err)
	const ns = "ns"
	in := allocator.Input{Pool: types.NamespacedName{Namespace: ns, Name: "p"}}
	var objs []client.Object
	for i := range n {
		pod := readyPod(ns, fmt.Sprintf("pod-%04d", i))
		pod.UID = types.UID(fmt.Sprintf("pod-uid-%04d", i))
		in.Pods = append(in.Pods, pod)
		if i%2 == 1 {
			continue
		}
		cl := testenv.NewClaim(ns, fmt.Sprintf("claim-%04d", i), "p", 1)
		cl.UID = types.UID(fmt.Sprintf("claim-uid-%04d", i))
		cl.ResourceVersion = "1"
		v, err := syncer.EncodePods([]string{pod.Name})
		require.NoError(t, err)
		cl.Annotations = map[string]string{syncer.DefaultKeys().Allocated: v}
		cl.Finalizers = []string{syncer.DefaultKeys().Finalizer}
		objs = append(objs, cl)
		in.Claims = append(in.Claims, allocator.Claim{Object: cl, Want: 1})
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	a, err := allocator.New(c, allocator.WithPodMarks(false))
	require.NoError(t, err)
	res, err := a.Round(context.Background(), in)
	require.NoError(t, err)
	require.Empty(t, res.Allocated)
	require.Equal(t, n/2, res.IdleCount)
	return a, in, c
}

// TestShuffledListingRefusedAsInOrder: a listing in any order is refused
// for the first bad pod or claim in its order, with the error a listing in
// order gets, and changes nothing.
func TestShuffledListingRefusedAsInOrder(t *testing.T) {
	a, in, _ := listingPool(t, bigListing)
	ctx := context.Background()
	base := shuffled(in, 7)
	for _, tc := range []struct {
		name  string
		spoil func(in *allocator.Input)
		want  string
	}{
		{"pod listed twice", func(in *allocator.Input) {
			in.Pods[300] = in.Pods[250]
		}, "pod " + base.Pods[250].Name + " listed twice"},
		{"a pod of another namespace before a pod listed twice", func(in *allocator.Input) {
			in.Pods[380] = in.Pods[370]
			in.Pods[200] = readyPod("other", "stranger")
		}, "pod other/stranger is in another namespace"},
		{"a pod listed twice before a pod of another namespace", func(in *allocator.Input) {
			in.Pods[210] = in.Pods[205]
			in.Pods[390] = readyPod("other", "stranger")
		}, "pod " + base.Pods[205].Name + " listed twice"},
		{"a pod with no name", func(in *allocator.Input) {
			in.Pods[330].Name = ""
		}, "pod 330 has no name"},
		{"claim listed twice", func(in *allocator.Input) {
			in.Claims[150] = in.Claims[120]
		}, "claim ns/" + base.Claims[120].Object.GetName() + " (uid " + string(base.Claims[120].Object.GetUID()) + ") listed twice"},
		{"a pod is refused before a claim", func(in *allocator.Input) {
			in.Claims[150] = in.Claims[120]
			in.Pods[399].Name = ""
		}, "pod 399 has no name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spoilt := base
			spoilt.Pods = make([]corev1.Pod, len(base.Pods))
			for i := range base.Pods {
				base.Pods[i].DeepCopyInto(&spoilt.Pods[i])
			}
			spoilt.Claims = slices.Clone(base.Claims)
			tc.spoil(&spoilt)
			_, err := a.Round(ctx, spoilt)
			require.ErrorIs(t, err, allocator.ErrInvalidInput)
			require.ErrorContains(t, err, tc.want)
			// Nothing changed: the listing as it was is taken as before.
			res, err := a.Round(ctx, base)
			require.NoError(t, err)
			require.Empty(t, res.Allocated)
			require.Equal(t, len(in.Pods)/2, res.IdleCount)
			require.NoError(t, allocator.CheckInvariants(a))
		})
	}
}

// TestShuffledListingSeesWhatChanged: in a listing in any order, pods that
// are new, changed or gone and claims that are new or gone are seen as in
// a listing in order.
func TestShuffledListingSeesWhatChanged(t *testing.T) {
	a, in, c := listingPool(t, bigListing)
	ctx := context.Background()
	for seed := range uint64(3) {
		res, err := a.Round(ctx, shuffled(in, seed))
		require.NoError(t, err)
		require.Equal(t, bigListing/2, res.IdleCount)
	}
	// Two idle pods leave, one turns unready, two come; a claim comes.
	next := in
	next.Pods = slices.Clone(in.Pods)
	gone := []string{next.Pods[1].Name, next.Pods[3].Name}
	next.Pods = slices.Delete(next.Pods, 3, 4)
	next.Pods = slices.Delete(next.Pods, 1, 2)
	unready := next.Pods[3].DeepCopy() // pod-0005, idle
	unready.ResourceVersion = "2"
	unready.Status.Conditions[0].Status = corev1.ConditionFalse
	next.Pods[3] = *unready
	for _, name := range []string{"new-0", "new-1"} {
		pod := readyPod(in.Pool.Namespace, name)
		pod.UID = types.UID(name)
		next.Pods = append(next.Pods, pod)
	}
	cl := testenv.NewClaim(in.Pool.Namespace, "claim-new", "p", 1)
	cl.UID = "claim-new"
	require.NoError(t, c.Create(ctx, cl))
	next.Claims = append(slices.Clone(in.Claims), allocator.Claim{Object: cl, Want: 1})
	res, err := a.Round(ctx, shuffled(next, 9))
	require.NoError(t, err)
	require.Len(t, res.Allocated, 1)
	require.Equal(t, bigListing/2-2-1+2-1, res.IdleCount)
	for _, name := range append(gone, unready.Name) {
		require.NotContains(t, res.Idle, name)
	}
	require.Contains(t, res.Idle, "new-0")
	require.Contains(t, res.Idle, "new-1")
	require.NoError(t, allocator.CheckInvariants(a))
	// A held pod leaves: its claim holds it lost. The new claim's listing
	// is its version as written.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	held := next.Pods[0].Name // pod-0000, claim-0000's
	next.Pods = next.Pods[1:]
	res, err = a.Round(ctx, shuffled(next, 10))
	require.NoError(t, err)
	require.Len(t, res.Lost, 1)
	require.Equal(t, held, res.Lost[0].Pod)
	require.True(t, res.Lost[0].Missing)
	require.NoError(t, allocator.CheckInvariants(a))
}
