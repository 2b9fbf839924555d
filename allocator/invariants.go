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
		recycling := 0
		for _, name := range names {
			held++
			pi := p.pods.Get(name)
			if pi == nil {
				bad("pod %s held by claim %s in the store has no entry", name, ci.name())
				continue
			}
			if pi.recycling {
				recycling++
			}
		}
		if int32(recycling) != ci.recycling() {
			bad("claim %s counts %d pods recycling, %d are", ci.name(), ci.recycling(), recycling)
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
	for pi := range p.pods.All() {
		name := pi.name()
		if p.pods.Get(name) != pi {
			bad("entry of pod %s is not found under its name", name)
		}
		if (pi.freeIdx >= 0) != p.candidate(pi) {
			bad("pod %s: in the free list %t, candidate %t", name, pi.freeIdx >= 0, p.candidate(pi))
		}
		roles := 0
		_, isHeld := snap[name]
		if isHeld {
			roles++
		}
		if pi.reservedBy() != nil {
			roles++
			if p.reserved[name] != pi {
				bad("pod %s is reserved, not in the reserved set", name)
			}
		}
		if pi.settling() != nil {
			roles++
			if p.settling[name] != pi {
				bad("pod %s is settling, not in the settling set", name)
			}
		}
		if roles > 1 {
			bad("pod %s is at once held (%v), reserved (%v) and settling (%v)", name, isHeld, pi.reservedBy() != nil, pi.settling() != nil)
		}
		if pi.recycling != (p.recycling[name] == pi) {
			bad("pod %s: recycling %t, in the recycling set %t", name, pi.recycling, p.recycling[name] == pi)
		}
		if pi.recycling && !isHeld {
			bad("pod %s is recycling and held by no claim", name)
		}
		lost := isHeld && !pi.recycling && (!pi.present || !pi.ready)
		if _, in := p.lost[name]; in != lost {
			bad("pod %s: lost %t, in the lost set %t", name, lost, in)
		}
		if strays[name] != int(pi.strays) {
			bad("pod %s counts %d stray entries, records have %d", name, pi.strays, strays[name])
		}
		next := pi.nextPod()
		if next != nil && next.uid() == pi.uid() {
			bad("pod %s waits for itself", name)
		}
		if pi.waiting || next != nil && !next.waiting {
			bad("pod %s: entry waiting %t, next waiting %t", name, pi.waiting, next != nil && next.waiting)
		}
		for _, e := range []*podInfo{pi, next} {
			if e != nil && (e.idx < 0 || int(e.idx) >= len(p.podSeen) || p.podSeen[e.idx].v != e) {
				bad("pod %s (uid %s) is not at its place %d in podSeen", name, e.uid(), e.idx)
			}
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
	if len(p.claimSeen) != p.claims.Len() {
		bad("claimSeen has %d claimInfos, the pool %d", len(p.claimSeen), p.claims.Len())
	}
	starting := 0
	for i, s := range p.podSeen {
		if int(s.v.idx) != i {
			bad("podSeen[%d] %s has index %d", i, s.v.name(), s.v.idx)
		}
		if want := p.isStarting(s.v, p.holderOf(s.v)); s.v.starting != want {
			bad("pod %s (uid %s): starting %t, should be %t", s.v.name(), s.v.uid(), s.v.starting, want)
		}
		if s.v.starting {
			starting++
		}
	}
	if starting != p.nStarting {
		bad("%d pods are starting, the pool counts %d", starting, p.nStarting)
	}
	for name, pi := range p.reserved {
		if p.pods.Get(name) != pi || pi.reservedBy() == nil {
			bad("reserved pod %s is not reserved", name)
		}
	}
	for name, pi := range p.settling {
		if p.pods.Get(name) != pi || pi.settling() == nil {
			bad("settling pod %s is not settling", name)
		}
	}
	for name, pi := range p.recycling {
		if p.pods.Get(name) != pi {
			bad("recycling pod %s has no entry", name)
		}
	}
	for name := range strays {
		if p.pods.Get(name) == nil {
			bad("stray entry %s has no pod entry", name)
		}
	}
	slices.SortFunc(errs, func(x, y error) int { return strings.Compare(x.Error(), y.Error()) })
	return errors.Join(errs...)
}
