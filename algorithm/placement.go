package algorithm

import (
	"fmt"

	"k8s.io/apimachinery/pkg/labels"
)

// Placement is where a claim's pods may run and how they are handed to
// it. The zero Placement places nothing: any pod of the pool, handed out
// one at a time as it becomes free.
type Placement struct {
	// Selector limits the pods the claim may be given to those whose
	// labels it matches. Nil (or empty) matches every pod.
	Selector labels.Selector
	// Class names the kind of pod the claim needs, as the caller creates
	// them (a pod template, a size): the demand a claim leaves unmet is
	// reported under it in Action.ShortfallByClass, so that the caller
	// knows which pods to create. Claims of one class should have the same
	// Selector.
	Class string
	// Topology says how the claim's pods are laid out over a topology
	// domain (node, zone, or the value of any pod label).
	Topology Topology
	// Gang makes the claim all or nothing: a claim that holds fewer pods
	// than it wants is given everything it lacks at once, or nothing
	// (every strategy must keep this; package allocator refuses a plan
	// that does not). With Packed and Spread, a gang that cannot be served
	// holds back, from every claim after it in the order of Less, the free
	// pods it would get (at most what it lacks), so that a stream of
	// claims after it cannot starve it. Claims before it are served first,
	// as always.
	Gang bool
}

// TopologyMode is how a claim's pods are laid out over topology domains.
type TopologyMode uint8

const (
	// TopologyDefault is a mode left unset: the caller's default (package
	// allocator uses the pool's, WithTopology). A strategy treats it as
	// TopologyAny.
	TopologyDefault TopologyMode = iota
	// TopologyAny takes pods in the pool's order, wherever they run.
	TopologyAny
	// TopologySpread spreads the claim's pods evenly over the domains of
	// Topology.Key: each pod goes to a domain holding the fewest of the
	// claim's pods.
	TopologySpread
	// TopologyPack packs the claim's pods onto as few domains as
	// possible: first the domains already holding its pods, then the
	// domains with the most free pods it may take.
	TopologyPack
)

// String returns the mode's name.
func (m TopologyMode) String() string {
	switch m {
	case TopologyDefault:
		return "Default"
	case TopologyAny:
		return "Any"
	case TopologySpread:
		return "Spread"
	case TopologyPack:
		return "Pack"
	}
	return fmt.Sprintf("TopologyMode(%d)", uint8(m))
}

// Well-known topology keys. Candidate.Domain reads NodeKey from
// Candidate.Node and ZoneKey from Candidate.Zone; any other key from the
// pod's labels.
const (
	NodeKey = "kubernetes.io/hostname"
	ZoneKey = "topology.kubernetes.io/zone"
)

// Topology is a claim's layout over topology domains, after Kubernetes'
// topology spread constraints.
type Topology struct {
	// Mode is the layout; TopologyDefault and TopologyAny ignore the
	// other fields.
	Mode TopologyMode
	// Key names the domains: NodeKey (the default when empty), ZoneKey,
	// or a label of the pod or, failing that, of its node. A pod without it is in no domain: it is taken only
	// by a Pack claim or a Spread claim with Relax, after every pod that
	// is in one.
	Key string
	// MaxSkew bounds, for TopologySpread, how many more of the claim's
	// pods one domain may hold than another. 0 means 1. The domains
	// counted are those holding a pod of the claim and those with a free
	// pod the claim may take (its Selector), whether or not another claim
	// takes that pod in the same plan.
	MaxSkew int
	// Relax, for TopologySpread, hands out pods that break MaxSkew when
	// no others are left (Kubernetes' ScheduleAnyway), still each to a
	// domain holding the fewest of the claim's pods. Without it the claim
	// waits for pods that keep the skew (DoNotSchedule): the demand left
	// is its shortfall.
	Relax bool
}

// key is t's topology key.
func (t Topology) key() string {
	if t.Key == "" {
		return NodeKey
	}
	return t.Key
}

// maxSkew is t's maximum skew.
func (t Topology) maxSkew() int { return max(1, t.MaxSkew) }

// Domain returns the domain of key the candidate is in, and false if it is
// in none: NodeKey is its Node, ZoneKey its Zone; any key is then looked
// up in its Labels, then in its NodeLabels.
func (c *Candidate) Domain(key string) (string, bool) {
	switch key {
	case "", NodeKey:
		return c.Node, c.Node != ""
	case ZoneKey:
		if c.Zone != "" {
			return c.Zone, true
		}
	}
	if c.Labels != nil {
		if v, ok := c.Labels.Lookup(key); ok {
			return v, true
		}
	}
	if c.NodeLabels != nil {
		return c.NodeLabels.Lookup(key)
	}
	return "", false
}

// Matches reports whether the placement's Selector matches the
// candidate's labels.
func (p *Placement) Matches(c *Candidate) bool {
	if p.Selector == nil || p.Selector.Empty() {
		return true
	}
	l := c.Labels
	if l == nil {
		l = labels.Set(nil)
	}
	return p.Selector.Matches(l)
}

// Validate reports a topology whose mode is unknown or whose MaxSkew is
// negative.
func (t Topology) Validate() error {
	switch {
	case t.Mode > TopologyPack:
		return fmt.Errorf("unknown topology mode %d", t.Mode)
	case t.MaxSkew < 0:
		return fmt.Errorf("negative topology max skew %d", t.MaxSkew)
	}
	return nil
}

// validate checks the placement of request r.
func (p *Placement) validate(r *Request) error {
	if err := p.Topology.Validate(); err != nil {
		return fmt.Errorf("%w: claim %s: %w", ErrInvalidInput, r.Claim, err)
	}
	if len(r.HeldPods) > 0 {
		if len(r.HeldPods) != len(r.Held) {
			return fmt.Errorf("%w: claim %s: %d held pods described for %d held", ErrInvalidInput, r.Claim, len(r.HeldPods), len(r.Held))
		}
		for i := range r.HeldPods {
			if r.HeldPods[i].Name != r.Held[i] {
				return fmt.Errorf("%w: claim %s: held pod %d described as %q, held as %q", ErrInvalidInput, r.Claim, i, r.HeldPods[i].Name, r.Held[i])
			}
		}
	}
	return nil
}
