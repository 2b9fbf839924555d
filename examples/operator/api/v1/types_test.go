package v1

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/poolalloc/poolalloc/algorithm"
)

func TestClaimDeepCopy(t *testing.T) {
	c := NewClaim("ns", "c", "pool", 1)
	c.Labels = map[string]string{"a": "b"}
	c.Spec.Selector = map[string]string{"size": "large"}
	c.Spec.Topology = &ClaimTopology{Mode: "Spread", Key: "zone"}
	c.Status = map[string]any{"m": map[string]any{"x": 1}, "s": []any{"y"}}
	d := c.DeepCopy()
	d.Labels["a"] = "changed"
	d.Spec.Selector["size"] = "small"
	d.Spec.Topology.Key = "node"
	d.Status["m"].(map[string]any)["x"] = 2
	d.Status["s"].([]any)[0] = "z"
	require.Equal(t, "b", c.Labels["a"])
	require.Equal(t, "large", c.Spec.Selector["size"])
	require.Equal(t, "zone", c.Spec.Topology.Key)
	require.Equal(t, 1, c.Status["m"].(map[string]any)["x"])
	require.Equal(t, "y", c.Status["s"].([]any)[0])

	list := &ClaimList{Items: []Claim{*c}}
	l2 := list.DeepCopyObject().(*ClaimList)
	l2.Items[0].Labels["a"] = "changed"
	require.Equal(t, "b", c.Labels["a"], "ClaimList.DeepCopyObject shares items")
	require.Nil(t, (*Claim)(nil).DeepCopy())
	require.Nil(t, (*ClaimList)(nil).DeepCopy())
}

func TestPlacement(t *testing.T) {
	require.Equal(t, algorithm.Placement{}, ClaimSpec{PoolRef: "p", Replicas: 2}.Placement())
	pl := ClaimSpec{
		Selector: map[string]string{"size": "large"},
		Class:    "large",
		Gang:     true,
		Topology: &ClaimTopology{Mode: "Spread", Key: "zone", MaxSkew: 1, Relax: true},
	}.Placement()
	require.True(t, pl.Selector.Matches(labels.Set{"size": "large", "other": "x"}))
	require.False(t, pl.Selector.Matches(labels.Set{"size": "small"}))
	require.Equal(t, "large", pl.Class)
	require.True(t, pl.Gang)
	require.Equal(t, algorithm.Topology{Mode: algorithm.TopologySpread, Key: "zone", MaxSkew: 1, Relax: true}, pl.Topology)
	for mode, want := range map[string]algorithm.TopologyMode{"Any": algorithm.TopologyAny, "Pack": algorithm.TopologyPack, "": algorithm.TopologyDefault} {
		require.Equal(t, want, ClaimSpec{Topology: &ClaimTopology{Mode: mode}}.Placement().Topology.Mode, mode)
	}
}
