package allocator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/internal/testenv"
)

// A recovery finds each pod's place on its own core for a range of pods
// (placesOf): pods on one node with equal labels share one place, in
// whichever range they are; pods that differ in node or in any label do
// not; a place's labels and zone are its pods'.
func TestRecoveryPlacesArePerNodeAndLabelSet(t *testing.T) {
	sets := []map[string]string{
		{"app": "a", ZoneLabel: "z1"},
		{"app": "a", ZoneLabel: "z2"},
		{"app": "b"},
		nil,
		{}, // the same set as nil: no labels
	}
	const n = 4 * minSplit // several ranges on a machine with cores
	pods := make([]corev1.Pod, n)
	for i := range pods {
		p := &pods[i]
		p.Name, p.Namespace, p.UID = fmt.Sprintf("p-%04d", i), "ns", types.UID(fmt.Sprintf("uid-%04d", i))
		p.ResourceVersion = "1"
		p.Spec.NodeName = fmt.Sprintf("node-%d", i%3)
		p.Labels = maps.Clone(sets[(i/7)%len(sets)]) // runs of equal sets, then changes
		if i%97 == 0 {
			p.Labels = map[string]string{"app": "a", "only": p.Name} // a set of its own
		}
	}
	scheme, err := testenv.NewScheme()
	require.NoError(t, err)
	al, err := New(fake.NewClientBuilder().WithScheme(scheme).Build())
	require.NoError(t, err)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	_, err = al.Round(context.Background(), Input{Pool: pool, Pods: pods})
	require.NoError(t, err)
	p := al.(*defaultAllocator).pools[pool]

	type at struct{ node, labels string }
	keyOf := func(node string, l map[string]string) at {
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(l)) {
			fmt.Fprintf(&b, "%s=%s,", k, l[k])
		}
		return at{node, b.String()}
	}
	placeOf := map[at]*podPlace{}
	for i := range pods {
		pod := &pods[i]
		pi := p.pods.Get(pod.Name)
		require.NotNil(t, pi, pod.Name)
		pl := pi.place
		require.NotNil(t, pl, pod.Name)
		require.Equal(t, pod.Spec.NodeName, pl.node, pod.Name)
		require.True(t, maps.Equal(pl.labels, podLabels(pod.Labels)), "%s: place labels %v, pod labels %v", pod.Name, pl.labels, pod.Labels)
		require.Equal(t, pod.Labels[ZoneLabel], pl.zone, pod.Name)
		k := keyOf(pod.Spec.NodeName, pod.Labels)
		if seen, ok := placeOf[k]; ok {
			require.Same(t, seen, pl, "%s: a second place for %v", pod.Name, k)
		} else {
			placeOf[k] = pl
		}
		// The pool finds the same place for the pod's node and labels.
		require.Same(t, pl, p.findPlace(p.placeKey(pod.Spec.NodeName, pod.Labels), pod.Spec.NodeName, pod.Labels), pod.Name)
	}
	distinct := map[*podPlace]bool{}
	for _, pl := range placeOf {
		distinct[pl] = true
	}
	require.Len(t, distinct, len(placeOf), "two (node, labels) pairs share a place")
}

// keys makes each key a string of its own parts, across the ends of its
// blocks, and a block's earlier keys keep their bytes as later ones are
// written.
func TestKeysJoin(t *testing.T) {
	var ks keys
	var got, want []string
	for i := range 3000 {
		a, c := fmt.Sprintf("name-%d", i), strings.Repeat("u", i%40)
		if i == 1500 {
			c = strings.Repeat("x", keyBlock+10) // longer than a block
		}
		got = append(got, ks.join(a, "/", c))
		want = append(want, a+"/"+c)
	}
	require.Equal(t, want, got)
}
