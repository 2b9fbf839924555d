package allocator_test

// Placement (issue 23): selectors, topology and gangs through the
// allocator, on the real API server and the fake client, with restarts
// and several allocators.

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

// labelPod sets labels on pod name of ns (key, value pairs).
func labelPod(t *testing.T, c client.Client, ns, name string, kv ...string) {
	t.Helper()
	l := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": l}})
	require.NoError(t, err)
	pod := &corev1.Pod{}
	pod.Namespace, pod.Name = ns, name
	require.NoError(t, c.Patch(context.Background(), pod, client.RawPatch(types.MergePatchType, body)))
}

// addPod creates a Ready pod name of pool "p" in ns.
func addPod(t *testing.T, c client.Client, ns, name string) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{testenv.PoolLabel: "p"}, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{NodeName: "node-x", Containers: []corev1.Container{{Name: "main", Image: testenv.PodImage}}},
	}
	require.NoError(t, c.Create(ctx, pod))
	require.NoError(t, testenv.SetPodReady(ctx, c, pod, true))
}

// placedClaim creates claim name of pool "p" in ns wanting want pods, with
// spec's placement fields.
func placedClaim(t *testing.T, c client.Client, ns, name string, want int32, spec testenv.ClaimSpec) *testenv.Claim {
	t.Helper()
	cl := testenv.NewClaim(ns, name, "p", want)
	cl.UID = types.UID("uid-" + name)
	spec.PoolRef, spec.Replicas = cl.Spec.PoolRef, cl.Spec.Replicas
	cl.Spec = spec
	require.NoError(t, c.Create(context.Background(), cl))
	return cl
}

// labelsOf returns the labels of the pool's pods by name.
func labelsOf(t *testing.T, c client.Client, ns string) map[string]map[string]string {
	t.Helper()
	pods, err := testenv.ListPods(context.Background(), c, ns, "p")
	require.NoError(t, err)
	out := map[string]map[string]string{}
	for _, p := range pods {
		out[p.Name] = p.Labels
	}
	return out
}

// TestPlacementSelectorAndClasses: claims get only pods their selector
// matches, the shortfall says which class to create, a restart rebuilds
// the same holdings, and a pod relabelled out of its claim's selector is
// given back.
func TestPlacementSelectorAndClasses(t *testing.T) {
	onBoth(t, func(t *testing.T, c client.Client, ns string) {
		ctx := context.Background()
		pool, pods := poolIn(t, c, ns, 4)
		for i, p := range pods {
			size := "small"
			if i < 2 {
				size = "large"
			}
			labelPod(t, c, ns, p.Name, "size", size)
		}
		placedClaim(t, c, ns, "big", 2, testenv.ClaimSpec{Selector: map[string]string{"size": "large"}, Class: "large"})
		placedClaim(t, c, ns, "small", 3, testenv.ClaimSpec{Selector: map[string]string{"size": "small"}, Class: "small"})
		a, err := allocator.New(c)
		require.NoError(t, err)
		res, err := world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.Equal(t, 1, res.Shortfall)
		require.Equal(t, map[string]int{"small": 1}, res.ShortfallByClass)

		check := func() {
			t.Helper()
			lbl := labelsOf(t, c, ns)
			for claim, size := range map[string]string{"big": "large", "small": "small"} {
				for _, p := range recordIn(t, c, ns, claim).Held() {
					require.Equal(t, size, lbl[p]["size"], "claim %s holds pod %s", claim, p)
				}
			}
			noPodInTwoRecords(t, c, pool)
		}
		check()
		require.Len(t, recordIn(t, c, ns, "big").Held(), 2)
		require.Len(t, recordIn(t, c, ns, "small").Held(), 2)

		// A restart rebuilds the same holdings from records and marks.
		before := map[string][]string{"big": recordIn(t, c, ns, "big").Held(), "small": recordIn(t, c, ns, "small").Held()}
		a, err = allocator.New(c)
		require.NoError(t, err)
		res, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.Empty(t, res.Allocated)
		require.Empty(t, res.Recycling)
		require.Equal(t, map[string]int{"small": 1}, res.ShortfallByClass)
		for claim, held := range before {
			require.ElementsMatch(t, held, recordIn(t, c, ns, claim).Held())
		}

		// One of big's pods is relabelled small: big gives it back, and
		// small, which lacks one, gets it.
		moved := before["big"][0]
		labelPod(t, c, ns, moved, "size", "small")
		for range 3 {
			_, err = world.Round(ctx, a, c, pool)
			require.NoError(t, err)
			check()
		}
		require.NotContains(t, recordIn(t, c, ns, "big").Held(), moved)
		require.Contains(t, recordIn(t, c, ns, "small").Held(), moved)
		res, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.Equal(t, map[string]int{"large": 1}, res.ShortfallByClass)
	})
}

// TestPlacementGang: a gang gets all it wants in one record write or
// nothing, claims after it cannot take the pods it waits for, and a
// restart in the middle changes none of that.
func TestPlacementGang(t *testing.T) {
	onBoth(t, func(t *testing.T, c client.Client, ns string) {
		ctx := context.Background()
		pool, _ := poolIn(t, c, ns, 5)
		placedClaim(t, c, ns, "first", 2, testenv.ClaimSpec{})
		placedClaim(t, c, ns, "gang", 4, testenv.ClaimSpec{Gang: true, Class: "gang"})
		placedClaim(t, c, ns, "late", 1, testenv.ClaimSpec{})
		// Creation times are kept to the second: the allocator orders
		// claims first seen in one listing by resourceVersion, which is
		// the order of creation here.
		a, err := allocator.New(c)
		require.NoError(t, err)
		res, err := world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.Len(t, recordIn(t, c, ns, "first").Held(), 2)
		require.Empty(t, recordIn(t, c, ns, "gang").Held(), "3 free pods for a gang of 4: none")
		require.Empty(t, recordIn(t, c, ns, "late").Held(), "the free pods are held back for the gang")
		require.Equal(t, map[string]int{"gang": 4, "": 1}, res.ShortfallByClass)

		a, err = allocator.New(c) // restart
		require.NoError(t, err)
		_, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.Empty(t, recordIn(t, c, ns, "gang").Held())
		require.Empty(t, recordIn(t, c, ns, "late").Held())

		addPod(t, c, ns, "extra")
		res, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.Len(t, recordIn(t, c, ns, "gang").Held(), 4, "served whole")
		for _, g := range res.Allocated {
			if g.Claim.Name == "gang" {
				require.Len(t, g.Pods, 4, "in one hand-out")
			}
		}
		require.Empty(t, recordIn(t, c, ns, "late").Held())
		require.Equal(t, map[string]int{"": 1}, res.ShortfallByClass)
		noPodInTwoRecords(t, c, pool)

		// Releasing one pod of the gang: it keeps the other three, and the
		// next hand-out brings it back to four (the pod it gave back, once
		// recycled, is the only one free).
		given := recordIn(t, c, ns, "gang").Held()[0]
		var g testenv.Claim
		require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "gang"}, &g))
		g.Annotations[syncer.DefaultKeys().Release] = `{"pods":["` + given + `"]}`
		require.NoError(t, c.Update(ctx, &g))
		for range 3 {
			_, err = world.Round(ctx, a, c, pool)
			require.NoError(t, err)
			n := len(recordIn(t, c, ns, "gang").Held())
			require.True(t, n == 3 || n == 4, "the gang holds %d", n)
		}
		require.Len(t, recordIn(t, c, ns, "gang").Held(), 4)
		require.Empty(t, recordIn(t, c, ns, "late").Held(), "the gang, before it, takes the pod back")
	})
}

// TestPlacementGangsWithTwoAllocators: two allocators serve one pool with
// two gangs at once, round after round and concurrently. No gang ever
// holds part of what it wants, and no pod is in two records.
func TestPlacementGangsWithTwoAllocators(t *testing.T) {
	onBoth(t, func(t *testing.T, c client.Client, ns string) {
		ctx := context.Background()
		pool, _ := poolIn(t, c, ns, 4)
		placedClaim(t, c, ns, "g1", 3, testenv.ClaimSpec{Gang: true})
		placedClaim(t, c, ns, "g2", 3, testenv.ClaimSpec{Gang: true})
		a1, err := allocator.New(c)
		require.NoError(t, err)
		a2, err := allocator.New(c)
		require.NoError(t, err)
		whole := func() {
			t.Helper()
			for _, g := range []string{"g1", "g2"} {
				n := len(recordIn(t, c, ns, g).Held())
				require.True(t, n == 0 || n == 3, "gang %s holds %d of 3", g, n)
			}
			noPodInTwoRecords(t, c, pool)
		}
		for range 3 {
			var wg sync.WaitGroup
			for _, a := range []allocator.Allocator{a1, a2} {
				wg.Go(func() { _, _ = world.Round(ctx, a, c, pool) }) // conflicts are expected
			}
			wg.Wait()
			whole()
		}
		// Once the two stop racing, the marks a lost race left behind are
		// removed and one gang is served.
		for range 4 {
			for _, a := range []allocator.Allocator{a1, a2} {
				_, _ = world.Round(ctx, a, c, pool)
				whole()
			}
		}
		served := 0
		for _, g := range []string{"g1", "g2"} {
			if len(recordIn(t, c, ns, g).Held()) == 3 {
				served++
			}
		}
		require.Equal(t, 1, served, "4 pods serve one gang of 3, not both")

		addPod(t, c, ns, "extra-1")
		addPod(t, c, ns, "extra-2")
		for range 3 {
			for _, a := range []allocator.Allocator{a1, a2} {
				_, _ = world.Round(ctx, a, c, pool)
				whole()
			}
		}
		for _, g := range []string{"g1", "g2"} {
			require.Len(t, recordIn(t, c, ns, g).Held(), 3, "gang %s", g)
		}
	})
}

// TestPlacementSpreadAndPack: a spread claim keeps its skew over zones
// and waits for the rest; one that relaxes takes them; the pool's default
// layout applies to claims that leave it; a pack claim fills the zone with
// most free pods first; a restart rebuilds the same placement.
func TestPlacementSpreadAndPack(t *testing.T) {
	onBoth(t, func(t *testing.T, c client.Client, ns string) {
		ctx := context.Background()
		pool, pods := poolIn(t, c, ns, 6)
		zones := map[string]string{}
		for i, p := range pods {
			zone := "a"
			switch i {
			case 4:
				zone = "b"
			case 5:
				zone = "c"
			}
			zones[p.Name] = zone
			labelPod(t, c, ns, p.Name, algorithm.ZoneKey, zone)
		}
		spread := testenv.ClaimSpec{Topology: &testenv.ClaimTopology{Mode: "Spread", Key: algorithm.ZoneKey}}
		placedClaim(t, c, ns, "spread", 5, spread)
		a, err := allocator.New(c)
		require.NoError(t, err)
		res, err := world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		count := func(claim string) map[string]int {
			out := map[string]int{}
			for _, p := range recordIn(t, c, ns, claim).Held() {
				out[zones[p]]++
			}
			return out
		}
		require.Equal(t, map[string]int{"a": 2, "b": 1, "c": 1}, count("spread"), "a third pod in zone a would make the skew 2")
		require.Equal(t, 1, res.Shortfall)

		// A restart keeps it so.
		a, err = allocator.New(c)
		require.NoError(t, err)
		res, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.Empty(t, res.Allocated)
		require.Equal(t, map[string]int{"a": 2, "b": 1, "c": 1}, count("spread"))

		// With the pool's default layout a relaxed spread (the claim
		// leaves its layout to the pool), the rest is taken.
		require.NoError(t, c.Delete(ctx, &testenv.Claim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "spread"}}))
		for range 3 {
			_, err = world.Round(ctx, a, c, pool)
			require.NoError(t, err)
		}
		a, err = allocator.New(c, allocator.WithTopology(algorithm.Topology{Mode: algorithm.TopologySpread, Key: algorithm.ZoneKey, Relax: true}))
		require.NoError(t, err)
		placedClaim(t, c, ns, "relaxed", 5, testenv.ClaimSpec{})
		_, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.Equal(t, map[string]int{"a": 3, "b": 1, "c": 1}, count("relaxed"))
		require.NoError(t, c.Delete(ctx, &testenv.Claim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "relaxed"}}))
		for range 3 {
			_, err = world.Round(ctx, a, c, pool)
			require.NoError(t, err)
		}

		// Pack: zone a has the most free pods.
		placedClaim(t, c, ns, "pack", 3, testenv.ClaimSpec{Topology: &testenv.ClaimTopology{Mode: "Pack", Key: algorithm.ZoneKey}})
		_, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.Equal(t, map[string]int{"a": 3}, count("pack"))
		noPodInTwoRecords(t, c, pool)
	})
}

// TestPlacementInvalidTopologyIsRefused: a claim asking for a negative
// skew is bad input, named, and nothing is handed out.
func TestPlacementInvalidTopologyIsRefused(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool, _ := poolIn(t, c, "ns", 1)
	cl := placedClaim(t, c, "ns", "c", 1, testenv.ClaimSpec{})
	a, err := allocator.New(c)
	require.NoError(t, err)
	in, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	in.Claims[0].Placement.Topology = algorithm.Topology{Mode: algorithm.TopologySpread, MaxSkew: -1}
	_, err = a.Round(ctx, in)
	require.ErrorIs(t, err, allocator.ErrInvalidInput)
	require.ErrorContains(t, err, "ns/c")
	require.ErrorContains(t, err, "max skew")
	require.Empty(t, recordIn(t, c, "ns", cl.Name).Held())

	_, err = allocator.New(c, allocator.WithTopology(algorithm.Topology{Mode: 7}))
	require.ErrorIs(t, err, allocator.ErrInvalidOption)
}

// TestPlacementPackScaleDown: in a pool that packs, a claim fills the
// fewest nodes, and Result.Idle lists first the idle pods on the nodes
// with the fewest pods in use, so that deleting from the front empties
// nodes.
func TestPlacementPackScaleDown(t *testing.T) {
	onBoth(t, func(t *testing.T, c client.Client, ns string) {
		ctx := context.Background()
		pool, _ := poolIn(t, c, ns, 6) // p-i on node-(i mod 3)
		a, err := allocator.New(c, allocator.WithTopology(algorithm.Topology{Mode: algorithm.TopologyPack}))
		require.NoError(t, err)
		placedClaim(t, c, ns, "c", 3, testenv.ClaimSpec{})
		res, err := world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"p-0", "p-3", "p-1"}, recordIn(t, c, ns, "c").Held(), "node-0 whole, then node-1")
		require.Equal(t, []string{"p-2", "p-5", "p-4"}, res.Idle, "node-2 is unused, node-1 has one pod in use")
	})
}

// TestPlacementNodeLabels: with WithNodeLabels a claim spreads over a node
// label the pods lack.
func TestPlacementNodeLabels(t *testing.T) {
	onBoth(t, func(t *testing.T, c client.Client, ns string) {
		ctx := context.Background()
		pool, _ := poolIn(t, c, ns, 6) // p-i on node-(i mod 3)
		racks := map[string]string{"node-0": "r1", "node-1": "r1", "node-2": "r2"}
		a, err := allocator.New(c, allocator.WithNodeLabels(func(node string) map[string]string {
			return map[string]string{"rack": racks[node]}
		}))
		require.NoError(t, err)
		placedClaim(t, c, ns, "c", 4, testenv.ClaimSpec{Topology: &testenv.ClaimTopology{Mode: "Spread", Key: "rack"}})
		_, err = world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		perRack := map[string]int{}
		for _, p := range recordIn(t, c, ns, "c").Held() {
			i, _ := podIndex(p)
			perRack[racks["node-"+strconv.Itoa(i%3)]]++
		}
		require.Equal(t, map[string]int{"r1": 2, "r2": 2}, perRack)
	})
	_, err := allocator.New(newFakeClient(t, nil), allocator.WithNodeLabels(nil))
	require.ErrorIs(t, err, allocator.ErrInvalidOption)
}
