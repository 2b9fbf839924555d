package algorithmtest

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime/debug"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"

	"github.com/poolalloc/poolalloc/algorithm"
)

// Run checks alg against the contract of algorithm.Algorithm, in subtests
// of t. It fails t on the first broken property and logs the input that
// broke it. See the package documentation for the list of properties.
func Run(t *testing.T, alg algorithm.Algorithm) {
	t.Helper()
	t.Run("Properties", func(t *testing.T) {
		rapid.Check(t, func(rt *rapid.T) { checkProperties(rt, alg) })
	})
	t.Run("EmptyInput", func(t *testing.T) {
		for _, c := range []struct {
			name string
			in   algorithm.Input
		}{
			{"zero", algorithm.Input{}},
			{"empty slices", algorithm.Input{Candidates: []algorithm.Candidate{}, Requests: []algorithm.Request{}}},
			{"no requests", algorithm.Input{Candidates: []algorithm.Candidate{{Name: "pod-a"}, {Name: "pod-b"}}}},
		} {
			name := c.name
			o := call(alg, c.in)
			if o.panic != "" {
				t.Fatalf("%s: Plan panicked: %s", name, o.panic)
			}
			if o.err != nil {
				t.Fatalf("%s: Plan returned error %v, want none", name, o.err)
			}
			if len(o.act.Allocate) != 0 || len(o.act.Release) != 0 || o.act.Shortfall != 0 {
				t.Fatalf("%s: Plan returned %+v, want the zero Action", name, o.act)
			}
		}
	})
	t.Run("InvalidInput", func(t *testing.T) {
		for _, c := range invalidInputs() {
			t.Run(c.name, func(t *testing.T) {
				if err := algorithm.Validate(c.in); !errors.Is(err, algorithm.ErrInvalidInput) {
					t.Fatalf("algorithmtest bug: Validate(%+v) = %v, want ErrInvalidInput", c.in, err)
				}
				orig := cloneInput(c.in)
				o := call(alg, c.in)
				switch {
				case o.panic != "":
					t.Fatalf("Plan panicked on invalid input %+v: %s", orig, o.panic)
				case o.err != nil && !errors.Is(o.err, algorithm.ErrInvalidInput):
					t.Fatalf("Plan(%+v) returned error %v, which does not wrap ErrInvalidInput", orig, o.err)
				case o.err == nil:
					if err := checkSafe(orig, o.act); err != nil {
						t.Fatalf("Plan(%+v) = %+v: %v", orig, o.act, err)
					}
				}
				if !reflect.DeepEqual(c.in, orig) {
					t.Fatalf("Plan modified its input:\nbefore %+v\nafter  %+v", orig, c.in)
				}
			})
		}
	})
}

// InputGen generates inputs that pass algorithm.Validate: 0 to 30
// candidates on a few nodes and zones, and 0 to 8 requests, each with Want
// 0 to 6, up to 8 held pods of which the owner releases some, a priority
// and a creation time. Pod names are unique across the input and come in
// random order; claim names, priorities and times repeat often, so that
// ties in the order of requests are common.
func InputGen() *rapid.Generator[algorithm.Input] {
	return rapid.Custom(func(t *rapid.T) algorithm.Input {
		nCand := rapid.IntRange(0, 30).Draw(t, "candidates")
		nReq := rapid.IntRange(0, 8).Draw(t, "requests")
		nHeld := make([]int, nReq)
		total := nCand
		for i := range nHeld {
			nHeld[i] = rapid.IntRange(0, 8).Draw(t, "held")
			total += nHeld[i]
		}
		names := make([]string, total)
		for i := range names {
			names[i] = fmt.Sprintf("pod-%03d", i)
		}
		names = rapid.Permutation(names).Draw(t, "names")

		var in algorithm.Input
		if nCand > 0 {
			in.Candidates = make([]algorithm.Candidate, nCand)
		}
		for i := range in.Candidates {
			in.Candidates[i] = genCandidate(t, names[i])
		}
		names = names[nCand:]
		base := time.Date(2025, time.January, 1, 0, 0, 0, 0, time.UTC)
		if nReq > 0 {
			in.Requests = make([]algorithm.Request, nReq)
		}
		for i := range in.Requests {
			r := algorithm.Request{
				UID: types.UID(fmt.Sprintf("uid-%d", i)),
				Claim: types.NamespacedName{
					Namespace: rapid.SampledFrom([]string{"ns-a", "ns-b"}).Draw(t, "namespace"),
					Name:      fmt.Sprintf("claim-%d", rapid.IntRange(0, 3).Draw(t, "claim")),
				},
				Want:     rapid.IntRange(0, 6).Draw(t, "want"),
				Priority: rapid.Int32Range(-1, 2).Draw(t, "priority"),
				Created:  base.Add(time.Duration(rapid.IntRange(0, 3).Draw(t, "age")) * time.Minute),
				Arrival:  rapid.Uint64Range(0, 3).Draw(t, "arrival"),
			}
			if nHeld[i] > 0 {
				r.Held = slices.Clone(names[:nHeld[i]])
				names = names[nHeld[i]:]
				for _, p := range rapid.Permutation(r.Held).Draw(t, "release order") {
					if rapid.Bool().Draw(t, "released") {
						r.Release = append(r.Release, p)
					}
				}
			}
			r.Placement = genPlacement(t)
			if len(r.Held) > 0 && (r.Placement.Topology.Mode > algorithm.TopologyAny || rapid.Bool().Draw(t, "describe held")) {
				for _, name := range r.Held {
					r.HeldPods = append(r.HeldPods, genCandidate(t, name))
				}
			}
			in.Requests[i] = r
		}
		return in
	})
}

// genCandidate draws a candidate named name: on a few nodes, zones and
// racks (a pod label, or its node's), of two sizes (a pod label), some
// lacking a label.
func genCandidate(t *rapid.T, name string) algorithm.Candidate {
	c := algorithm.Candidate{
		Name: name,
		Node: rapid.SampledFrom([]string{"", "node-a", "node-b", "node-c"}).Draw(t, "node"),
		Zone: rapid.SampledFrom([]string{"", "zone-1", "zone-2"}).Draw(t, "zone"),
	}
	l := labels.Set{}
	if size := rapid.SampledFrom([]string{"", "small", "large"}).Draw(t, "size"); size != "" {
		l["size"] = size
	}
	if rack := rapid.SampledFrom([]string{"", "rack-1", "rack-2", "rack-3"}).Draw(t, "rack"); rack != "" {
		l["rack"] = rack
	}
	if len(l) > 0 || rapid.Bool().Draw(t, "empty labels") {
		c.Labels = l
	}
	if rack := rapid.SampledFrom([]string{"", "rack-1", "rack-2"}).Draw(t, "node rack"); rack != "" {
		c.NodeLabels = labels.Set{"rack": rack} // used where the pod has no rack label
	}
	return c
}

// genPlacement draws a placement: often none, else a selector on size, a
// class, a topology over node, zone or rack, and all or nothing.
func genPlacement(t *rapid.T) algorithm.Placement {
	var pl algorithm.Placement
	if !rapid.Bool().Draw(t, "placed") {
		return pl
	}
	if size := rapid.SampledFrom([]string{"", "small", "large"}).Draw(t, "selector"); size != "" {
		pl.Selector = labels.SelectorFromSet(labels.Set{"size": size})
		pl.Class = size
	}
	pl.Topology = algorithm.Topology{
		Mode:    algorithm.TopologyMode(rapid.IntRange(0, 3).Draw(t, "topology")),
		Key:     rapid.SampledFrom([]string{"", algorithm.NodeKey, algorithm.ZoneKey, "rack"}).Draw(t, "key"),
		MaxSkew: rapid.IntRange(0, 2).Draw(t, "max skew"),
		Relax:   rapid.Bool().Draw(t, "relax"),
	}
	pl.Gang = rapid.Bool().Draw(t, "gang")
	return pl
}

// checkProperties plans a random valid input and checks every property.
func checkProperties(t *rapid.T, alg algorithm.Algorithm) {
	in := InputGen().Draw(t, "input")
	if err := algorithm.Validate(in); err != nil {
		t.Fatalf("algorithmtest bug: generated invalid input: %v", err)
	}
	other := InputGen().Draw(t, "other input")
	orig := cloneInput(in)
	first, second := cloneInput(in), cloneInput(in)

	o := call(alg, first)
	if o.panic != "" {
		t.Fatalf("Plan panicked on valid input: %s", o.panic)
	}
	if o.err != nil {
		t.Fatalf("Plan returned error on valid input: %v", o.err)
	}
	act := o.act

	// Determinism, also across a call on another input in between.
	if o := call(alg, other); o.panic != "" {
		t.Fatalf("Plan panicked on valid input %+v: %s", other, o.panic)
	}
	o = call(alg, second)
	if o.panic != "" || o.err != nil {
		t.Fatalf("second Plan on the same input failed: panic %q, error %v", o.panic, o.err)
	}
	if !reflect.DeepEqual(act, o.act) {
		t.Fatalf("Plan is not deterministic:\nfirst  %+v\nsecond %+v", act, o.act)
	}
	for name, got := range map[string]algorithm.Input{"first": first, "second": second} {
		if !reflect.DeepEqual(got, orig) {
			t.Fatalf("Plan modified its input (%s call):\nbefore %+v\nafter  %+v", name, orig, got)
		}
	}

	if err := checkAction(orig, act); err != nil {
		t.Fatalf("%v\naction %+v", err, act)
	}

	// The Action must share no backing array with the input: overwrite
	// every pod name it returned and look for the change in the input.
	for _, grants := range [][]algorithm.Grant{act.Allocate, act.Release} {
		for i := range grants {
			for j := range grants[i].Pods {
				grants[i].Pods[j] = "overwritten-by-algorithmtest"
			}
		}
	}
	if !reflect.DeepEqual(first, orig) {
		t.Fatalf("the Action shares memory with the input: writing to its slices changed the input to %+v", first)
	}
}

// checkAction returns an error describing the first property of the
// Algorithm contract that act, planned for the valid input in, breaks.
func checkAction(in algorithm.Input, act algorithm.Action) error {
	cands := make(map[string]bool, len(in.Candidates))
	for _, c := range in.Candidates {
		cands[c.Name] = true
	}
	reqs := make(map[types.UID]*algorithm.Request, len(in.Requests))
	totalNeed := 0
	for i := range in.Requests {
		r := &in.Requests[i]
		reqs[r.UID] = r
		totalNeed += need(r)
	}

	allocated := make(map[types.UID]int)
	owner := make(map[string]types.UID) // allocated pod → claim
	total := 0
	for _, g := range act.Allocate {
		r, err := grantFor(reqs, g, "Allocate")
		if err != nil {
			return err
		}
		if _, dup := allocated[g.UID]; dup {
			return fmt.Errorf("claim %s (UID %s) has two Allocate grants", g.Claim, g.UID)
		}
		for _, p := range g.Pods {
			if !cands[p] {
				return fmt.Errorf("claim %s: allocated pod %q is not a candidate", g.Claim, p)
			}
			if prev, dup := owner[p]; dup {
				return fmt.Errorf("pod %q allocated twice (to UIDs %s and %s)", p, prev, g.UID)
			}
			owner[p] = g.UID
		}
		if n := need(r); len(g.Pods) > n {
			return fmt.Errorf("claim %s: allocated %d pods, more than its need %d", g.Claim, len(g.Pods), n)
		}
		allocated[g.UID] = len(g.Pods)
		total += len(g.Pods)
	}

	released := make(map[types.UID][]string)
	for _, g := range act.Release {
		r, err := grantFor(reqs, g, "Release")
		if err != nil {
			return err
		}
		if _, dup := released[g.UID]; dup {
			return fmt.Errorf("claim %s (UID %s) has two Release grants", g.Claim, g.UID)
		}
		seen := make(map[string]bool, len(g.Pods))
		for _, p := range g.Pods {
			if !slices.Contains(r.Held, p) {
				return fmt.Errorf("claim %s: released pod %q is not held by it", g.Claim, p)
			}
			if seen[p] {
				return fmt.Errorf("claim %s: pod %q released twice", g.Claim, p)
			}
			seen[p] = true
		}
		released[g.UID] = g.Pods
	}

	for i := range in.Requests {
		r := &in.Requests[i]
		rel := released[r.UID]
		for _, p := range r.Release {
			if !slices.Contains(rel, p) {
				return fmt.Errorf("claim %s: pod %q released by its owner is not in the Release grant", r.Claim, p)
			}
		}
		kept := len(r.Held) - len(rel)
		if kept > r.Want {
			return fmt.Errorf("claim %s: keeps %d held pods after the action, more than Want %d", r.Claim, kept, r.Want)
		}
		if floor := min(r.Want, len(r.Held)-len(r.Release)); kept < floor {
			return fmt.Errorf("claim %s: keeps %d held pods after the action, takes away pods it still wants (Want %d)", r.Claim, kept, r.Want)
		}
		if after := kept + allocated[r.UID]; after > r.Want {
			return fmt.Errorf("claim %s: holds %d pods after the action, more than Want %d", r.Claim, after, r.Want)
		}
	}

	if want := totalNeed - total; act.Shortfall != want {
		return fmt.Errorf("shortfall %d, want %d (total need %d, allocated %d)", act.Shortfall, want, totalNeed, total)
	}
	return checkPlacement(in, act, owner, allocated)
}

// checkPlacement returns an error describing the first placement property
// act breaks: a pod outside its claim's selector, a gang served in part,
// a spread beyond its skew, a claim left short while pods it may take
// stay free (beyond what gangs before it hold back), a gang left waiting
// while enough such pods were left for it, or a shortfall by class that
// does not add up.
func checkPlacement(in algorithm.Input, act algorithm.Action, owner map[string]types.UID, allocated map[types.UID]int) error {
	cands := make(map[string]*algorithm.Candidate, len(in.Candidates))
	for i := range in.Candidates {
		cands[in.Candidates[i].Name] = &in.Candidates[i]
	}
	grants := make(map[types.UID][]string)
	for _, g := range act.Allocate {
		grants[g.UID] = g.Pods
	}
	released := make(map[types.UID][]string)
	for _, g := range act.Release {
		released[g.UID] = g.Pods
	}
	byClass := make(map[string]int)
	order := make([]*algorithm.Request, len(in.Requests))
	for i := range in.Requests {
		order[i] = &in.Requests[i]
	}
	slices.SortStableFunc(order, func(a, b *algorithm.Request) int {
		switch {
		case algorithm.Less(a, b):
			return -1
		case algorithm.Less(b, a):
			return 1
		}
		return 0
	})
	before := make(map[types.UID]bool) // requests earlier in the order than the one looked at
	held := 0                          // what unserved gangs earlier in the order may hold back
	for _, r := range order {
		pl := &r.Placement
		n := need(r)
		got := grants[r.UID]
		for _, p := range got {
			if !pl.Matches(cands[p]) {
				return fmt.Errorf("claim %s: allocated pod %q, which its selector %v does not match", r.Claim, p, pl.Selector)
			}
		}
		if pl.Gang && len(got) != 0 && len(got) != n {
			return fmt.Errorf("claim %s: a gang lacking %d pods got %d", r.Claim, n, len(got))
		}
		spreadWait := pl.Topology.Mode == algorithm.TopologySpread && !pl.Topology.Relax
		if spreadWait {
			if err := checkSkew(in, r, released[r.UID], got); err != nil {
				return err
			}
		}
		if left := n - len(got); left > 0 {
			byClass[pl.Class] += left
			if !spreadWait {
				// A gang waits only if the pods it may take that were not
				// given to claims before it, less what the gangs before it
				// hold back, are too few. Any other claim is short only
				// if the pods it may take that stay free are at most what
				// those gangs hold back.
				avail, free := 0, 0
				for i := range in.Candidates {
					c := &in.Candidates[i]
					if !pl.Matches(c) {
						continue
					}
					if owner[c.Name] == "" {
						free++
					}
					if !before[owner[c.Name]] {
						avail++
					}
				}
				switch {
				case pl.Gang && avail-held >= n:
					return fmt.Errorf("claim %s: a gang lacking %d pods got none, though %d pods it may take were not given to claims before it, and the gangs before it hold back at most %d",
						r.Claim, n, avail, held)
				case !pl.Gang && free > held:
					return fmt.Errorf("not work-conserving: claim %s lacks %d pods while %d it may take stay free, and the gangs before it hold back at most %d",
						r.Claim, left, free, held)
				}
			}
			if pl.Gang {
				held += n
			}
		}
		before[r.UID] = true
	}
	if act.Shortfall == 0 && act.ShortfallByClass != nil {
		return fmt.Errorf("ShortfallByClass %v with no shortfall, want nil", act.ShortfallByClass)
	}
	if act.Shortfall > 0 && !maps.Equal(act.ShortfallByClass, byClass) {
		return fmt.Errorf("ShortfallByClass %v, want %v", act.ShortfallByClass, byClass)
	}
	return nil
}

// checkSkew returns an error if r, a Spread request without Relax, ends
// the plan with a skew above its MaxSkew and above the skew it started
// with, or got a pod in no domain. The domains counted are those of its
// kept pods and of every candidate its selector matches.
func checkSkew(in algorithm.Input, r *algorithm.Request, released, got []string) error {
	if len(r.HeldPods) != len(r.Held) {
		return nil // not described: the start is unknown
	}
	t := r.Placement.Topology
	key := t.Key
	counts := make(map[string]int)
	for _, c := range r.HeldPods {
		if slices.Contains(released, c.Name) {
			continue
		}
		if dom, ok := c.Domain(key); ok {
			counts[dom] += 0
			counts[dom]++
		}
	}
	for i := range in.Candidates {
		c := &in.Candidates[i]
		if dom, ok := c.Domain(key); ok && r.Placement.Matches(c) {
			counts[dom] += 0
		}
	}
	skew := func() int {
		lo, hi := -1, 0
		for _, n := range counts {
			if lo < 0 || n < lo {
				lo = n
			}
			hi = max(hi, n)
		}
		return hi - max(lo, 0)
	}
	start := skew()
	for _, p := range got {
		c := candidateNamed(in, p)
		dom, ok := c.Domain(key)
		if !ok {
			return fmt.Errorf("claim %s: spread over %q without Relax got pod %s, which is in no domain", r.Claim, key, p)
		}
		counts[dom]++
	}
	if end := skew(); end > max(start, max(1, t.MaxSkew)) {
		return fmt.Errorf("claim %s: spread over %q ends with skew %d (counts %v), above its max skew %d and the %d it started with",
			r.Claim, key, end, counts, max(1, t.MaxSkew), start)
	}
	return nil
}

func candidateNamed(in algorithm.Input, name string) *algorithm.Candidate {
	for i := range in.Candidates {
		if in.Candidates[i].Name == name {
			return &in.Candidates[i]
		}
	}
	return &algorithm.Candidate{Name: name}
}

// checkSafe returns an error if act, planned without error for the
// invalid input in, could make the caller hand one pod out twice or give
// back a pod the claim does not hold. A pod listed under two claims is not
// looked for: no algorithm is asked to detect it.
func checkSafe(in algorithm.Input, act algorithm.Action) error {
	cands := make(map[string]bool, len(in.Candidates))
	for _, c := range in.Candidates {
		cands[c.Name] = true
	}
	held := make(map[types.UID][]string)
	for _, r := range in.Requests {
		held[r.UID] = append(held[r.UID], r.Held...)
	}
	allocated := make(map[string]bool)
	for _, g := range act.Allocate {
		for _, p := range g.Pods {
			if p == "" || !cands[p] {
				return fmt.Errorf("allocated pod %q is not a candidate", p)
			}
			if allocated[p] {
				return fmt.Errorf("pod %q allocated twice", p)
			}
			allocated[p] = true
		}
	}
	for _, g := range act.Release {
		released := make(map[string]bool, len(g.Pods))
		for _, p := range g.Pods {
			if !slices.Contains(held[g.UID], p) {
				return fmt.Errorf("claim %s: released pod %q is not held by it", g.Claim, p)
			}
			if released[p] {
				return fmt.Errorf("claim %s: pod %q released twice", g.Claim, p)
			}
			released[p] = true
		}
	}
	if act.Shortfall < 0 {
		return fmt.Errorf("negative Shortfall %d", act.Shortfall)
	}
	return nil
}

// grantFor returns the request g belongs to, or an error if there is none
// or g is empty.
func grantFor(reqs map[types.UID]*algorithm.Request, g algorithm.Grant, list string) (*algorithm.Request, error) {
	r, ok := reqs[g.UID]
	if !ok {
		return nil, fmt.Errorf("%s grant for UID %q, which is not in the request list", list, g.UID)
	}
	if g.Claim != r.Claim {
		return nil, fmt.Errorf("%s grant for UID %s names claim %s, want %s", list, g.UID, g.Claim, r.Claim)
	}
	if len(g.Pods) == 0 {
		return nil, fmt.Errorf("empty %s grant for claim %s", list, g.Claim)
	}
	return r, nil
}

// need is how many pods r is missing: max(0, Want-(len(Held)-len(Release))).
func need(r *algorithm.Request) int {
	return max(0, r.Want-(len(r.Held)-len(r.Release)))
}

type invalidCase struct {
	name string
	in   algorithm.Input
}

// invalidInputs are inputs that Validate rejects. An algorithm may reject
// them with ErrInvalidInput or plan around the defect, but must not panic
// or plan a pod twice.
func invalidInputs() []invalidCase {
	claim := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }
	cands := func(names ...string) []algorithm.Candidate {
		out := make([]algorithm.Candidate, len(names))
		for i, n := range names {
			out[i] = algorithm.Candidate{Name: n}
		}
		return out
	}
	return []invalidCase{
		{"duplicate candidate", algorithm.Input{
			Candidates: cands("pod-a", "pod-a", "pod-b"),
			Requests: []algorithm.Request{
				{UID: "u1", Claim: claim("c1"), Want: 2},
				{UID: "u2", Claim: claim("c2"), Want: 2},
			},
		}},
		{"duplicate candidate, one claim", algorithm.Input{
			Candidates: cands("pod-a", "pod-a", "pod-a"),
			Requests:   []algorithm.Request{{UID: "u1", Claim: claim("c1"), Want: 3}},
		}},
		{"empty candidate name", algorithm.Input{
			Candidates: cands("", "pod-b"),
			Requests:   []algorithm.Request{{UID: "u1", Claim: claim("c1"), Want: 2}},
		}},
		{"negative want", algorithm.Input{
			Candidates: cands("pod-a"),
			Requests:   []algorithm.Request{{UID: "u1", Claim: claim("c1"), Want: -1, Held: []string{"held-1"}}},
		}},
		{"pod held twice", algorithm.Input{
			Requests: []algorithm.Request{{UID: "u1", Claim: claim("c1"), Want: 1,
				Held: []string{"held-1", "held-1", "held-1"}, Release: []string{"held-1"}}},
		}},
		{"pod held twice, surplus", algorithm.Input{
			Requests: []algorithm.Request{{UID: "u1", Claim: claim("c1"), Want: 0,
				Held: []string{"held-1", "held-2", "held-1"}}},
		}},
		{"released pod not held", algorithm.Input{
			Candidates: cands("pod-a"),
			Requests: []algorithm.Request{{UID: "u1", Claim: claim("c1"), Want: 1,
				Held: []string{"held-1", "held-2", "held-3"}, Release: []string{"other"}}},
		}},
		{"pod released twice", algorithm.Input{
			Candidates: cands("pod-a", "pod-b"),
			Requests: []algorithm.Request{{UID: "u1", Claim: claim("c1"), Want: 2,
				Held: []string{"held-1", "held-2"}, Release: []string{"held-1", "held-1"}}},
		}},
		{"duplicate UID", algorithm.Input{
			Candidates: cands("pod-a", "pod-b", "pod-c"),
			Requests: []algorithm.Request{
				{UID: "u1", Claim: claim("c1"), Want: 2},
				{UID: "u1", Claim: claim("c1"), Want: 2},
			},
		}},
		{"empty UID", algorithm.Input{
			Candidates: cands("pod-a"),
			Requests:   []algorithm.Request{{Claim: claim("c1"), Want: 1}},
		}},
	}
}

// outcome is what one call of Plan did.
type outcome struct {
	act   algorithm.Action
	err   error
	panic string // the panic value and stack, if Plan panicked
}

// call runs alg.Plan(in) and turns a panic into an outcome.
func call(alg algorithm.Algorithm, in algorithm.Input) (o outcome) {
	defer func() {
		if p := recover(); p != nil {
			o.panic = fmt.Sprintf("%v\n%s", p, debug.Stack())
		}
	}()
	o.act, o.err = alg.Plan(in)
	return o
}

// cloneInput returns a deep copy of in, keeping nil and empty slices apart
// so that reflect.DeepEqual compares it exactly with the original.
func cloneInput(in algorithm.Input) algorithm.Input {
	out := algorithm.Input{
		Candidates: slices.Clone(in.Candidates),
		Requests:   slices.Clone(in.Requests),
	}
	for i := range out.Requests {
		out.Requests[i].Held = slices.Clone(in.Requests[i].Held)
		out.Requests[i].Release = slices.Clone(in.Requests[i].Release)
		out.Requests[i].HeldPods = slices.Clone(in.Requests[i].HeldPods)
	}
	return out
}
