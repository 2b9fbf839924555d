package allocator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/syncer"
)

// Quarantine is how long pods named in a write whose outcome is unknown (a
// timeout after the API server may have applied it), or marked by another
// allocator for a claim whose record does not list them yet, stay out of
// the pool before the allocator reads the claim again to settle them. It is
// longer than the API server's own request timeout (60 s), so a write still
// in flight has landed or failed by then. It serves liveness only: a pod is
// settled by a write that fences any write still in flight, not by waiting.
const Quarantine = 2 * time.Minute

// round is the state of one Round call. It runs with the pool's mu held.
type round struct {
	a   *defaultAllocator
	p   *pool
	ctx context.Context
	now time.Time
	res *Result
	// errs collects per-claim errors that do not stop the round.
	errs []error
	// shortfall adds demand the algorithm did not see (moving claims).
	shortfall int
	// listIdle asks report for the names of idle pods (Round), not only
	// their number (Update).
	listIdle bool
	// check holds pods whose mark changed in this round's input (pod
	// marks): resolveMark looks at them once the claims are in.
	check []*podInfo
	// verify holds pods to read live before the records naming them are
	// decided on, with those claims.
	verify map[*podInfo][]*claimInfo
	// confirm holds claims to read live before their records' entries for
	// unmarked pods are acted on.
	confirm map[*claimInfo][]string
}

func (a *defaultAllocator) Round(ctx context.Context, in Input) (Result, error) {
	res := Result{Pool: in.Pool}
	if err := validateInput(in); err != nil {
		return res, err
	}
	p := a.getPool(in.Pool)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	r := &round{a: a, p: p, ctx: ctx, now: a.cfg.clock.Now(), res: &res}

	for i := range in.Pods {
		r.observePod(&in.Pods[i])
	}
	for name, pi := range p.pods {
		if pi.seen != p.gen {
			r.podGone(name, pi)
		}
	}
	if !p.recovered {
		if err := r.recover(in.Claims); err != nil {
			r.report()
			return res, err
		}
	}
	for _, c := range in.Claims {
		if err := r.observeClaim(c); err != nil {
			r.report()
			return res, err
		}
	}
	for _, ci := range p.claims {
		if ci.seen != p.gen {
			r.claimGone(ci)
		}
	}
	r.listIdle = true
	return r.run()
}

func (a *defaultAllocator) Update(ctx context.Context, ch Changes) (Result, error) {
	res := Result{Pool: ch.Pool}
	if err := validateInput(Input{Pool: ch.Pool, Pods: ch.Pods, Claims: ch.Claims}); err != nil {
		return res, err
	}
	p := a.getPool(ch.Pool)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.recovered {
		return res, fmt.Errorf("%w: pool %s: Update before the pool's first Round", ErrInvalidInput, ch.Pool)
	}
	p.gen++
	r := &round{a: a, p: p, ctx: ctx, now: a.cfg.clock.Now(), res: &res}
	for i := range ch.Pods {
		r.observePod(&ch.Pods[i])
	}
	for _, name := range ch.DeletedPods {
		if pi := p.pods[name]; pi != nil {
			r.podGone(name, pi)
		}
	}
	for _, c := range ch.Claims {
		if err := r.observeClaim(c); err != nil {
			r.report()
			return res, err
		}
	}
	for _, uid := range ch.DeletedClaims {
		if ci := p.claims[uid]; ci != nil {
			r.claimGone(ci)
		}
	}
	return r.run()
}

// run is the part of a round after the input was observed: plan, recycle,
// commit, report.
func (r *round) run() (Result, error) {
	if n := len(r.p.dirty); n > r.p.dirtyPeak {
		r.p.dirtyPeak = n
	}
	r.resolvePods()
	r.settleReservations()
	act, err := r.plan()
	if err != nil {
		r.report()
		return *r.res, err
	}
	r.queueReleases(act.Release)
	r.queueOrphans()
	r.markHeld()
	done, settled := r.recycle()
	r.commit(act.Allocate, done, settled)
	r.res.Shortfall = act.Shortfall + r.shortfall
	r.settle()
	r.report()
	return *r.res, errors.Join(r.errs...)
}

// settle drops from the dirty set the claims with nothing left to do, and
// forgets claims that left the pool holding nothing.
func (r *round) settle() {
	p := r.p
	for ci := range p.dirty {
		if !ci.listed {
			if len(ci.held) == 0 && !r.hasReservations(ci) {
				delete(p.dirty, ci)
				r.setStrays(ci, nil)
				if p.claims[ci.uid] == ci {
					delete(p.claims, ci.uid)
					p.forget(ci)
				}
			}
			continue
		}
		if r.settled(ci) {
			delete(p.dirty, ci)
		}
	}
	// A Go map keeps its buckets when emptied, and ranging over it visits
	// them all: once recovery's burst of dirty claims has settled, start a
	// small map so later rounds do not pay for the pool's size.
	if n := len(p.dirty); n < p.dirtyPeak/4 {
		small := make(map[*claimInfo]struct{}, n)
		for ci := range p.dirty {
			small[ci] = struct{}{}
		}
		p.dirty, p.dirtyPeak = small, n
	} else if n > p.dirtyPeak {
		p.dirtyPeak = n
	}
}

// settled reports whether a listed claim needs nothing from the next round
// unless something about it changes.
func (r *round) settled(ci *claimInfo) bool {
	if ci.recycling > 0 || ci.rewrite || r.hasReservations(ci) {
		return false
	}
	if ci.terminating {
		return len(ci.held) == 0 && !r.a.cfg.syncer.HasFinalizer(ci.obj)
	}
	if len(ci.held) != ci.want {
		return false
	}
	for _, pod := range ci.release {
		if _, done := ci.consumed[pod]; !done && ci.held[pod] != nil {
			return false
		}
	}
	if r.a.cfg.replaceLost {
		for name := range ci.held {
			if _, lost := r.p.lost[name]; lost {
				return false
			}
		}
	}
	return true
}

func validateInput(in Input) error {
	if in.Pool.Name == "" || in.Pool.Namespace == "" {
		return fmt.Errorf("%w: pool %q: empty namespace or name", ErrInvalidInput, in.Pool)
	}
	pods := make(map[string]struct{}, len(in.Pods))
	for i := range in.Pods {
		pod := &in.Pods[i]
		if pod.Name == "" {
			return fmt.Errorf("%w: pool %s: pod %d has no name", ErrInvalidInput, in.Pool, i)
		}
		if pod.Namespace != in.Pool.Namespace {
			return fmt.Errorf("%w: pool %s: pod %s/%s is in another namespace", ErrInvalidInput, in.Pool, pod.Namespace, pod.Name)
		}
		if _, dup := pods[pod.Name]; dup {
			return fmt.Errorf("%w: pool %s: pod %s listed twice", ErrInvalidInput, in.Pool, pod.Name)
		}
		pods[pod.Name] = struct{}{}
	}
	uids := make(map[types.UID]struct{}, len(in.Claims))
	for i, c := range in.Claims {
		if c.Object == nil {
			return fmt.Errorf("%w: pool %s: claim %d has a nil object", ErrInvalidInput, in.Pool, i)
		}
		name := client.ObjectKeyFromObject(c.Object)
		switch {
		case name.Namespace != in.Pool.Namespace:
			return fmt.Errorf("%w: pool %s: claim %s is in another namespace", ErrInvalidInput, in.Pool, name)
		case c.Object.GetUID() == "":
			return fmt.Errorf("%w: pool %s: claim %s has no UID (was it read from the API server?)", ErrInvalidInput, in.Pool, name)
		case c.Want < 0:
			return fmt.Errorf("%w: pool %s: claim %s wants %d pods", ErrInvalidInput, in.Pool, name, c.Want)
		}
		if _, dup := uids[c.Object.GetUID()]; dup {
			return fmt.Errorf("%w: pool %s: claim %s (uid %s) listed twice", ErrInvalidInput, in.Pool, name, c.Object.GetUID())
		}
		uids[c.Object.GetUID()] = struct{}{}
	}
	return nil
}

// observePod records a pod of the listing. A pod whose resourceVersion did
// not change costs a map lookup.
func (r *round) observePod(pod *corev1.Pod) {
	p := r.p
	pi := p.pods[pod.Name]
	if pi == nil {
		pi = &podInfo{name: pod.Name, uid: pod.UID, freeIdx: -1}
		p.pods[pod.Name] = pi
	} else if pi.uid != pod.UID && pod.UID != "" {
		pi = r.newIncarnation(pi, pod.UID)
	}
	pi.seen = p.gen
	if pi.present && pod.ResourceVersion != "" && (pi.rv == pod.ResourceVersion || slices.Contains(pi.oldRVs, pod.ResourceVersion)) {
		return
	}
	if n := rvNum(pod.ResourceVersion); pi.present && n != 0 && n < rvNum(pi.rv) {
		return // older than what is known (a lagging listing after a live read)
	}
	pi.present = true
	pi.rv = pod.ResourceVersion
	if key := r.a.cfg.markKey; key != "" {
		if mark := pod.Annotations[key]; mark != pi.mark {
			pi.mark, pi.markOwn, pi.markRV = mark, false, 0
			if mark != "" {
				pi.markRV = rvNum(pod.ResourceVersion)
			}
			r.check = append(r.check, pi)
		} else if mark != "" && pi.markRV == 0 {
			pi.markRV = rvNum(pod.ResourceVersion)
		}
	}
	pi.ready = r.a.cfg.ready(pod)
	pi.node = pod.Spec.NodeName
	if r.a.cfg.zoneLabel != "" {
		pi.zone = pod.Labels[r.a.cfg.zoneLabel]
	}
	p.refreshFree(pi)
}

// newIncarnation handles a pod listed under a known name with another UID:
// a new pod (DESIGN I12). The old one is gone. If nothing refers to the old
// one any more the new one takes its entry; otherwise it waits in next
// until the old one is released.
func (r *round) newIncarnation(old *podInfo, uid types.UID) *podInfo {
	p := r.p
	if old.present {
		old.present, old.ready = false, false
		p.refreshFree(old)
	}
	old.seen = p.gen
	if old.holder == nil && old.reservedBy == nil && old.settleFor == nil {
		pi := &podInfo{name: old.name, uid: uid, freeIdx: -1, strays: old.strays}
		if old.freeIdx >= 0 {
			p.refreshFree(old)
		}
		p.pods[old.name] = pi
		return pi
	}
	if old.next == nil || old.next.uid != uid {
		old.next = &podInfo{name: old.name, uid: uid, freeIdx: -1}
	}
	return old.next
}

// podGone records that a pod left the pool.
func (r *round) podGone(name string, pi *podInfo) {
	p := r.p
	if pi.next != nil && pi.next.seen != p.gen {
		pi.next = nil
	}
	if pi.present {
		pi.present, pi.ready, pi.rv = false, false, ""
		p.refreshFree(pi)
	}
	r.maybeForget(pi)
}

// blocked returns the error that makes the pool fail closed because of
// claim c.
func (r *round) blocked(uid types.UID, name types.NamespacedName, err error) error {
	return fmt.Errorf("%w: %w", ErrPoolBlocked, &ClaimError{Pool: r.p.name, Claim: name, UID: uid, Err: err})
}

// found is a claim met at recovery and the pods its record holds.
type found struct {
	ci   *claimInfo
	held []string
	rec  syncer.Record
}

// readRecord decodes a claim's record. A malformed release list is the
// owner's request, not something the allocator wrote: it is reported on
// that claim alone and taken as empty (ok stays true). Anything else
// unreadable makes the pool fail closed.
func (r *round) readRecord(ci *claimInfo, o client.Object) (syncer.Record, error) {
	rec, err := r.a.cfg.syncer.Read(o)
	if err == nil {
		return rec, nil
	}
	if errors.Is(err, syncer.ErrMalformedRelease) {
		r.errs = append(r.errs, r.claimErr(ci, fmt.Errorf("%w: %w", ErrInvalidRelease, err)))
		rec.Release = nil
		return rec, nil
	}
	return rec, r.blocked(ci.uid, ci.name, err)
}

// recover rebuilds the pool's allocations from the claims' records. It
// changes nothing unless every record can be read. Without pod marks a pod
// listed by two claims blocks the pool; with them, the marks decide.
func (r *round) recover(claims []Claim) error {
	p, a := r.p, r.a
	all := make([]found, 0, len(claims))
	owner := make(map[string]*claimInfo)
	for _, c := range claims {
		ci := newClaimInfo(c)
		rec, err := r.readRecord(ci, c.Object)
		if err != nil {
			return err
		}
		held := rec.Held()
		if !r.marks() {
			for _, pod := range held {
				if other, dup := owner[pod]; dup {
					return r.blocked(ci.uid, ci.name, fmt.Errorf("%w: pod %s is also listed by claim %s (uid %s)",
						syncer.ErrMalformedRecord, pod, other.name, other.uid))
				}
				owner[pod] = ci
			}
		}
		ci.release, ci.released = rec.Release, rec.Released
		all = append(all, found{ci: ci, held: held, rec: rec})
	}
	if err := a.cfg.store.DeletePool(p.name); err != nil {
		return fmt.Errorf("pool %s: recover: %w", p.name, err)
	}
	for _, pi := range p.pods {
		pi.holder, pi.recycling, pi.recycled = nil, false, false
		pi.reservedBy, pi.settleFor, pi.strays = nil, nil, 0
	}
	clear(p.recycling)
	clear(p.lost)
	clear(p.dirty)
	clear(p.reserved)
	clear(p.settling)
	p.claims = make(map[types.UID]*claimInfo, len(all))
	for _, f := range all {
		p.claims[f.ci.uid] = f.ci
		p.dirty[f.ci] = struct{}{}
		f.ci.seen, f.ci.listed = p.gen, true
	}
	if r.marks() {
		for _, f := range all {
			r.takeIn(f.ci, f.rec, rvNum(f.ci.obj.GetResourceVersion()))
		}
		for _, pi := range p.pods {
			r.resolveMark(pi)
		}
		r.check = r.check[:0]
		p.recovered = true
		return nil
	}
	// Pods a moved claim holds in a pool that already recovered stay there.
	for i := range all {
		f := &all[i]
		other, ok := a.heldElsewhere(f.ci.uid, p.name)
		if !ok {
			continue
		}
		f.held = slices.DeleteFunc(f.held, func(pod string) bool {
			h, held, err := a.cfg.store.HolderOf(other, pod)
			return err == nil && held && h.UID == f.ci.uid
		})
	}
	for _, f := range all {
		if len(f.held) == 0 {
			continue
		}
		if err := a.cfg.store.Allocate(p.name, f.ci.holder(), f.held); err != nil {
			return fmt.Errorf("pool %s: recover claim %s: %w", p.name, f.ci.name, err)
		}
		for _, pod := range f.held {
			r.hold(f.ci, pod)
		}
		a.setHolds(f.ci.uid, p.name, true)
	}
	p.recovered = true
	return nil
}

func newClaimInfo(c Claim) *claimInfo {
	o := c.Object
	ci := &claimInfo{
		uid:         o.GetUID(),
		name:        client.ObjectKeyFromObject(o),
		obj:         o,
		want:        c.Want,
		priority:    c.Priority,
		created:     o.GetCreationTimestamp().Time,
		terminating: o.GetDeletionTimestamp() != nil,
		held:        make(map[string]*podInfo),
	}
	ci.addRV(o.GetResourceVersion())
	return ci
}

// podOrNew returns the pod's entry, creating an absent one for a pod named
// by a record but missing from the listing.
func (p *pool) podOrNew(name string) *podInfo {
	pi := p.pods[name]
	if pi == nil {
		pi = &podInfo{name: name, freeIdx: -1}
		p.pods[name] = pi
	}
	return pi
}

// hold mirrors in memory that ci holds pod; the store already says so.
func (r *round) hold(ci *claimInfo, pod string) {
	pi := r.p.podOrNew(pod)
	pi.holder = ci
	ci.held[pod] = pi
	r.p.refreshFree(pi)
}

// unhold mirrors in memory that ci no longer holds pod; the store already
// says so. With pod marks, a fence other than 0 queues the removal of the
// pod's mark (see unmarkEntry).
func (r *round) unhold(ci *claimInfo, pod string, fence uint64) {
	pi := ci.held[pod]
	if pi == nil {
		return
	}
	delete(ci.held, pod)
	pi.holder = nil
	if fence != 0 {
		r.queueUnmark(pi, ci.uid, fence)
	}
	if pi.recycling {
		pi.recycling, pi.recycled = false, false
		ci.recycling--
		delete(r.p.recycling, pod)
	}
	r.maybeForget(pi)
}

// observeClaim records a claim of the listing. Only a claim whose
// resourceVersion is new to the allocator is decoded: an older version than
// one the allocator wrote carries a resourceVersion it already saw.
func (r *round) observeClaim(c Claim) error {
	p := r.p
	o := c.Object
	uid, rv := o.GetUID(), o.GetResourceVersion()
	ci := p.claims[uid]
	if p.proto == nil {
		p.proto = o
		r.a.setProto(o)
	}
	switch {
	case ci == nil && rvNum(rv) < p.forgotten[uid]:
		// A stale copy of a claim that left the pool: nothing to learn.
		return nil
	case ci == nil:
		ci = newClaimInfo(c)
		rec, err := r.readRecord(ci, o)
		if err != nil {
			return err
		}
		ci.release, ci.released = rec.Release, rec.Released
		p.claims[uid] = ci
		p.dirty[ci] = struct{}{}
		ci.listed = true
		if r.marks() {
			r.takeIn(ci, rec, rvNum(rv))
		} else {
			r.checkRecord(ci, rec)
		}
	case rv == "" || !ci.sawRV(rv) || ci.obj == nil:
		rec, err := r.readRecord(ci, o)
		if err != nil {
			return err
		}
		ci.obj = o
		ci.addRV(rv)
		ci.setRelease(rec.Release)
		ci.want, ci.priority = c.Want, c.Priority
		ci.created = o.GetCreationTimestamp().Time
		if o.GetDeletionTimestamp() != nil {
			ci.terminating = true
		}
		ci.listed = true
		if r.marks() {
			r.takeIn(ci, rec, rvNum(rv))
		} else {
			r.checkRecord(ci, rec)
		}
		p.dirty[ci] = struct{}{}
	case !ci.listed:
		p.dirty[ci] = struct{}{}
	}
	ci.seen = p.gen
	ci.listed = true
	ci.since = time.Time{}
	return nil
}

// claimGone records that a claim left the pool's listing: deleted,
// force-deleted or moved. Its pods are given back.
func (r *round) claimGone(ci *claimInfo) {
	if ci.listed && ci.since.IsZero() {
		// It may be gone, moved, or missing from a lagging listing: its
		// pods are given back once it is found deleted, or once it has
		// been missing for a Quarantine (see queueOrphans).
		ci.since = r.now
	}
	ci.listed = false
	r.p.dirty[ci] = struct{}{}
}

// checkRecord compares the pods a claim's record says it holds with what the
// allocator gave it. Records are trusted only at recovery: later, a pod in
// the record that the claim does not hold here (nor in another pool) was not
// put there by the allocator and is not handed to the claim, and a held pod
// missing from the record stays held. Either way the record is written
// again.
func (r *round) checkRecord(ci *claimInfo, rec syncer.Record) {
	if ci.unsettled {
		return // a write of unknown outcome may have changed it
	}
	var extra []string
	inRecord := 0
	for _, pod := range rec.Held() {
		if _, ok := ci.held[pod]; ok {
			inRecord++
			continue
		}
		if pi := r.p.pods[pod]; pi != nil && pi.reservedBy == ci {
			continue // settled by settleReservations
		}
		if other, ok := r.a.heldElsewhere(ci.uid, r.p.name); ok {
			if h, held, err := r.a.cfg.store.HolderOf(other, pod); err == nil && held && h.UID == ci.uid {
				continue
			}
		}
		extra = append(extra, pod)
	}
	missing := len(ci.held) - inRecord
	if len(extra) == 0 && missing == 0 {
		ci.untrusted = nil
		return
	}
	ci.rewrite = true
	ci.untrusted = &ClaimError{Pool: r.p.name, Claim: ci.name, UID: ci.uid,
		Err: fmt.Errorf("%w: lists %v it does not hold, misses %d it holds", ErrUntrustedRecord, extra, missing)}
	r.errs = append(r.errs, ci.untrusted)
}

// reservationsByClaim groups the reserved pods by the claim they are
// reserved for.
func (r *round) reservationsByClaim() map[*claimInfo][]*podInfo {
	out := make(map[*claimInfo][]*podInfo)
	for _, pi := range r.p.reserved {
		out[pi.reservedBy] = append(out[pi.reservedBy], pi)
	}
	return out
}

// reservedFor counts the pods reserved for ci.
func (r *round) reservedFor(ci *claimInfo) int {
	n := 0
	for _, pi := range r.p.reserved {
		if pi.reservedBy == ci {
			n++
		}
	}
	return n
}

func (r *round) hasReservations(ci *claimInfo) bool {
	for _, pi := range r.p.reserved {
		if pi.reservedBy == ci {
			return true
		}
	}
	return false
}

// settleReservations decides, pod by pod, whether writes of unknown
// outcome (or, with pod marks, hand-outs of other allocators) landed: once
// the claim's newest known record lists the pod, or once the quarantine is
// over and a live read says so. A pod whose write did not land is settled
// for its claim (pod marks: recycled, recorded released, unmarked) or
// freed (without them). Claims still listed settle sooner: their next
// write carries the reserved pods (see commit).
func (r *round) settleReservations() {
	if len(r.p.reserved) == 0 {
		return
	}
	for ci, pods := range r.reservationsByClaim() {
		var held []string
		if ci.obj != nil {
			if rec, err := r.a.cfg.syncer.Read(ci.obj); err == nil {
				held = rec.Held()
			}
		}
		var landed, failed []*podInfo
		var due []*podInfo
		for _, pi := range pods {
			switch {
			case slices.Contains(held, pi.name) && (!r.marks() || pi.markUID(r.p.name) == ci.uid):
				landed = append(landed, pi)
			case !r.now.Before(pi.reservedUntil):
				due = append(due, pi)
			}
		}
		if len(due) > 0 {
			base := ci.obj
			if base == nil {
				base = r.p.protoFor(ci)
			}
			var live client.Object
			err := errNoProto
			if base != nil {
				live, err = r.live(ci, base)
			}
			switch {
			case apierrors.IsNotFound(err):
				// The claim is gone; if a write landed its owner may have
				// used the pods, so they are recycled, not freed.
				ci.gone = true
				landed = append(landed, due...)
			case err != nil:
				r.errs = append(r.errs, r.claimErr(ci, fmt.Errorf("%w: settle unknown write: %w", ErrWrite, err)))
			default:
				rec, err := r.a.cfg.syncer.Read(live)
				for _, pi := range due {
					if err == nil && slices.Contains(rec.Held(), pi.name) {
						landed = append(landed, pi)
					} else {
						failed = append(failed, pi)
					}
				}
			}
		}
		r.unreserve(ci, landed, true)
		r.unreserve(ci, failed, false)
	}
}

// unreserve ends the reservation of pods for ci: they are held by it if
// their write landed. Otherwise, with pod marks, they are settled for it
// (the write that records them released fences a write still in flight);
// without marks they are free.
func (r *round) unreserve(ci *claimInfo, pods []*podInfo, landed bool) {
	if len(pods) == 0 {
		return
	}
	names := make([]string, len(pods))
	for i, pi := range pods {
		names[i] = pi.name
		pi.reservedBy, pi.reservedUntil = nil, time.Time{}
		delete(r.p.reserved, pi.name)
	}
	r.p.dirty[ci] = struct{}{}
	if landed {
		if err := r.a.cfg.store.Allocate(r.p.name, ci.holder(), names); err != nil {
			r.errs = append(r.errs, r.claimErr(ci, err))
			for _, pi := range pods {
				r.p.refreshFree(pi)
			}
			return
		}
		for _, n := range names {
			r.hold(ci, n)
		}
		r.a.setHolds(ci.uid, r.p.name, true)
		return
	}
	for _, pi := range pods {
		if r.marks() && pi.mark != "" && pi.markUID(r.p.name) == ci.uid {
			r.startSettle(ci, pi)
			continue
		}
		r.maybeForget(pi)
	}
}

// setRelease records the owner's release list; consumed entries the owner
// dropped are forgotten, so listing the pod again is a new request.
func (c *claimInfo) setRelease(release []string) {
	c.release = release
	for pod := range c.consumed {
		if !slices.Contains(release, pod) {
			delete(c.consumed, pod)
		}
	}
}

func (r *round) claimErr(ci *claimInfo, err error) error {
	return &ClaimError{Pool: r.p.name, Claim: ci.name, UID: ci.uid, Err: err}
}

// plan builds the requests of claims whose holdings may change and asks the
// algorithm. The action is checked before anything is committed.
func (r *round) plan() (algorithm.Action, error) {
	p, replace := r.p, r.a.cfg.replaceLost
	var reqs []algorithm.Request
	for ci := range p.dirty {
		if !ci.listed {
			continue
		}
		want := ci.want
		if ci.terminating {
			want = 0
		}
		// Pods reserved for the claim by a write of unknown outcome may be
		// its own: they count against what it wants, and the next write
		// of its record carries them (see commit).
		// They are not held yet, so they still count in the shortfall.
		reserved := min(want, r.reservedFor(ci))
		want -= reserved
		r.shortfall += reserved
		if len(ci.held) == 0 {
			if _, moving := r.a.heldElsewhere(ci.uid, p.name); moving {
				r.shortfall += want
				continue
			}
		}
		keep := len(ci.held) - ci.recycling
		var lost int
		if replace {
			for name := range ci.held {
				if _, ok := p.lost[name]; ok {
					lost++
				}
			}
		}
		var release []string
		for _, pod := range ci.release {
			if _, done := ci.consumed[pod]; done {
				continue
			}
			if pi := ci.held[pod]; pi != nil && !pi.recycling && !slices.Contains(release, pod) {
				release = append(release, pod)
			}
		}
		if keep == want && len(release) == 0 && lost == 0 {
			continue
		}
		req := algorithm.Request{UID: ci.uid, Claim: ci.name, Want: want, Priority: ci.priority, Created: ci.created}
		for name, pi := range ci.held {
			if pi.recycling {
				continue
			}
			if replace && !pi.present {
				continue // dropped from the record by commit
			}
			req.Held = append(req.Held, name)
			if replace && !pi.ready && !slices.Contains(release, name) {
				release = append(release, name)
			}
		}
		slices.Sort(req.Held)
		req.Release = release
		reqs = append(reqs, req)
	}
	requested := make(map[types.UID]*claimInfo, len(reqs))
	for _, req := range reqs {
		requested[req.UID] = p.claims[req.UID]
	}
	slices.SortFunc(reqs, func(x, y algorithm.Request) int {
		if x.UID < y.UID {
			return -1
		}
		if x.UID > y.UID {
			return 1
		}
		return 0
	})
	// The algorithm gets a copy of the free list: a strategy that sorts or
	// edits its input in place must not reorder the pool's own list, and
	// its action is checked against the pool's state, not against positions
	// in that list.
	p.offer = append(p.offer[:0], p.free...)
	act, err := r.a.cfg.algorithm.Plan(algorithm.Input{Candidates: p.offer, Requests: reqs})
	if err != nil {
		return act, fmt.Errorf("pool %s: %w: %w", p.name, ErrPlan, err)
	}
	if err := r.checkAction(requested, act); err != nil {
		return algorithm.Action{}, fmt.Errorf("pool %s: %w: %w", p.name, ErrPlan, err)
	}
	return act, nil
}

// checkAction refuses an action that breaks the Algorithm contract, so that
// a faulty strategy can never hand out a pod that is not free or release a
// pod its claim does not hold. Every pod is checked against the pool's
// state, not against what the strategy was given (which it may have
// modified).
func (r *round) checkAction(requested map[types.UID]*claimInfo, act algorithm.Action) error {
	taken := make(map[string]struct{})
	for _, g := range act.Allocate {
		if requested[g.UID] == nil {
			return fmt.Errorf("allocation to claim %s (uid %s) that was not requested", g.Claim, g.UID)
		}
		for _, pod := range g.Pods {
			pi := r.p.pods[pod]
			if pi == nil || !r.p.candidate(pi) {
				return fmt.Errorf("claim %s: pod %s is not a candidate", g.Claim, pod)
			}
			// The store is the index of holdings: it must agree.
			if h, held, err := r.a.cfg.store.HolderOf(r.p.name, pod); err != nil || held {
				return fmt.Errorf("claim %s: pod %s is held by %v in the store (%v)", g.Claim, pod, h, err)
			}
			if _, dup := taken[pod]; dup {
				return fmt.Errorf("pod %s allocated twice", pod)
			}
			taken[pod] = struct{}{}
		}
	}
	for _, g := range act.Release {
		ci := requested[g.UID]
		if ci == nil {
			return fmt.Errorf("release from claim %s (uid %s) that was not requested", g.Claim, g.UID)
		}
		for _, pod := range g.Pods {
			if pi := ci.held[pod]; pi == nil || pi.recycling {
				return fmt.Errorf("claim %s: released pod %s is not held", ci.name, pod)
			}
			if _, dup := taken[pod]; dup {
				return fmt.Errorf("pod %s released twice", pod)
			}
			taken[pod] = struct{}{}
		}
	}
	return nil
}

func (r *round) startRecycling(ci *claimInfo, pi *podInfo) {
	if pi.recycling {
		return
	}
	pi.recycling = true
	ci.recycling++
	r.p.recycling[pi.name] = pi
	r.p.refreshFree(pi)
}

func (r *round) queueReleases(grants []algorithm.Grant) {
	for _, g := range grants {
		ci := r.p.claims[g.UID]
		for _, pod := range g.Pods {
			r.startRecycling(ci, ci.held[pod])
		}
	}
}

// queueOrphans gives back every pod held by a claim that is not in the
// listing any more: deleted, force-deleted or moved to another pool. As it
// may just be missing from a lagging listing, its pods are given back once
// a live read finds it deleted, or once it has been missing for a
// Quarantine.
func (r *round) queueOrphans() {
	for ci := range r.p.dirty {
		if ci.listed || len(ci.held) == 0 {
			continue
		}
		if !ci.since.IsZero() && !ci.gone && r.now.Before(ci.since.Add(Quarantine)) {
			r.probe(ci)
			if !ci.gone {
				continue
			}
		}
		for _, pi := range ci.held {
			r.startRecycling(ci, pi)
		}
	}
}

// probe reads a claim known only from pod marks live, to learn whether it
// still exists.
func (r *round) probe(ci *claimInfo) {
	base := ci.obj
	if base == nil {
		base = r.p.protoFor(ci)
	}
	if base == nil {
		return
	}
	if _, err := r.live(ci, base); apierrors.IsNotFound(err) {
		ci.gone = true
	}
}

// recycle offers every pod being given back or settled to the recycler,
// concurrently, and returns those done, per claim. A pod that left the
// listing is done. With pod marks, a pod is offered only while its mark
// names the claim it is recycled for.
func (r *round) recycle() (done, settled map[*claimInfo][]string) {
	type job struct {
		ci     *claimInfo
		pi     *podInfo
		settle bool
	}
	var jobs []job
	done = make(map[*claimInfo][]string)
	settled = make(map[*claimInfo][]string)
	add := func(ci *claimInfo, pi *podInfo, settle bool) {
		out := done
		if settle {
			out = settled
		}
		switch {
		case !pi.present || pi.recycled:
			out[ci] = append(out[ci], pi.name)
		case r.marks() && pi.markUID(r.p.name) != ci.uid:
			// Not marked for ci (yet): not ours to recycle.
		default:
			jobs = append(jobs, job{ci, pi, settle})
		}
	}
	for _, pi := range r.p.recycling {
		add(pi.holder, pi, false)
	}
	for _, pi := range r.p.settling {
		add(pi.settleFor, pi, true)
	}
	for _, pods := range done {
		slices.Sort(pods)
	}
	for _, pods := range settled {
		slices.Sort(pods)
	}
	slices.SortFunc(jobs, func(x, y job) int { return strings.Compare(x.pi.name, y.pi.name) })
	results := make([]error, len(jobs))
	finished := make([]bool, len(jobs))
	r.parallel(len(jobs), func(i int) {
		j := jobs[i]
		finished[i], results[i] = r.a.cfg.recycle(r.ctx, RecycleRequest{
			Pool: r.p.name, Pod: j.pi.name, UID: j.pi.uid, ResourceVersion: j.pi.rv, Claim: j.ci.holder(),
		})
	})
	for i, j := range jobs {
		if results[i] != nil {
			r.errs = append(r.errs, r.claimErr(j.ci, fmt.Errorf("%w: pod %s: %w", ErrRecycle, j.pi.name, results[i])))
			continue
		}
		if finished[i] {
			j.pi.recycled = true
			if j.settle {
				settled[j.ci] = append(settled[j.ci], j.pi.name)
			} else {
				done[j.ci] = append(done[j.ci], j.pi.name)
			}
		}
	}
	return done, settled
}

// parallel runs f(0..n-1) with at most the configured number at once.
func (r *round) parallel(n int, f func(i int)) {
	if n == 0 {
		return
	}
	limit := min(r.a.cfg.writers, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range limit {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
