package algorithm

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Packed fills claims one at a time, in order (priority, then age, then
// arrival, then name; see Less): the first claim gets all it wants before
// the next gets any.
type Packed struct{}

// Spread hands out one pod per claim per turn, in order, so that when the
// pool is short every waiting claim gets some pods before any gets all.
type Spread struct{}

var (
	_ Algorithm = Packed{}
	_ Algorithm = Spread{}
)

// Plan implements Algorithm.
func (Packed) Plan(in Input) (Action, error) { return plan(in, false) }

// Plan implements Algorithm.
func (Spread) Plan(in Input) (Action, error) { return plan(in, true) }

// Less reports whether request a is served before request b: higher
// Priority first, then older Created, then lower Arrival, then
// namespace/name, then UID. It is the order both strategies use and a total
// order on distinct UIDs; a strategy of your own may use it too.
func Less(a, b *Request) bool { return compareRequests(a, b) < 0 }

func compareRequests(a, b *Request) int {
	if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
		return c
	}
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Arrival, b.Arrival); c != 0 {
		return c
	}
	if c := strings.Compare(a.Claim.Namespace, b.Claim.Namespace); c != 0 {
		return c
	}
	if c := strings.Compare(a.Claim.Name, b.Claim.Name); c != 0 {
		return c
	}
	return strings.Compare(string(a.UID), string(b.UID))
}

// plan is shared by both strategies: releases are decided the same way, and
// only the order in which candidates are dealt out differs.
//
// Requests are served in the order of Less. A gang request splits that
// order: the requests before it are dealt to first (one at a time for
// Packed, in turns for Spread), then the gang takes all it lacks or holds
// back what it would get, then the requests after it.
func plan(in Input, spread bool) (Action, error) {
	order := make([]*Request, len(in.Requests))
	for i := range in.Requests {
		order[i] = &in.Requests[i]
	}
	slices.SortStableFunc(order, compareRequests)

	var act Action
	d := newDealer(in.Candidates)
	pickers := make([]*picker, len(order))
	for i, r := range order {
		if r.Want < 0 {
			return Action{}, fmt.Errorf("%w: claim %s: negative want %d", ErrInvalidInput, r.Claim, r.Want)
		}
		rel, err := releases(r)
		if err != nil {
			return Action{}, err
		}
		if len(rel) > 0 {
			act.Release = append(act.Release, Grant{UID: r.UID, Claim: r.Claim, Pods: rel})
		}
		pk := &picker{r: r}
		if keep := len(r.Held) - len(r.Release); r.Want > keep {
			pk.need = r.Want - keep
		}
		pk.released = rel
		pickers[i] = pk
	}

	deal := func(seg []*picker) {
		if spread {
			for more := true; more; {
				more = false
				for _, pk := range seg {
					if len(pk.got) == pk.need || pk.done {
						continue
					}
					if i := d.pick(pk); i >= 0 {
						pk.take(d, i)
						more = true
					} else {
						pk.done = true
					}
				}
			}
			return
		}
		for _, pk := range seg {
			for len(pk.got) < pk.need {
				i := d.pick(pk)
				if i < 0 {
					break
				}
				pk.take(d, i)
			}
		}
	}
	start := 0
	for i, pk := range pickers {
		if !pk.r.Placement.Gang || pk.need == 0 {
			continue
		}
		deal(pickers[start:i])
		start = i + 1
		for len(pk.got) < pk.need {
			j := d.pick(pk)
			if j < 0 {
				break
			}
			pk.take(d, j)
		}
		if len(pk.got) < pk.need {
			// All or nothing: nothing now, and the pods it would get stay
			// dealt, held back from every request after it.
			pk.got = nil
		}
	}
	deal(pickers[start:])

	for _, pk := range pickers {
		r := pk.r
		if len(pk.got) > 0 {
			act.Allocate = append(act.Allocate, Grant{UID: r.UID, Claim: r.Claim, Pods: pk.got})
		}
		if left := pk.need - len(pk.got); left > 0 {
			act.Shortfall += left
			if act.ShortfallByClass == nil {
				act.ShortfallByClass = make(map[string]int)
			}
			act.ShortfallByClass[r.Placement.Class] += left
		}
	}
	return act, nil
}

// dealer deals the candidates out, each at most once. A name seen twice
// is dealt once, so that a malformed input can never make one pod go to
// two claims; a candidate with an empty name is never dealt.
type dealer struct {
	cands []Candidate
	dealt map[string]struct{}
	next  int // candidates before next are all dealt (or unusable)
}

func newDealer(cands []Candidate) *dealer {
	return &dealer{cands: cands, dealt: make(map[string]struct{})}
}

// free reports whether candidate i may still be dealt.
func (d *dealer) free(i int) bool {
	name := d.cands[i].Name
	if name == "" {
		return false
	}
	_, dealt := d.dealt[name]
	return !dealt
}

// picker is one request's share of the dealing: where its scans stand,
// and what it got.
type picker struct {
	r        *Request
	need     int
	released []string
	got      []string
	done     bool // nothing more to pick in this plan

	pos      int   // candidates before pos are dealt, or not for r, or in avoid
	scanned  int   // topology: candidates before it were classified once
	avoid    []int // candidates in r.Avoid passed over, in order
	nodomain []int // free candidates in no domain of r's topology key, in order

	// Topology (see pickSpread and pickPack).
	counts  map[string]int // r's pods per domain: kept, then dealt
	domains []string       // Spread: the domains counted for the skew, once known
	level   int            // Spread: the count of the domains scanned for
	above   bool           // Spread: this level's scan passed a candidate in a domain holding more
	order   []string       // Pack: domains in the order to fill them
	queue   map[string][]int
}

// take deals candidate i to pk's request.
func (pk *picker) take(d *dealer, i int) {
	c := &d.cands[i]
	d.dealt[c.Name] = struct{}{}
	pk.got = append(pk.got, c.Name)
	if pk.counts != nil {
		if dom, ok := c.Domain(pk.r.Placement.Topology.key()); ok {
			pk.counts[dom]++
		}
	}
}

// avoided reports whether r would rather not get candidate i back.
func (pk *picker) avoided(d *dealer, i int) bool {
	return len(pk.r.Avoid) > 0 && slices.Contains(pk.r.Avoid, d.cands[i].Name)
}

// pick returns the candidate to deal to pk's request next, -1 if none.
func (d *dealer) pick(pk *picker) int {
	switch pk.r.Placement.Topology.Mode {
	case TopologySpread:
		return d.pickSpread(pk)
	case TopologyPack:
		return d.pickPack(pk)
	}
	for d.next < len(d.cands) && !d.free(d.next) {
		d.next++
	}
	pl := &pk.r.Placement
	for pk.pos = max(pk.pos, d.next); pk.pos < len(d.cands); pk.pos++ {
		i := pk.pos
		if !d.free(i) || !pl.Matches(&d.cands[i]) {
			continue
		}
		if pk.avoided(d, i) {
			pk.avoid = append(pk.avoid, i)
			continue
		}
		return i
	}
	return d.firstFree(pk.avoid)
}

// firstFree returns the first of is that may still be dealt, -1 if none.
func (d *dealer) firstFree(is []int) int {
	for _, i := range is {
		if d.free(i) {
			return i
		}
	}
	return -1
}

// kept returns the pods of r it keeps, described, if r describes them.
func kept(r *Request, released []string) []Candidate {
	out := make([]Candidate, 0, len(r.HeldPods))
	for _, c := range r.HeldPods {
		if !slices.Contains(released, c.Name) {
			out = append(out, c)
		}
	}
	return out
}

// startTopology counts pk's kept pods per domain.
func (pk *picker) startTopology() {
	if pk.counts != nil {
		return
	}
	key := pk.r.Placement.Topology.key()
	pk.counts = make(map[string]int)
	for _, c := range kept(pk.r, pk.released) {
		if dom, ok := c.Domain(key); ok {
			pk.counts[dom]++
		}
	}
}

// pickSpread picks for a TopologySpread request: a free candidate in a
// domain holding the fewest of its pods. It scans the candidates for a
// domain holding at most level pods, and raises level only after a scan
// found none; the first scan that finds none also learns every domain
// counted for the skew, which a request without Relax must keep within
// MaxSkew. A request holding nothing yet takes the first candidate it
// may, without scanning further.
func (d *dealer) pickSpread(pk *picker) int {
	pk.startTopology()
	for {
		for ; pk.pos < len(d.cands); pk.pos++ {
			i := pk.pos
			dom, ok := d.classify(pk, i)
			switch {
			case !ok:
			case pk.counts[dom] <= pk.level:
				if pk.fits(dom) {
					return i
				}
				// The least used domains with a free candidate break the
				// skew already: so would every other.
				return d.spreadFallback(pk)
			default:
				pk.above = true
			}
		}
		if pk.domains == nil {
			pk.learnDomains(d)
		}
		if !pk.above {
			return d.spreadFallback(pk)
		}
		pk.level++
		pk.pos, pk.above = 0, false
	}
}

// classify looks at candidate i for pk's topology. The first time a scan
// reaches it, a free candidate pk may take that is in no domain of its key,
// or that it asked to avoid, is set aside as a fallback (candidates only
// ever stop being free, so a later scan finds nothing new before
// pk.scanned). It returns i's domain if i is a free candidate pk may take
// in a domain, and not one it asked to avoid.
func (d *dealer) classify(pk *picker, i int) (string, bool) {
	first := i >= pk.scanned
	if first {
		pk.scanned = i + 1
	}
	c := &d.cands[i]
	if !d.free(i) || !pk.r.Placement.Matches(c) {
		return "", false
	}
	dom, ok := c.Domain(pk.r.Placement.Topology.key())
	switch {
	case !ok:
		if first {
			pk.nodomain = append(pk.nodomain, i)
		}
		return "", false
	case pk.avoided(d, i):
		if first {
			pk.avoid = append(pk.avoid, i)
		}
		return "", false
	}
	return dom, true
}

// fits reports whether one more pod in dom keeps pk's skew within bounds
// (always, with Relax or before the domains are learnt: a domain with no
// more than level pods, level 0, is one of the least used).
func (pk *picker) fits(dom string) bool {
	t := pk.r.Placement.Topology
	if t.Relax || pk.domains == nil {
		return true
	}
	low := pk.counts[dom]
	for _, o := range pk.domains {
		low = min(low, pk.counts[o])
	}
	return pk.counts[dom]+1-low <= t.maxSkew()
}

// learnDomains records the domains counted for pk's skew: those holding
// its kept pods and those of every candidate it may take, free or not.
func (pk *picker) learnDomains(d *dealer) {
	key, pl := pk.r.Placement.Topology.key(), &pk.r.Placement
	seen := make(map[string]struct{})
	add := func(c *Candidate) {
		if dom, ok := c.Domain(key); ok {
			if _, dup := seen[dom]; !dup {
				seen[dom] = struct{}{}
				pk.domains = append(pk.domains, dom)
			}
		}
	}
	for _, c := range kept(pk.r, pk.released) {
		add(&c)
	}
	for i := range d.cands {
		if c := &d.cands[i]; c.Name != "" && pl.Matches(c) {
			add(c)
		}
	}
	if pk.domains == nil {
		pk.domains = []string{}
	}
}

// spreadFallback picks for a Spread request once no free candidate it
// would rather have is left in a domain it may use: one it asked to avoid,
// in the least used domain, if that keeps the skew (or with Relax); then,
// with Relax, one in no domain. The domains are known by then.
func (d *dealer) spreadFallback(pk *picker) int {
	key := pk.r.Placement.Topology.key()
	best := -1
	for _, i := range pk.avoid {
		if !d.free(i) {
			continue
		}
		dom, _ := d.cands[i].Domain(key)
		if best < 0 || pk.counts[dom] < pk.counts[mustDomain(d, best, key)] {
			best = i
		}
	}
	if best >= 0 && pk.fits(mustDomain(d, best, key)) {
		return best
	}
	if pk.r.Placement.Topology.Relax {
		if best >= 0 {
			return best
		}
		return d.firstFree(pk.nodomain)
	}
	return -1
}

func mustDomain(d *dealer, i int, key string) string {
	dom, _ := d.cands[i].Domain(key)
	return dom
}

// pickPack picks for a TopologyPack request: candidates of the domains
// holding most of its pods first, then of the domains with the most free
// candidates it may take, one domain at a time; then candidates it asked
// to avoid, then candidates in no domain. It scans all candidates once.
func (d *dealer) pickPack(pk *picker) int {
	if pk.queue == nil {
		pk.startTopology()
		pk.queue = make(map[string][]int)
		for i := range d.cands {
			if dom, ok := d.classify(pk, i); ok {
				if _, seen := pk.queue[dom]; !seen {
					pk.order = append(pk.order, dom)
				}
				pk.queue[dom] = append(pk.queue[dom], i)
			}
		}
		slices.SortStableFunc(pk.order, func(x, y string) int {
			if c := cmp.Compare(pk.counts[y], pk.counts[x]); c != 0 {
				return c
			}
			return cmp.Compare(len(pk.queue[y]), len(pk.queue[x]))
		})
	}
	for len(pk.order) > 0 {
		dom := pk.order[0]
		q := pk.queue[dom]
		for len(q) > 0 && !d.free(q[0]) {
			q = q[1:]
		}
		pk.queue[dom] = q
		if len(q) > 0 {
			return q[0]
		}
		pk.order = pk.order[1:]
	}
	if i := d.firstFree(pk.avoid); i >= 0 {
		return i
	}
	return d.firstFree(pk.nodomain)
}

// releases returns the pods r gives back: those its owner released, then,
// if it still holds more than it wants, the surplus, chosen as the
// greatest names so that the choice is stable across rounds and restarts.
//
// Whenever it names pods it first checks the part of r it relies on (Held
// and Release without repeats, Release within Held), so that a malformed
// request yields an error wrapping ErrInvalidInput instead of a panic or a
// pod named twice. Its cost grows with len(r.Held), never with the pool.
func releases(r *Request) ([]string, error) {
	keep := len(r.Held) - len(r.Release)
	if len(r.Release) == 0 && keep <= r.Want {
		return nil, nil
	}
	released := make(map[string]bool, len(r.Held)) // held pod → owner released it
	for _, p := range r.Held {
		if _, dup := released[p]; dup {
			return nil, fmt.Errorf("%w: claim %s: pod %q held twice", ErrInvalidInput, r.Claim, p)
		}
		released[p] = false
	}
	out := make([]string, 0, len(r.Release)+max(0, keep-r.Want))
	for _, p := range r.Release {
		done, held := released[p]
		if !held {
			return nil, fmt.Errorf("%w: claim %s: released pod %q is not held", ErrInvalidInput, r.Claim, p)
		}
		if done {
			return nil, fmt.Errorf("%w: claim %s: pod %q released twice", ErrInvalidInput, r.Claim, p)
		}
		released[p] = true
		out = append(out, p)
	}
	if keep <= r.Want {
		return out, nil
	}
	// Held and Release are now known to be repeat-free with Release in
	// Held, so exactly keep pods remain and keep > r.Want >= 0.
	kept := make([]string, 0, keep)
	for _, p := range r.Held {
		if !released[p] {
			kept = append(kept, p)
		}
	}
	slices.Sort(kept)
	return append(out, kept[r.Want:]...), nil
}
