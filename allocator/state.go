package allocator

import (
	"fmt"
	"slices"
	"time"
)

// The pod state (docs/design.md, "The pod state").
//
// Every pod incarnation the pool knows (an entry of pool.pods, or a newer
// pod waiting under an entry's name) is in exactly one podState, kept in
// podInfo.state. setState is the only code that changes it, and it keeps
// everything derived from it: the free list, the starting count, the sets
// of lost, reserved, settling and recycling pods (keyed by the incarnation,
// never by name), the claims' recycling counts and dirty flags, and the
// recycling metric. It refuses a move the diagram does not have: the pool
// then fails closed (see pool.violation).
//
// The passive states follow from what the pool knows: the listing (present,
// ready, ending), the pod's mark and stray entries, and the store, which
// says who holds the pod. refresh computes them. The active states are
// entered and left only by the round's decisions: a write of unknown
// outcome or another allocator's hand-out (reserved), a record that does
// not list a marked pod (settling), a pod given back (recycling).
type podState uint8

const (
	// stateGone: held by no claim, and not listed, or listed terminating
	// or finished: it will not be offered.
	stateGone podState = iota
	// stateFree: listed, Ready, held by no claim, nothing pending: a
	// candidate.
	stateFree
	// stateStarting: as free, but not Ready yet, never seen Ready, and
	// neither terminating nor finished: it may still serve the shortfall
	// (Result.Starting).
	stateStarting
	// stateUnready: as free, but not Ready, and not counted on: it was
	// Ready before (it broke, or restarts), or it is terminating or
	// finished.
	stateUnready
	// stateFenced: listed and held by no claim, but not offerable whatever
	// its readiness: its mark names a claim, a record names it without
	// holding it (a stray entry), or it waits under the name of an older
	// incarnation that is still referred to (docs/design.md I13).
	stateFenced
	// stateHeld: the store says a claim holds it, and it is listed and
	// Ready.
	stateHeld
	// stateLost: a claim holds it, and it is not listed or not Ready
	// (Result.Lost).
	stateLost
	// stateReserved: named by a write for podInfo.claim of unknown
	// outcome, or marked for it by a hand-out not recorded yet: not offered
	// until that is settled.
	stateReserved
	// stateSettling: marked for podInfo.claim, whose record does not list
	// it as held: recycled for that claim and recorded released before its
	// mark goes.
	stateSettling
	// stateRecycling: held by podInfo.claim, which gives it back: with the
	// recycler until its release is recorded.
	stateRecycling
)

var stateNames = [...]string{"gone", "free", "starting", "unready", "fenced", "held", "lost", "reserved", "settling", "recycling"}

func (s podState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("podState(%d)", s)
}

// active reports whether the state is left only by a decision of a round,
// not by what the listing or the store says.
func (s podState) active() bool { return s >= stateReserved }

// unheld reports whether the state is one of a pod no claim holds and no
// decision concerns.
func (s podState) unheld() bool { return s <= stateFenced }

// held reports whether the store says a claim holds a pod in the state.
func (s podState) held() bool { return s == stateHeld || s == stateLost || s == stateRecycling }

// why says what may move a pod between two states, "" for a move the
// diagram does not have. Recovery, which rebuilds every pod's state from
// the records and marks, may move any pod to a passive state (reset).
func why(from, to podState) string {
	switch {
	case from.unheld() && to.unheld():
		return "the listing"
	case from.unheld() && (to == stateHeld || to == stateLost):
		return "a durable record, or recovery"
	case (from == stateHeld || from == stateLost) && (to == stateHeld || to == stateLost):
		return "the listing"
	case (from == stateHeld || from == stateLost) && to.unheld():
		return "a record that no longer lists the pod"
	case (from == stateHeld || from == stateLost) && to == stateRecycling:
		return "a release, a surplus or a claim that left"
	case from == stateRecycling && to.unheld():
		return "its release recorded"
	case (from.unheld() || from.held() || from == stateReserved) && to == stateSettling:
		return "a record that does not list a pod marked for its claim"
	case from.unheld() && to == stateReserved:
		return "a write of unknown outcome, or a mark newer than the record"
	case (from == stateReserved || from == stateSettling) && to.unheld():
		return "the write or mark settled"
	}
	return ""
}

// setState is the only writer of podInfo.state (and of podMore.claim):
// it moves pi to state to, concerning claim ci (the claim that holds it,
// or that it is reserved, settling or recycling for), and keeps what is
// derived from the state. A move the diagram does not have is refused and
// recorded as a violation: the round fails closed. reset is set by
// recovery alone.
func (p *pool) setState(pi *podInfo, to podState, ci *claimInfo, reset bool) {
	from := pi.state
	if from == to {
		if to.active() && pi.claim() != ci {
			p.violate(fmt.Errorf("pod %s (uid %s): %s for claim %s, asked to be %s for claim %s", pi.name(), pi.uid(), from, pi.claim().name(), to, ci.name()))
			return
		}
		if to == stateFree {
			p.free[pi.freeIdx] = pi.freeEntry() // its place may have changed
		}
		return
	}
	if why(from, to) == "" && !(reset && !to.active()) {
		if ci == unknownHolder {
			// The store could not say who holds the pod: that error
			// fails the pool closed already (noteStoreErr).
			return
		}
		p.violate(fmt.Errorf("pod %s (uid %s): no move from %s to %s", pi.name(), pi.uid(), from, to))
		return
	}
	if to.active() && (ci == nil || ci == unknownHolder) {
		p.violate(fmt.Errorf("pod %s (uid %s): %s for no known claim", pi.name(), pi.uid(), to))
		return
	}
	// Leave from.
	switch from {
	case stateFree:
		p.removeFree(pi)
	case stateStarting:
		p.nStarting--
	case stateLost:
		delete(p.lost, pi)
	case stateReserved:
		delete(p.reserved, pi)
	case stateSettling:
		delete(p.settling, pi)
	case stateRecycling:
		delete(p.recycling, pi)
		pi.claim().addRecycling(-1)
		p.dirty[pi.claim()] = struct{}{}
	}
	if from.active() {
		pi.setClaim(nil, time.Time{})
	}
	pi.state = to
	if n := len(p.moved); !p.rebuilding && (n == 0 || p.moved[n-1] != pi) { // a pod's moves come in runs
		p.moved = append(p.moved, pi)
	}
	// Enter to.
	switch to {
	case stateFree:
		pi.freeIdx = int32(len(p.free))
		p.free = append(p.free, pi.freeEntry())
	case stateStarting:
		p.nStarting++
	case stateLost:
		p.lost[pi] = struct{}{}
	case stateReserved:
		p.reserved[pi] = struct{}{}
	case stateSettling:
		p.settling[pi] = struct{}{}
	case stateRecycling:
		p.recycling[pi] = struct{}{}
		ci.addRecycling(1)
		if m := p.metrics; m != nil {
			m.recycledPods(p.name, 1)
		}
	}
	if to.active() {
		pi.setClaim(ci, pi.reservedUntil())
		p.dirty[ci] = struct{}{}
	}
	if (from == stateLost || to == stateLost) && ci != nil && ci != unknownHolder {
		// A held pod lost or found: its claim is planned again.
		p.dirty[ci] = struct{}{}
	}
}

// violate records the first move the state diagram refused since the
// round began (see setState).
func (p *pool) violate(err error) {
	if p.violation == nil {
		p.violation = fmt.Errorf("pool %s: %w: %w", p.name, ErrInconsistent, err)
	}
}

// removeFree takes pi out of the free list.
func (p *pool) removeFree(pi *podInfo) {
	last := int32(len(p.free) - 1)
	moved := p.free[last]
	p.free[pi.freeIdx] = moved
	p.pods.Get(moved.Name).freeIdx = pi.freeIdx
	p.free[last] = freePod{}
	p.free = p.free[:last]
	pi.freeIdx = -1
	if cap(p.free) > 64 && int(last) < cap(p.free)/4 {
		p.free = slices.Clone(p.free) // let the memory of a larger pool go
	}
}

// passive is the state the listing and the store give pi, and the claim
// that holds it (nil if none; unknownHolder when the store cannot say).
func (p *pool) passive(pi *podInfo) (podState, *claimInfo) {
	return p.passiveAs(pi, p.holderOf(pi))
}

// passiveAs is passive for a pod whose holder the caller knows.
func (p *pool) passiveAs(pi *podInfo, holder *claimInfo) (podState, *claimInfo) {
	switch {
	case holder != nil && pi.present && pi.ready:
		return stateHeld, holder
	case holder != nil:
		return stateLost, holder
	case !pi.present:
		return stateGone, nil
	case pi.mark != "" || pi.strays > 0 || pi.waiting || p.pods.Get(pi.name()) != pi:
		return stateFenced, nil
	case pi.ready:
		return stateFree, nil
	case !pi.ending && !pi.wasReady:
		return stateStarting, nil
	}
	return stateUnready, nil
}

// refresh brings a pod that no decision concerns (not reserved, settling
// or recycling) to the state the listing and the store give it.
func (p *pool) refresh(pi *podInfo) {
	if !pi.state.active() {
		p.toPassive(pi)
	}
}

// endActive ends a decision about pi (its reservation, settling or
// recycling): it goes to the state the listing and the store give it.
func (p *pool) endActive(pi *podInfo) {
	if pi.state.active() {
		p.toPassive(pi)
	}
}

// toPassive moves pi to the state the listing and the store give it.
func (p *pool) toPassive(pi *podInfo) {
	to, holder := p.passive(pi)
	p.setState(pi, to, holder, false)
}

// reset puts pi in the state the listing and the store give it, whatever
// it was in: recovery rebuilds the pool from records and marks.
func (p *pool) reset(pi *podInfo) {
	pi.recycled, pi.handed = false, false
	to, holder := p.passive(pi)
	if pi.state.active() {
		// Leave the active state first: what it concerned is rebuilt.
		p.setState(pi, stateGone, nil, true)
	}
	p.setState(pi, to, holder, true)
}

// reserve puts pi in reserved for ci until the given time.
func (p *pool) reserve(pi *podInfo, ci *claimInfo, until time.Time) {
	p.setState(pi, stateReserved, ci, false)
	if pi.state == stateReserved {
		pi.setClaim(ci, until)
	}
}

// entryIn returns the pool's entry under name if it is in state s.
func (p *pool) entryIn(name string, s podState) *podInfo {
	if pi := p.pods.Get(name); pi != nil && pi.state == s {
		return pi
	}
	return nil
}

// maxMoved bounds the memory pool.moved keeps between calls.
const maxMoved = 1024

// checkMoved checks the pods whose state changed in the current call (see
// pool.moved), at its end: a passive state is the one the listing and the
// store give the pod, an active one concerns a claim, and the pod is in
// exactly the set and list of its state. It costs what the call changed,
// not the pool's size, and runs after every Round and Update, whatever
// WithInvariantChecks says (which checks the whole pool).
func (p *pool) checkMoved() error {
	defer p.forgetMoves()
	for _, pi := range p.moved {
		if p.podSeen.at(pi) == nil {
			continue // forgotten (removePod left the state that counts it)
		}
		if err := p.checkPod(pi); err != nil {
			return fmt.Errorf("pool %s: %w: %w", p.name, ErrInconsistent, err)
		}
	}
	return nil
}

// forgetMoves empties pool.moved. Recovery calls it too: it has just set
// every pod's state from what the listing, the marks and the records say
// (reset), which checkMoved would only repeat at the cost of the pool's
// size; WithInvariantChecks checks the pool whole.
func (p *pool) forgetMoves() {
	clear(p.moved)
	if cap(p.moved) > maxMoved {
		p.moved = nil
	} else {
		p.moved = p.moved[:0]
	}
}

// checkPod checks one pod's state against what it is derived from and
// against the sets and the free list that follow it.
func (p *pool) checkPod(pi *podInfo) error {
	name := pi.name()
	if pi.state.active() {
		if pi.claim() == nil || p.pods.Get(name) != pi {
			return fmt.Errorf("pod %s (uid %s) is %s for claim %v, entry %t", name, pi.uid(), pi.state, pi.claim() != nil, p.pods.Get(name) == pi)
		}
	} else {
		if want, _ := p.passive(pi); pi.state != want {
			return fmt.Errorf("pod %s (uid %s): state %s, the listing and the store say %s", name, pi.uid(), pi.state, want)
		}
		if pi.claim() != nil {
			return fmt.Errorf("pod %s (uid %s) is %s and keeps a claim", name, pi.uid(), pi.state)
		}
	}
	if free := pi.freeIdx >= 0 && int(pi.freeIdx) < len(p.free) && p.free[pi.freeIdx].Name == name; free != (pi.state == stateFree) || (pi.freeIdx >= 0) != free {
		return fmt.Errorf("pod %s (uid %s): state %s, at %d in the free list", name, pi.uid(), pi.state, pi.freeIdx)
	}
	in := func(set map[*podInfo]struct{}) bool {
		if len(set) == 0 {
			return false // most sets are empty most of the time: no lookup
		}
		_, ok := set[pi]
		return ok
	}
	lost, reserved, settling, recycling := in(p.lost), in(p.reserved), in(p.settling), in(p.recycling)
	if lost != (pi.state == stateLost) || reserved != (pi.state == stateReserved) ||
		settling != (pi.state == stateSettling) || recycling != (pi.state == stateRecycling) {
		return fmt.Errorf("pod %s (uid %s): state %s, in the sets lost %t, reserved %t, settling %t, recycling %t", name, pi.uid(), pi.state, lost, reserved, settling, recycling)
	}
	return nil
}
