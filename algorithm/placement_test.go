package algorithm_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolalloc/poolalloc/algorithm"
)

// pod is a candidate on node in zone with labels kv ("k=v" pairs).
func pod(name, node, zone string, kv ...string) algorithm.Candidate {
	l := labels.Set{}
	for i := 0; i+1 < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return algorithm.Candidate{Name: name, Node: node, Zone: zone, Labels: l}
}

func req(uid string, want int, pl algorithm.Placement) algorithm.Request {
	return algorithm.Request{UID: types.UID(uid), Claim: types.NamespacedName{Namespace: "ns", Name: uid}, Want: want, Created: t0, Placement: pl}
}

func granted(act algorithm.Action, uid string) []string {
	for _, g := range act.Allocate {
		if g.UID == types.UID(uid) {
			return g.Pods
		}
	}
	return nil
}

func TestSelectorAndShortfallByClass(t *testing.T) {
	size := func(s string) algorithm.Placement {
		return algorithm.Placement{Selector: labels.SelectorFromSet(labels.Set{"size": s}), Class: s}
	}
	for _, s := range strategies {
		t.Run(s.name, func(t *testing.T) {
			act, err := s.alg.Plan(algorithm.Input{
				Candidates: []algorithm.Candidate{pod("s-1", "n1", "", "size", "small"), pod("l-1", "n1", "", "size", "large"), pod("s-2", "n2", "", "size", "small")},
				Requests:   []algorithm.Request{req("a", 3, size("large")), req("b", 1, size("small"))},
			})
			require.NoError(t, err)
			require.Equal(t, []string{"l-1"}, granted(act, "a"))
			require.Equal(t, []string{"s-1"}, granted(act, "b"))
			require.Equal(t, 2, act.Shortfall)
			require.Equal(t, map[string]int{"large": 2}, act.ShortfallByClass, "the caller learns it must create large pods, not just two")
		})
	}
}

func TestSpreadKeepsTheSkewOrWaits(t *testing.T) {
	zones := []algorithm.Candidate{
		pod("a-1", "n1", "a"), pod("a-2", "n1", "a"), pod("a-3", "n1", "a"), pod("b-1", "n2", "b"),
	}
	spread := algorithm.Placement{Topology: algorithm.Topology{Mode: algorithm.TopologySpread, Key: algorithm.ZoneKey}}
	for _, s := range strategies {
		t.Run(s.name, func(t *testing.T) {
			act, err := s.alg.Plan(algorithm.Input{Candidates: zones, Requests: []algorithm.Request{req("c", 4, spread)}})
			require.NoError(t, err)
			require.ElementsMatch(t, []string{"a-1", "b-1", "a-2"}, granted(act, "c"), "zone b has one pod: a third in zone a would make the skew 2")
			require.Equal(t, 1, act.Shortfall)

			relaxed := spread
			relaxed.Topology.Relax = true
			act, err = s.alg.Plan(algorithm.Input{Candidates: zones, Requests: []algorithm.Request{req("c", 4, relaxed)}})
			require.NoError(t, err)
			require.Len(t, granted(act, "c"), 4)
		})
	}
}

// TestSpreadRelaxTakesPodsPassedOverEarlier pins a case the conformance
// suite found: a Spread claim with Relax took a pod in one domain, passed
// over a second pod there in the same scan, and never came back for it,
// leaving it free while the claim was short.
func TestSpreadRelaxTakesPodsPassedOverEarlier(t *testing.T) {
	pl := algorithm.Placement{Topology: algorithm.Topology{Mode: algorithm.TopologySpread, Key: "rack", Relax: true}}
	for _, s := range strategies {
		t.Run(s.name, func(t *testing.T) {
			act, err := s.alg.Plan(algorithm.Input{
				Candidates: []algorithm.Candidate{pod("p-1", "", "", "rack", "r1"), pod("p-2", "", "", "rack", "r1"), pod("p-3", "", "", "rack", "r3")},
				Requests:   []algorithm.Request{req("c", 3, pl)},
			})
			require.NoError(t, err)
			require.ElementsMatch(t, []string{"p-1", "p-2", "p-3"}, granted(act, "c"))
			require.Zero(t, act.Shortfall)
		})
	}
}

func TestSpreadCountsHeldPods(t *testing.T) {
	spread := algorithm.Placement{Topology: algorithm.Topology{Mode: algorithm.TopologySpread}}
	r := req("c", 3, spread)
	r.Held = []string{"h-1"}
	r.HeldPods = []algorithm.Candidate{pod("h-1", "n1", "")}
	act, err := algorithm.Packed{}.Plan(algorithm.Input{
		Candidates: []algorithm.Candidate{pod("x-1", "n1", ""), pod("y-1", "n2", ""), pod("z-1", "n3", "")},
		Requests:   []algorithm.Request{r},
	})
	require.NoError(t, err)
	require.Equal(t, []string{"y-1", "z-1"}, granted(act, "c"), "n1 holds a pod of the claim already")
}

func TestPackFillsTheFewestNodes(t *testing.T) {
	pack := algorithm.Placement{Topology: algorithm.Topology{Mode: algorithm.TopologyPack}}
	r := req("c", 3, pack)
	r.Held = []string{"h-1"}
	r.HeldPods = []algorithm.Candidate{pod("h-1", "n3", "")}
	act, err := algorithm.Spread{}.Plan(algorithm.Input{
		Candidates: []algorithm.Candidate{pod("a-1", "n1", ""), pod("b-1", "n2", ""), pod("b-2", "n2", ""), pod("b-3", "n2", ""), pod("c-1", "n3", "")},
		Requests:   []algorithm.Request{r},
	})
	require.NoError(t, err)
	require.Equal(t, []string{"c-1", "b-1"}, granted(act, "c"), "first the node it is on, then the node with the most free pods")
}

// TestGangHoldsBackWhatItNeeds: a gang that cannot be served takes
// nothing, and claims after it cannot take the pods it would get, so a
// stream of small claims cannot starve it; claims before it come first.
func TestGangHoldsBackWhatItNeeds(t *testing.T) {
	gang := algorithm.Placement{Gang: true}
	for _, s := range strategies {
		t.Run(s.name, func(t *testing.T) {
			first := req("first", 1, algorithm.Placement{})
			g := req("gang", 3, gang)
			g.Created = t0.Add(1)
			small := req("small", 2, algorithm.Placement{})
			small.Created = t0.Add(2)
			act, err := s.alg.Plan(algorithm.Input{
				Candidates: candidates("p-1", "p-2", "p-3"),
				Requests:   []algorithm.Request{small, g, first},
			})
			require.NoError(t, err)
			require.Equal(t, []string{"p-1"}, granted(act, "first"))
			require.Nil(t, granted(act, "gang"), "two of three: all or nothing")
			require.Nil(t, granted(act, "small"), "the two free pods are held back for the gang before it")
			require.Equal(t, 5, act.Shortfall)

			// One more pod: the gang is served whole.
			act, err = s.alg.Plan(algorithm.Input{
				Candidates: candidates("p-1", "p-2", "p-3", "p-4"),
				Requests:   []algorithm.Request{small, g, first},
			})
			require.NoError(t, err)
			require.Len(t, granted(act, "gang"), 3)
		})
	}
}

func TestValidatePlacement(t *testing.T) {
	bad := req("c", 1, algorithm.Placement{Topology: algorithm.Topology{Mode: 9}})
	require.ErrorIs(t, algorithm.Validate(algorithm.Input{Requests: []algorithm.Request{bad}}), algorithm.ErrInvalidInput)
	bad = req("c", 1, algorithm.Placement{Topology: algorithm.Topology{Mode: algorithm.TopologySpread, MaxSkew: -1}})
	require.ErrorIs(t, algorithm.Validate(algorithm.Input{Requests: []algorithm.Request{bad}}), algorithm.ErrInvalidInput)
	bad = req("c", 1, algorithm.Placement{})
	bad.Held, bad.HeldPods = []string{"a"}, []algorithm.Candidate{{Name: "b"}}
	require.ErrorIs(t, algorithm.Validate(algorithm.Input{Requests: []algorithm.Request{bad}}), algorithm.ErrInvalidInput)
}

func TestDomainFallsBackToNodeLabels(t *testing.T) {
	c := pod("p", "n1", "", "rack", "pod-rack")
	c.NodeLabels = labels.Set{"rack": "node-rack", "row": "r7", algorithm.ZoneKey: "z"}
	for key, want := range map[string]string{"rack": "pod-rack", "row": "r7", algorithm.NodeKey: "n1", algorithm.ZoneKey: "z"} {
		got, ok := c.Domain(key)
		require.True(t, ok, key)
		require.Equal(t, want, got, key)
	}
	_, ok := c.Domain("missing")
	require.False(t, ok)
	sel := algorithm.Placement{Selector: labels.SelectorFromSet(labels.Set{"row": "r7"})}
	require.False(t, sel.Matches(&c), "selectors match the pod's own labels only")
}
