package allocator

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// checkInvariants checks that every pool's state is consistent with itself
// and with the store, the index of holdings: the free list holds exactly
// the candidates, each held pod's holder and the store agree, the sets
// the rounds visit (recycling, reserved, settling, lost) hold exactly the
// pods whose state says so, and the starting count (Result.Starting) counts
// exactly the pods that may still become candidates. Tests and the property machine call it after
// every step; it takes each pool's lock in turn, skipping pools whose round
// is in progress.
func (a *defaultAllocator) checkInvariants() error {
	a.mu.Lock()
	pools := make([]*pool, 0, len(a.pools))
	for _, p := range a.pools {
		pools = append(pools, p)
	}
	a.mu.Unlock()
	var errs []error
	for _, p := range pools {
		if !p.mu.TryLock() {
			continue
		}
		err := p.checkInvariants(a)
		p.mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", p.name, err))
		}
	}
	return errors.Join(errs...)
}

func (p *pool) checkInvariants(a *defaultAllocator) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for name := range p.overrule {
		if _, ok := p.tomark[name]; !ok {
			bad("pod %s: a mark is overruled but the pod is not to be marked", name)
		}
	}
	for i, c := range p.free {
		pi := p.pods.Get(c.Name)
		switch {
		case pi == nil:
			bad("free[%d] %s has no entry", i, c.Name)
		case int(pi.freeIdx) != i:
			bad("free[%d] %s has index %d", i, c.Name, pi.freeIdx)
		case !p.candidate(pi):
			bad("free[%d] %s is not a candidate", i, c.Name)
		}
	}
	held := 0
	strays := make(map[string]int)
	for ci := range p.claims.All() {
		if p.claims.Get(claimUID(ci)) != ci {
			bad("entry of claim %s is not found under its UID", ci.name())
		}
		names, err := a.cfg.store.Held(p.name, ci.uid())
		if err != nil {
			bad("store: held of claim %s: %v", ci.name(), err)
		}
		if n, err := a.cfg.store.Count(p.name, ci.uid()); err != nil || n != len(names) {
			bad("store: claim %s holds %d pods, Count says %d (%v)", ci.name(), len(names), n, err)
		}
		for _, name := range names {
			held++
			if p.pods.Get(name) == nil {
				bad("pod %s held by claim %s in the store has no entry", name, ci.name())
			}
		}
		for _, name := range ci.strays() {
			strays[name]++
		}
		if ci.listed && !ci.since().IsZero() {
			bad("claim %s is listed and missing since %v", ci.name(), ci.since())
		}
		if m := ci.ver; m != nil && m != settledVer && (m.obj == nil) == (m.kind == nil) {
			bad("claim %s keeps a version with object %v and kind %v", ci.name(), m.obj != nil, m.kind != nil)
		}
		if ci.idx < 0 || int(ci.idx) >= len(p.claimSeen) || p.claimSeen[ci.idx].v != ci {
			bad("claim %s is not at its place %d in claimSeen", ci.name(), ci.idx)
		}
	}
	snap, err := a.cfg.store.Snapshot(p.name)
	if err != nil {
		bad("store: snapshot: %v", err)
	} else if len(snap) != held {
		bad("the pool's claims hold %d pods, the store %d", held, len(snap))
	} else if p.nHeldPods != held {
		bad("the pool counts %d held pods, the store holds %d", p.nHeldPods, held)
	}
	for name, h := range snap {
		if p.claims.Get(string(h.UID)) == nil {
			bad("pod %s is held by %s in the store, a claim the pool does not know", name, h)
		}
	}
	// Every podInfo, entries and the newer pods waiting under their names,
	// is in one state: the one the listing and the store give it unless a
	// decision put it in an active state, and it is in exactly the set and
	// count of that state (docs/design.md, "The pod state").
	count := make(map[podState]int)
	recyclingFor := make(map[*claimInfo]int32)
	for pi := range p.pods.All() {
		if p.pods.Get(pi.name()) != pi {
			bad("entry of pod %s is not found under its name", pi.name())
		}
	}
	for i, s := range p.podSeen {
		pi := s.v
		name := pi.name()
		if int(pi.idx) != i {
			bad("podSeen[%d] %s has index %d", i, name, pi.idx)
		}
		// A ref names the index's entry (scanUnordered takes the stamp
		// for it on its address alone).
		if pi.ref != "" && (pi.ref != name || p.pods.Get(pi.ref) != pi) {
			bad("podSeen[%d] %s has ref %q, whose entry it is not", i, name, pi.ref)
		}
		// A UID ref is the pod's UID (scan takes it on its address alone).
		if pi.uidRef != "" && pi.uidRef != string(pi.uid()) {
			bad("podSeen[%d] %s has UID ref %q, not its UID %q", i, name, pi.uidRef, pi.uid())
		}
		count[pi.state]++
		_, isHeld := snap[name]
		isHeld = isHeld && p.pods.Get(name) == pi
		if pi.state.active() {
			ci := pi.claim()
			switch {
			case p.pods.Get(name) != pi:
				bad("pod %s (uid %s) is %s but not its name's entry", name, pi.uid(), pi.state)
			case ci == nil:
				bad("pod %s is %s for no claim", name, pi.state)
			case p.claims.Get(string(ci.uid())) != ci:
				// A claim forgotten while a pod is active for it comes back
				// as a new entry the pod does not name.
				bad("pod %s is %s for claim %s, which is not the pool's entry for its UID", name, pi.state, ci.name())
			case pi.state == stateRecycling && (!isHeld || snap[name].UID != ci.uid()):
				bad("pod %s is recycling for claim %s, the store says %v", name, ci.name(), snap[name])
			case pi.state != stateRecycling && isHeld:
				bad("pod %s is %s for claim %s and held by %v in the store", name, pi.state, ci.name(), snap[name])
			}
			if pi.state == stateRecycling {
				recyclingFor[ci]++
			}
		} else {
			if want, _ := p.passive(pi); pi.state != want {
				bad("pod %s (uid %s): state %s, the listing and the store say %s", name, pi.uid(), pi.state, want)
			}
			if pi.claim() != nil {
				bad("pod %s is %s and keeps claim %s", name, pi.state, pi.claim().name())
			}
		}
		_, inLost := p.lost[pi]
		_, inReserved := p.reserved[pi]
		_, inSettling := p.settling[pi]
		_, inRecycling := p.recycling[pi]
		for _, c := range []struct {
			in    bool
			state podState
		}{{inLost, stateLost}, {inReserved, stateReserved}, {inSettling, stateSettling}, {inRecycling, stateRecycling}} {
			if c.in != (pi.state == c.state) {
				bad("pod %s (uid %s): state %s, in the %s set %t", name, pi.uid(), pi.state, c.state, c.in)
			}
		}
		if (pi.freeIdx >= 0) != (pi.state == stateFree) {
			bad("pod %s: in the free list %t, state %s", name, pi.freeIdx >= 0, pi.state)
		}
		if pi.recycled && pi.state != stateRecycling && pi.state != stateSettling {
			bad("pod %s is recycled and %s", name, pi.state)
		}
		if strays[name] != int(pi.strays) && p.pods.Get(name) == pi {
			bad("pod %s counts %d stray entries, records have %d", name, pi.strays, strays[name])
		}
		if pi.waiting {
			continue
		}
		next := pi.nextPod()
		if next != nil && next.uid() == pi.uid() {
			bad("pod %s waits for itself", name)
		}
		if next != nil && !next.waiting {
			bad("pod %s: next not waiting", name)
		}
		if next != nil && (next.idx < 0 || int(next.idx) >= len(p.podSeen) || p.podSeen[next.idx].v != next) {
			bad("pod %s (uid %s) is not at its place %d in podSeen", name, next.uid(), next.idx)
		}
	}
	for ci := range p.claims.All() {
		if ci.recycling() != recyclingFor[ci] {
			bad("claim %s counts %d pods recycling, %d are", ci.name(), ci.recycling(), recyclingFor[ci])
		}
	}
	for _, c := range []struct {
		state podState
		n     int
	}{{stateFree, len(p.free)}, {stateStarting, p.nStarting}, {stateLost, len(p.lost)}, {stateReserved, len(p.reserved)},
		{stateSettling, len(p.settling)}, {stateRecycling, len(p.recycling)}} {
		if count[c.state] != c.n {
			bad("%d pods are %s, the pool counts %d", count[c.state], c.state, c.n)
		}
	}
	// The dense arrays hold exactly the entries and their next pods (scan
	// relies on it).
	nexts := 0
	for pi := range p.pods.All() {
		if pi.nextPod() != nil {
			nexts++
		}
	}
	if len(p.podSeen) != p.pods.Len()+nexts {
		bad("podSeen has %d podInfos, the pool %d entries and %d next pods", len(p.podSeen), p.pods.Len(), nexts)
	}
	for i, s := range p.claimSeen {
		if ref := s.v.ref; ref != "" && (ref != string(s.v.uid()) || p.claims.Get(ref) != s.v) {
			bad("claimSeen[%d] %s has ref %q, whose entry it is not", i, s.v.name(), ref)
		}
	}
	if len(p.claimSeen) != p.claims.Len() {
		bad("claimSeen has %d claimInfos, the pool %d", len(p.claimSeen), p.claims.Len())
	}
	for name := range strays {
		if p.pods.Get(name) == nil {
			bad("stray entry %s has no pod entry", name)
		}
	}
	slices.SortFunc(errs, func(x, y error) int { return strings.Compare(x.Error(), y.Error()) })
	return errors.Join(errs...)
}
