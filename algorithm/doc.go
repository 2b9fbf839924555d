// Package algorithm decides which free pods of a pool go to which claims.
//
// An Algorithm is a pure function: it gets the pool's free pods
// (Candidates) and the claims whose holdings may change (Requests), and
// returns an Action: pods to allocate per claim, pods to give back per
// claim, and the Shortfall, the pods the pool still has to create. It
// imports no Kubernetes client and persists nothing; the caller (normally
// package allocator) commits the Action and only then treats it as real.
//
// Two strategies come with the package. Packed fills claims one at a time;
// Spread deals one pod per claim per turn. Both serve requests in the order
// given by Less (priority, then age, then arrival, then name) and both release the pods a
// claim's owner gave back plus any surplus over what the claim wants.
//
// A request's Placement limits and lays out its pods: a label Selector, a
// Class its unmet demand is reported under (Action.ShortfallByClass), a
// Topology (TopologySpread over a domain key with a MaxSkew, waited for or
// relaxed; TopologyPack) and Gang (all or nothing; a waiting gang holds
// back from later requests the pods it would get). Packed and Spread name
// how pods are dealt among requests; TopologySpread and TopologyPack how
// one request's pods are laid out over domains. Both strategies honour
// every placement.
//
//	act, err := algorithm.Packed{}.Plan(algorithm.Input{
//		Candidates: []algorithm.Candidate{{Name: "pod-a"}, {Name: "pod-b"}},
//		Requests:   []algorithm.Request{{UID: "u1", Claim: claim, Want: 1}},
//	})
//
// Package algorithmtest holds a conformance suite for any Algorithm.
package algorithm
