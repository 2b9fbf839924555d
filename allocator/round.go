package allocator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/syncer"
)

// DefaultQuarantine is the quarantine unless WithQuarantine sets another.
// The quarantine is how long pods named in a write whose outcome is unknown
// (a timeout after the API server may have applied it), or marked by
// another allocator for a claim whose record does not list them yet, stay
// out of the pool before the allocator reads the claim again to settle
// them, and how long a claim may be missing from a pool's listings before
// its pods are taken back. It is longer than the API server's own request
// timeout (60 s), so a write still in flight has landed or failed by then.
// For pods it serves liveness only: a pod is settled by a write that fences
// any write still in flight, not by waiting.
const DefaultQuarantine = 2 * time.Minute

// round is the state of one Round call. It runs with the pool's mu held.
type round struct {
	a   *defaultAllocator
	p   *pool
	ctx context.Context
	now time.Time
	res *Result
	// errs collects per-claim errors that do not stop the round.
	errs []error
	// failed is set once the store refused a write (storeFail): nothing
	// more is written in the round.
	failed bool
	// strayIdx indexes the claims' strays by pod for newerRecordWins,
	// built on first use in the round.
	strayIdx map[string][]*claimInfo
	// shortfall adds demand the algorithm did not see (moving claims).
	shortfall int
	// byClass is the round's shortfall by claim class (addShortfall).
	byClass map[string]int
	// listIdle asks report for the names of idle pods (Round), not only
	// their number (Update).
	listIdle bool
	// check holds pods whose mark changed in this round's input (pod
	// marks): resolveMark looks at them once the claims are in.
	check []*podInfo
	// incarnations are the entries that got a newer pod waiting under
	// their name this round (see adoptIncarnations).
	incarnations []*podInfo
	// verify holds pods to read live before the records naming them are
	// decided on, with those claims.
	verify map[*podInfo][]*claimInfo
	// unread holds the reserved pods whose live read failed this round:
	// their claims' writes are not issued again on an older view.
	unread map[*podInfo]bool
	// confirm holds claims to read live before their records' entries for
	// unmarked pods are acted on.
	confirm map[*claimInfo][]string
	// find holds names that records list and the listing lacks, to read
	// live: the pod listing may lag the records.
	find map[string][]*claimInfo
	// alive holds held pods the listing lacks that a live read found
	// still there (WithReplaceLost): the listing lags, and they are
	// neither replaced nor dropped.
	alive map[*podInfo]bool
	// input is the round's pod input; listed are its objects for the pods
	// being recycled or settled (RecycleRequest.Object).
	input  []corev1.Pod
	listed map[*podInfo]*corev1.Pod
	// one is onePod's list.
	one [1]string
}

func (a *defaultAllocator) Round(ctx context.Context, in Input) (Result, error) {
	return a.logged(ctx, "Round", in.Pool, func() (Result, error) { return a.doRound(ctx, in) })
}

func (a *defaultAllocator) Update(ctx context.Context, ch Changes) (Result, error) {
	return a.logged(ctx, "Update", ch.Pool, func() (Result, error) { return a.doUpdate(ctx, ch) })
}

// logged runs a round unless ctx has ended, and logs it through the
// context's logger (logr.FromContextOrDiscard): nothing at the default
// level, each warning at V(2), a one-line summary at V(4), and each claim's
// hand-outs and releases at V(5).
func (a *defaultAllocator) logged(ctx context.Context, kind string, pool types.NamespacedName, run func() (Result, error)) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{Pool: pool}, fmt.Errorf("pool %s: %w", pool, err)
	}
	start := a.cfg.clock.Now()
	res, err := run() // it publishes the pool's gauges itself, under the pool's lock
	if m := a.cfg.metrics; m != nil {
		m.observe(kind, pool, res, err, a.cfg.clock.Since(start))
	}
	if s := a.cfg.events; s != nil {
		if ref, rerr := a.claimRefOf(); rerr == nil {
			s.record(a.cfg.clock, ref, res, err)
		}
	}
	log := logr.FromContextOrDiscard(ctx)
	if !log.V(2).Enabled() {
		return res, err // no logger, or a quiet one: nothing to build
	}
	log = log.WithValues("pool", pool.String())
	for _, w := range res.Warnings {
		log.V(2).Info("dealt with a claim's problem", "warning", w.Error())
	}
	if v := log.V(4); v.Enabled() {
		kv := []any{"allocated", grantPods(res.Allocated), "released", grantPods(res.Released),
			"recycling", len(res.Recycling), "lost", len(res.Lost), "idle", res.IdleCount,
			"starting", res.Starting, "shortfall", res.Shortfall, "warnings", len(res.Warnings),
			"took", a.cfg.clock.Since(start).String()}
		if err != nil {
			kv = append(kv, "error", err.Error())
		}
		v.Info(kind, kv...)
	}
	if v := log.V(5); v.Enabled() {
		for _, g := range res.Allocated {
			v.Info("allocated", "claim", g.Claim.String(), "uid", string(g.UID), "pods", g.Pods)
		}
		for _, g := range res.Released {
			v.Info("released", "claim", g.Claim.String(), "uid", string(g.UID), "pods", g.Pods)
		}
		for _, l := range res.Lost {
			v.Info("lost", "claim", l.Claim.String(), "uid", string(l.UID), "pod", l.Pod, "missing", l.Missing)
		}
	}
	return res, err
}

func grantPods(gs []algorithm.Grant) int {
	n := 0
	for _, g := range gs {
		n += len(g.Pods)
	}
	return n
}

func (a *defaultAllocator) doRound(ctx context.Context, in Input) (Result, error) {
	if err := validatePool(in.Pool); err != nil {
		return Result{Pool: in.Pool}, err
	}
	for {
		p := a.lookupPool(in.Pool)
		made := p == nil
		if made {
			p = a.getPool(in.Pool)
		}
		p.mu.Lock()
		if p.dead {
			// Dropped while this call waited for it (ForgetPool, or it
			// failed closed, or its first input was refused): the pool
			// is looked up again.
			p.mu.Unlock()
			continue
		}
		res, err := a.runLocked(p, func() (Result, error) { return a.roundLocked(ctx, p, in, made) })
		p.mu.Unlock()
		return res, err
	}
}

// runLocked runs call, a round on p, whose mu the caller holds: under
// guard, ended by finish, then the pool's gauges are published (under the
// lock: see metrics.publish).
func (a *defaultAllocator) runLocked(p *pool, call func() (Result, error)) (Result, error) {
	res, err := a.guarded(p, call)
	err = a.finish(p, err)
	a.cfg.metrics.publish(p, res, err)
	return res, err
}

// guarded runs call, a round on p, under guard.
func (a *defaultAllocator) guarded(p *pool, call func() (Result, error)) (res Result, err error) {
	res.Pool = p.name
	defer a.guard(p, &err)
	return call()
}

// roundLocked is Round on p, whose mu the caller holds; made is set when
// this call made the pool.
func (a *defaultAllocator) roundLocked(ctx context.Context, p *pool, in Input, made bool) (Result, error) {
	res := Result{Pool: in.Pool}
	p.gen++
	r := &round{a: a, p: p, ctx: ctx, now: a.cfg.clock.Now(), res: &res, input: in.Pods}
	if !p.recovered && len(p.podSeen) == 0 && p.claims.Len() == 0 {
		return r.first(in, made)
	}
	pods, claims, err := r.scan(in.Pods, in.Claims)
	if err != nil {
		return res, err
	}
	for _, pod := range pods {
		r.observePod(pod)
	}
	var gone []*podInfo
	for _, s := range p.podSeen {
		if s.seen != p.gen && p.pods.Get(s.v.name()) == s.v {
			gone = append(gone, s.v)
		}
	}
	for _, pi := range gone {
		r.podGone(pi.name(), pi)
	}
	if !p.recovered {
		// An earlier recovery failed: the pods are observed, the claims
		// recovered now.
		if err := r.recover(in.Claims); err != nil {
			r.report()
			return res, err
		}
		claims = nil // recover took every claim in
	}
	r.setProto(in.Claims)
	for _, i := range claims {
		if err := r.observeClaim(in.Claims[i]); err != nil {
			r.report()
			return res, err
		}
	}
	var left []*claimInfo
	for _, s := range p.claimSeen {
		if s.seen != p.gen {
			left = append(left, s.v)
		}
	}
	for _, ci := range left {
		r.claimGone(ci)
	}
	r.listIdle = true
	return r.run()
}

func (a *defaultAllocator) doUpdate(ctx context.Context, ch Changes) (Result, error) {
	if err := validatePool(ch.Pool); err != nil {
		return Result{Pool: ch.Pool}, err
	}
	for {
		p := a.lookupPool(ch.Pool)
		if p == nil {
			return Result{Pool: ch.Pool}, fmt.Errorf("%w: pool %s: Update before the pool's first Round (or after the pool was forgotten or failed closed: a Round rebuilds it)", ErrInvalidInput, ch.Pool)
		}
		p.mu.Lock()
		if p.dead {
			p.mu.Unlock()
			continue
		}
		res, err := a.runLocked(p, func() (Result, error) { return a.updateLocked(ctx, p, ch) })
		p.mu.Unlock()
		return res, err
	}
}

// updateLocked is Update on p, whose mu the caller holds.
func (a *defaultAllocator) updateLocked(ctx context.Context, p *pool, ch Changes) (Result, error) {
	res := Result{Pool: ch.Pool}
	p.gen++
	r := &round{a: a, p: p, ctx: ctx, now: a.cfg.clock.Now(), res: &res, input: ch.Pods}
	pods, claims, err := r.scan(ch.Pods, ch.Claims)
	if err != nil {
		return res, err
	}
	if !p.recovered {
		return res, fmt.Errorf("%w: pool %s: Update before the pool's first Round (or after the pool was forgotten or failed closed: a Round rebuilds it)", ErrInvalidInput, ch.Pool)
	}
	for _, pod := range pods {
		r.observePod(pod)
	}
	for _, name := range ch.DeletedPods {
		if pi := p.pods.Get(name); pi != nil {
			r.podGone(name, pi)
		}
	}
	r.setProto(ch.Claims)
	for _, i := range claims {
		if err := r.observeClaim(ch.Claims[i]); err != nil {
			r.report()
			return res, err
		}
	}
	for _, uid := range ch.DeletedClaims {
		if ci := p.claims.Get(string(uid)); ci != nil {
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
	if len(r.p.tombs) > 0 {
		r.pruneTombs()
	}
	// Read what the decisions rest on, and take what is decided by it
	// alone: which marks and records to believe, which writes of unknown
	// outcome landed, which held pods are gone, which claims left.
	r.resolvePods()
	r.settleReservations()
	r.checkLost()
	r.queueOrphans()
	// Decide.
	r.p.orderArrivals()
	act, err := r.plan()
	if err != nil {
		r.report()
		return *r.res, err
	}
	if err := r.ctx.Err(); err != nil {
		// Cancelled before the round's writes: none is made.
		r.report()
		return *r.res, fmt.Errorf("pool %s: %w", r.p.name, err)
	}
	if err := r.p.takeStoreErr(); err != nil {
		// Who holds what was not known for certain while planning: the
		// plan is not committed.
		r.report()
		return *r.res, err
	}
	if err := r.p.violation; err != nil {
		// A pod's state was asked to make a move the diagram does not
		// have: nothing is committed on that state (finish fails the
		// pool closed).
		r.report()
		return *r.res, err
	}
	if r.failed {
		r.report()
		return *r.res, errors.Join(r.errs...)
	}
	// Act.
	r.queueReleases(act.Release)
	r.markHeld()
	if r.failed {
		r.report()
		return *r.res, errors.Join(r.errs...)
	}
	done, settled := r.recycle()
	r.commit(act.Allocate, done, settled)
	r.res.Shortfall = act.Shortfall + r.shortfall
	if r.res.Shortfall > 0 {
		r.res.ShortfallByClass = r.byClass
	}
	r.settle()
	r.report()
	if err := r.p.takeStoreErr(); err != nil {
		r.errs = append(r.errs, err)
	}
	return *r.res, errors.Join(r.errs...)
}

// settle drops from the dirty set the claims with nothing left to do, and
// forgets claims that left the pool holding nothing.
func (r *round) settle() {
	p := r.p
	// The claims a pod is reserved for, and those a pod is settling for,
	// each found once.
	var reservedFor, settlingFor map[*claimInfo]struct{}
	hasReserved := func(ci *claimInfo) bool {
		if reservedFor == nil {
			reservedFor = make(map[*claimInfo]struct{}, len(p.reserved))
			for pi := range p.reserved {
				reservedFor[pi.reservedBy()] = struct{}{}
			}
		}
		_, ok := reservedFor[ci]
		return ok
	}
	hasSettling := func(ci *claimInfo) bool {
		if settlingFor == nil {
			settlingFor = make(map[*claimInfo]struct{}, len(p.settling))
			for pi := range p.settling {
				settlingFor[pi.settling()] = struct{}{}
			}
		}
		_, ok := settlingFor[ci]
		return ok
	}
	for ci := range p.dirty {
		if !ci.listed {
			// A pod reserved or settling for the claim names its entry:
			// the claim is kept until none is (forgotten, it would come
			// back as a new entry those pods do not name).
			if p.nHeld(ci) == 0 && !hasReserved(ci) && !hasSettling(ci) {
				delete(p.dirty, ci)
				r.setStrays(ci, nil)
				if p.claims.Get(string(ci.uid())) == ci {
					p.claims.Del(string(ci.uid()))
					p.removeClaim(ci)
					p.forget(ci)
				}
			}
			continue
		}
		if r.settled(ci, hasReserved) {
			delete(p.dirty, ci)
			ci.letGo()
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
// unless something about it changes; hasReserved reports whether a pod is
// reserved for a claim.
func (r *round) settled(ci *claimInfo, hasReserved func(*claimInfo) bool) bool {
	if ci.recycling() > 0 || ci.rewrite || len(r.p.reserved) > 0 && hasReserved(ci) {
		return false
	}
	n := r.p.nHeld(ci)
	if ci.terminating {
		return n == 0 && !r.hasFinalizer(ci)
	}
	if n != int(ci.want) {
		return false
	}
	for _, pod := range ci.release() {
		if !ci.consumed(pod) && r.p.heldPod(ci, pod) != nil {
			return false
		}
	}
	if r.a.cfg.replaceLost {
		for _, pi := range r.p.held(ci) {
			if _, lost := r.p.lost[pi]; lost {
				return false
			}
		}
	}
	return true
}

func validatePool(pool types.NamespacedName) error {
	if pool.Name == "" || pool.Namespace == "" {
		return fmt.Errorf("%w: pool %q: empty namespace or name", ErrInvalidInput, pool)
	}
	return nil
}

func checkPod(pool types.NamespacedName, i int, pod *corev1.Pod) error {
	if pod.Name == "" {
		return fmt.Errorf("%w: pool %s: pod %d has no name", ErrInvalidInput, pool, i)
	}
	if pod.Namespace != pool.Namespace {
		return fmt.Errorf("%w: pool %s: pod %s/%s is in another namespace", ErrInvalidInput, pool, pod.Namespace, pod.Name)
	}
	if len(pod.Name) > maxPodName {
		return fmt.Errorf("%w: pool %s: pod %d has a name of %d characters, more than a pod name may have (%d)", ErrInvalidInput, pool, i, len(pod.Name), maxPodName)
	}
	return nil
}

// maxPodName is the longest pod name the API server accepts (a DNS
// subdomain).
const maxPodName = 253

func errPodTwice(pool types.NamespacedName, name string) error {
	return fmt.Errorf("%w: pool %s: pod %s listed twice", ErrInvalidInput, pool, name)
}

func checkClaim(pool types.NamespacedName, i int, c Claim) error {
	if c.Object == nil {
		return fmt.Errorf("%w: pool %s: claim %d has a nil object", ErrInvalidInput, pool, i)
	}
	if ns := c.Object.GetNamespace(); ns != pool.Namespace {
		return fmt.Errorf("%w: pool %s: claim %s is in another namespace", ErrInvalidInput, pool, client.ObjectKeyFromObject(c.Object))
	}
	switch {
	case c.Object.GetUID() == "":
		return fmt.Errorf("%w: pool %s: claim %s has no UID (was it read from the API server?)", ErrInvalidInput, pool, client.ObjectKeyFromObject(c.Object))
	case c.Want < 0 || c.Want > math.MaxInt32:
		return fmt.Errorf("%w: pool %s: claim %s wants %d pods", ErrInvalidInput, pool, client.ObjectKeyFromObject(c.Object), c.Want)
	}
	if err := c.Placement.Topology.Validate(); err != nil {
		return fmt.Errorf("%w: pool %s: claim %s: %w", ErrInvalidInput, pool, client.ObjectKeyFromObject(c.Object), err)
	}
	return nil
}

func errClaimTwice(pool types.NamespacedName, o client.Object) error {
	return fmt.Errorf("%w: pool %s: claim %s (uid %s) listed twice", ErrInvalidInput, pool, client.ObjectKeyFromObject(o), o.GetUID())
}

// unchanged reports whether a listed version of pi with resourceVersion rv
// has nothing new: the version taken in, or one older than a write of
// ours.
func (pi *podInfo) unchanged(rv string) bool {
	return pi.present && rv != "" && (pi.rv == rv || slices.Contains(pi.oldRVs(), rv))
}

// setProto makes the first claim of the input the pool's prototype if it
// has none (see pool.proto).
func (r *round) setProto(claims []Claim) {
	if r.p.proto == nil && len(claims) > 0 {
		r.p.proto = claims[0].Object
		r.a.setProto(claims[0].Object)
	}
}

// observePod records a pod of the listing. A pod whose resourceVersion did
// not change costs a map lookup.
func (r *round) observePod(pod *corev1.Pod) {
	p := r.p
	pi := p.pods.Get(pod.Name)
	if pi == nil {
		if t, ok := p.tombs[pod.Name]; ok {
			if t.uid == pod.UID && rvNum(pod.ResourceVersion) < t.rv {
				// A lagging listing shows an older version of a pod that
				// has left the pool. (The same version may be the pod
				// itself: its absence may have come from a lagging
				// listing.)
				return
			}
			delete(p.tombs, pod.Name)
		}
		pi = newPodInfo(pod.Name, pod.UID)
		p.pods.Set(pi)
		p.addPod(pi)
	} else if pi.uid() != pod.UID && pod.UID != "" {
		if next := pi.nextPod(); (next == nil || next.uid() != pod.UID) && olderPod(pod, pi) {
			// A pod that had the name before the one known: every
			// version of it is older than the pod created after it was
			// deleted. A lagging listing shows it; what is known stays.
			return
		}
		pi = r.newIncarnation(pi, pod.UID)
	}
	p.seePod(pi)
	if pi.unchanged(pod.ResourceVersion) {
		return
	}
	if n := rvNum(pod.ResourceVersion); n != 0 && n < rvNum(pi.rv) {
		// Older than what is known (a lagging listing after a live read
		// or a write of ours). A pod a lagging listing lacked stays
		// missing until a listing shows it at least as new as known.
		return
	}
	back := !pi.present
	pi.present = true
	pi.rv = pod.ResourceVersion
	if key := r.a.cfg.markKey; key != "" {
		if mark := pod.Annotations[key]; mark != pi.mark || back && mark != "" {
			// A changed mark, or a marked pod listed again after a
			// listing lacked it (what it means may have changed
			// meanwhile: its claim may have gone), is looked at once
			// the claims are in.
			if mark != pi.mark {
				pi.mark, pi.markOwn, pi.markRV = r.p.markString(mark), false, 0
			} else {
				pi.markOwn = false
			}
			if mark != "" {
				pi.markRV = rvNum(pod.ResourceVersion)
			}
			r.check = append(r.check, pi)
		} else if mark != "" {
			// The same mark at a newer pod version may have been removed
			// and written again since (the same claim got the pod back):
			// it is taken to be as new as the pod, so that no record older
			// than that justifies removing it.
			pi.markOwn, pi.markRV = false, rvNum(pod.ResourceVersion)
		}
	}
	// A pod being deleted is never handed out, whatever the readiness
	// rule says (OpenSandbox's, for one, looks only at phase and the
	// Ready condition, which a terminating pod keeps for a while).
	pi.ready = pod.DeletionTimestamp == nil && r.a.cfg.ready(pod)
	pi.wasReady = pi.wasReady || pi.ready
	pi.ending = pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	if !pi.samePlace(pod.Spec.NodeName, pod.Labels) {
		if pi.place != nil && pi.present {
			r.relabelled(pi)
		}
		pi.place = p.placeOf(pod.Spec.NodeName, pod.Labels, r.a.cfg.nodeLabels)
	}
	p.refresh(pi)
	if pi.recycling() || pi.settling() != nil {
		r.noteListed(pi, pod)
	}
}

// relabelled marks dirty the claim holding pi, whose node or labels
// changed: the pod may no longer match the claim's selector (plan gives it
// back), or the claim's layout changed.
func (r *round) relabelled(pi *podInfo) {
	if ci := r.p.holderOf(pi); ci != nil && ci != unknownHolder {
		r.p.dirty[ci] = struct{}{}
	}
}

// findListed finds in the round's input the objects of the jobs' pods that
// started recycling in this round (scan and observePod noted the others):
// one pass over the input, and only in a round that has such a pod.
func (r *round) findListed(jobs []recycleJob) {
	var want map[string]*podInfo
	for _, j := range jobs {
		if r.listed[j.pi] == nil {
			if want == nil {
				want = make(map[string]*podInfo)
			}
			want[j.pi.name()] = j.pi
		}
	}
	for i := 0; i < len(r.input) && len(want) > 0; i++ {
		if pi := want[r.input[i].Name]; pi != nil {
			r.noteListed(pi, &r.input[i])
			delete(want, pi.name())
		}
	}
}

// noteListed keeps pod, this round's input for pi, for its recycler.
func (r *round) noteListed(pi *podInfo, pod *corev1.Pod) {
	if r.listed == nil {
		r.listed = make(map[*podInfo]*corev1.Pod)
	}
	r.listed[pi] = pod
}

// olderPod reports whether pod, listed under pi's name with another UID,
// is a pod that had the name before pi: resourceVersions order every
// write, so all versions of a pod deleted before pi was created are older
// than any version of pi.
func olderPod(pod *corev1.Pod, pi *podInfo) bool {
	n := rvNum(pod.ResourceVersion)
	return n != 0 && n < rvNum(pi.rv)
}

// newIncarnation handles a pod listed under a known name with another UID:
// a new pod (docs/design.md I12). The old one is gone. If nothing refers to the old
// one any more the new one takes its entry; otherwise it waits in next
// until the old one is released.
func (r *round) newIncarnation(old *podInfo, uid types.UID) *podInfo {
	p := r.p
	if old.present {
		old.present, old.ready = false, false
		p.refresh(old)
	}
	p.seePod(old)
	if p.holderOf(old) == nil && old.reservedBy() == nil && old.settling() == nil {
		pi := newPodInfo(old.name(), uid)
		pi.strays = old.strays
		if old.freeIdx >= 0 {
			p.refresh(old)
		}
		p.pods.Set(pi)
		p.addPod(pi)
		p.removePod(old)
		if next := old.nextPod(); next != nil {
			p.removePod(next)
		}
		return pi
	}
	if next := old.nextPod(); next == nil || next.uid() != uid {
		if next != nil {
			p.removePod(next)
		}
		next := newPodInfo(old.name(), uid)
		next.waiting = true
		old.setNextPod(next)
		p.addPod(old.nextPod())
		r.incarnations = append(r.incarnations, old)
	}
	return old.nextPod()
}

// podGone records that a pod left the pool.
func (r *round) podGone(name string, pi *podInfo) {
	p := r.p
	if next := pi.nextPod(); next != nil && !p.podSeenNow(next) {
		p.removePod(next)
		pi.setNextPod(nil)
	}
	if pi.present {
		// pi.rv stays: a lagging listing showing an older version of the
		// pod must not undo what is known of it.
		pi.present, pi.ready = false, false
		p.refresh(pi)
	}
	r.maybeForget(pi)
}

// blocked returns the error that makes the pool fail closed because of
// claim c.
func (r *round) blocked(uid types.UID, name types.NamespacedName, err error) error {
	return &ClaimError{Pool: r.p.name, Claim: name, UID: uid, Err: fmt.Errorf("%w: %w", ErrPoolBlocked, err)}
}

// podOrNew returns the pod's entry, creating an absent one for a pod named
// by a record but missing from the listing.
func (p *pool) podOrNew(name string) *podInfo {
	pi := p.pods.Get(name)
	if pi == nil {
		pi = newPodInfo(name, "")
		p.pods.Set(pi)
		p.addPod(pi)
	}
	return pi
}

// hold brings the pool in line with the store, which now says that ci
// holds pod: the pod has an entry, out of the free list.
func (r *round) hold(ci *claimInfo, pod string) {
	r.p.nHeldPods++
	r.p.refresh(r.p.podOrNew(pod))
}

// heldPod returns the pod ci holds under name, nil if it holds none. The
// pods a claim holds are the entries of pods whose holder it is.
func (p *pool) heldPod(ci *claimInfo, name string) *podInfo {
	if pi := p.pods.Get(name); pi != nil && p.holderOf(pi) == ci {
		return pi
	}
	return nil
}

// unhold brings the pool in line with the store, which no longer says that
// ci holds pi (the pool's entry of a pod ci held). With pod marks, a fence
// other than 0 queues the removal of the pod's mark (see unmarkEntry).
func (r *round) unhold(ci *claimInfo, pi *podInfo, fence uint64) {
	r.p.nHeldPods--
	if pi == nil {
		return
	}
	if fence != 0 {
		r.queueUnmark(pi, ci.uid(), fence)
	}
	pi.handed = false
	if pi.state == stateRecycling {
		pi.recycled = false
		r.p.endActive(pi)
	}
	if r.marks() && pi.present && pi.mark != "" && pi.markUID(r.p.name) != ci.uid() {
		// Marked for another claim, whose record may list it: that
		// claim may take it now.
		r.resolveMark(pi)
	}
	r.maybeForget(pi)
}

// observeClaim records a claim of the listing. Only a claim whose
// resourceVersion is new to the allocator is decoded: an older version than
// one the allocator wrote carries a resourceVersion it already saw. Want and
// Priority are taken from every Claim at the version known or newer (scan
// passes on a claim whose Want or Priority changed as changed).
func (r *round) observeClaim(c Claim) error {
	p := r.p
	o := c.Object
	uid, rv := o.GetUID(), o.GetResourceVersion()
	ci := p.claims.Get(string(uid))
	switch {
	case ci == nil && rvNum(rv) < p.forgotten[uid]:
		// A stale copy of a claim that left the pool: nothing to learn.
		return nil
	case ci == nil:
		ci = r.newClaimInfo(c)
		rec, err := r.readRecord(ci, o)
		if err != nil {
			return err
		}
		ci.setRelease(rec.Release)
		ci.setReleased(rec.Released)
		p.claims.Set(ci)
		p.addClaim(ci)
		p.dirty[ci] = struct{}{}
		ci.listed = true
		if r.marks() {
			r.takeIn(ci, rec, rvNum(rv))
		} else {
			r.checkRecord(ci, rec)
		}
	case rv == "" || !ci.sawRV(rv) || !ci.known():
		rec, err := r.readRecord(ci, o)
		if err != nil {
			return err
		}
		p.setObj(ci, o, r.a.cfg)
		ci.addRV(rv)
		ci.setRelease(rec.Release)
		ci.want, ci.priority = int32(c.Want), c.Priority
		ci.setPlacement(c.Placement)
		ci.created = unixNanos(o.GetCreationTimestamp().Time)
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
	if rv == ci.rv {
		// Want, Priority and Placement are the caller's, inputs of every
		// round: they may come from anywhere, not only from the object,
		// so they are taken also from an object whose record is not
		// decoded again. Not from an object older than the version known,
		// though (a lagging listing, docs/design.md I7): what the caller
		// made of it is older too, and would hand out or take back pods on
		// a stale word.
		changed := ci.setPlacement(c.Placement)
		if changed || int64(c.Want) != int64(ci.want) || c.Priority != ci.priority {
			ci.want, ci.priority = int32(c.Want), c.Priority
			p.dirty[ci] = struct{}{}
		}
	}
	p.seeClaim(ci)
	ci.listed = true
	ci.setSince(time.Time{})
	return nil
}

// claimGone records that a claim left the pool's listing: deleted,
// force-deleted or moved. Its pods are given back.
func (r *round) claimGone(ci *claimInfo) {
	if ci.listed && ci.since().IsZero() {
		// It may be gone, moved, or missing from a lagging listing: its
		// pods are given back once it is found deleted, or once it has
		// been missing for a quarantine (see queueOrphans).
		ci.setSince(r.now)
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
		if r.p.heldPod(ci, pod) != nil {
			inRecord++
			continue
		}
		if pi := r.p.pods.Get(pod); pi != nil && pi.reservedBy() == ci {
			continue // settled by settleReservations
		}
		if other, ok := r.a.heldElsewhere(ci.uid(), r.p.name); ok {
			if h, held, err := r.a.cfg.store.HolderOf(other, pod); err == nil && held && h.UID == ci.uid() {
				continue
			}
		}
		extra = append(extra, pod)
	}
	missing := r.p.nHeld(ci) - inRecord
	if len(extra) == 0 && missing == 0 {
		ci.setUntrusted(nil)
		return
	}
	ci.rewrite = true
	untrusted := &ClaimError{Pool: r.p.name, Claim: ci.name(), UID: ci.uid(),
		Err: fmt.Errorf("%w: lists %v it does not hold, misses %d it holds", ErrUntrustedRecord, extra, missing)}
	ci.setUntrusted(untrusted)
	r.warn(untrusted)
}

// reservationsByClaim groups the reserved pods by the claim they are
// reserved for.
func (r *round) reservationsByClaim() map[*claimInfo][]*podInfo {
	out := make(map[*claimInfo][]*podInfo)
	for pi := range r.p.reserved {
		out[pi.reservedBy()] = append(out[pi.reservedBy()], pi)
	}
	return out
}

// reservedFor counts the pods reserved for ci, and of those the ones that
// will never serve (terminating, finished or missing).
func (r *round) reservedFor(ci *claimInfo) (n, ending int) {
	for pi := range r.p.reserved {
		if pi.reservedBy() == ci {
			n++
			if pi.ending || !pi.present {
				ending++
			}
		}
	}
	return n, ending
}

// pendingStrays counts the entries of ci's record that it does not hold
// yet but whose pod is marked for it: a pod waiting under its name for an
// older pod to be settled, say. Like reserved pods they may become ci's,
// so they count against what it wants beyond what it holds. ending counts
// those terminating or finished.
func (r *round) pendingStrays(ci *claimInfo) (n, ending int) {
	if !r.marks() {
		return 0, 0
	}
	for _, name := range ci.strays() {
		pi := r.p.pods.Get(name)
		if pi != nil && !pi.present {
			pi = pi.nextPod()
		}
		if pi != nil && pi.present && pi.reservedBy() != ci && pi.markUID(r.p.name) == ci.uid() && r.p.holderOf(pi) != ci {
			n++
			if pi.ending {
				ending++
			}
		}
	}
	return n, ending
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
	// Decide what is settled on what is known; read the claims whose
	// reservations are due, all at once; then decide on what was read.
	type settle struct {
		ci          *claimInfo
		landed, due []*podInfo
	}
	var all []*settle
	var read []*claimInfo
	for ci, pods := range r.reservationsByClaim() {
		s := &settle{ci: ci}
		var held []string
		if o := ci.object(); o != nil {
			if rec, err := r.a.cfg.syncer.Read(o); err == nil {
				held = rec.Held()
			}
		}
		for _, pi := range pods {
			switch {
			case slices.Contains(held, pi.name()) && (!r.marks() || pi.markUID(r.p.name) == ci.uid()):
				s.landed = append(s.landed, pi)
			case !r.now.Before(pi.reservedUntil()):
				s.due = append(s.due, pi)
			}
		}
		all = append(all, s)
		if len(s.due) > 0 {
			read = append(read, ci)
		}
	}
	slices.SortFunc(all, func(x, y *settle) int { return compareNames(x.ci, y.ci) })
	lives := r.readClaims(read)
	for _, s := range all {
		ci, landed := s.ci, s.landed
		var failed []*podInfo
		if len(s.due) > 0 {
			switch lc := lives[ci]; {
			case apierrors.IsNotFound(lc.err):
				// The claim is gone; if a write landed its owner may have
				// used the pods, so they are recycled, not freed.
				ci.setGone()
				landed = append(landed, s.due...)
			case lc.err != nil:
				r.errs = append(r.errs, r.claimErr(ci, fmt.Errorf("%w: settle unknown write: %w", ErrWrite, lc.err)))
			default:
				rec, err := r.a.cfg.syncer.Read(lc.obj)
				for _, pi := range s.due {
					if err == nil && slices.Contains(rec.Held(), pi.name()) {
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

// liveClaim is a live read of one claim.
type liveClaim struct {
	obj client.Object
	err error
}

// readClaims reads the claims live, concurrently: the reads a decision
// rests on, made at once before it is taken. A claim known only from pod
// marks in a pool that listed none cannot be read (errNoProto).
func (r *round) readClaims(cis []*claimInfo) map[*claimInfo]liveClaim {
	if len(cis) == 0 {
		return nil
	}
	var e effects
	e.claimReads = make([]*claimGet, len(cis))
	for i, ci := range cis {
		e.claimReads[i] = r.claimGet(ci, ci.object())
	}
	r.exec(&e)
	m := make(map[*claimInfo]liveClaim, len(cis))
	for i, ci := range cis {
		m[ci] = liveClaim{e.claimReads[i].obj, e.claimReads[i].err}
	}
	return m
}

// claimGet is a live read of ci from base, its version known, or from an
// empty object of the pool's claim type if base is nil.
func (r *round) claimGet(ci *claimInfo, base client.Object) *claimGet {
	if base == nil {
		base = r.p.protoFor(ci)
	}
	return &claimGet{uid: ci.uid(), base: base}
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
		names[i] = pi.name()
		r.p.endActive(pi)
	}
	r.p.dirty[ci] = struct{}{}
	if landed {
		if err := r.a.cfg.store.Allocate(r.p.name, ci.holder(), names); err != nil {
			r.storeFail(ci, err)
			for _, pi := range pods {
				r.p.refresh(pi)
			}
			return
		}
		for _, n := range names {
			r.hold(ci, n)
		}
		r.a.setHolds(ci, true)
		return
	}
	for _, pi := range pods {
		if r.marks() && pi.mark != "" && pi.markUID(r.p.name) == ci.uid() {
			r.startSettle(ci, pi)
			continue
		}
		r.maybeForget(pi)
	}
}

// setRelease records the owner's release list; consumed entries the owner
// dropped are forgotten, so listing the pod again is a new request.
func (c *claimInfo) setRelease(release []string) {
	if c.more == nil && len(release) == 0 {
		return
	}
	m := c.edit()
	m.release = release
	for pod := range m.consumed {
		if !slices.Contains(release, pod) {
			delete(m.consumed, pod)
		}
	}
	c.tidy()
}

// storeFail records that the store refused a write about claim ci: the
// pool's state no longer matches the records, so the round makes no more
// writes and the pool fails closed (finish), to be rebuilt from the
// records and marks by the next Round.
func (r *round) storeFail(ci *claimInfo, err error) {
	r.failed = true
	r.errs = append(r.errs, r.claimErr(ci, storeErr(err)))
}

func (r *round) claimErr(ci *claimInfo, err error) error {
	return &ClaimError{Pool: r.p.name, Claim: ci.name(), UID: ci.uid(), Err: err}
}

// warn reports what the round found wrong and dealt with itself
// (Result.Warnings).
func (r *round) warn(err error) { r.res.Warnings = append(r.res.Warnings, err) }

// wantNow is how many pods ci wants, keep of them held and not being
// recycled: its Want, bounded over its lifetime with WithOpenSandbox, none
// once it is being deleted.
func (r *round) wantNow(ci *claimInfo, keep int) int {
	switch {
	case ci.terminating:
		return 0
	case r.a.cfg.openSandbox:
		return r.lifetimeWant(ci, keep)
	}
	return int(ci.want)
}

// noteWaiting keeps, with WithMetrics, when ci began to want more than the
// keep pods it holds (the round's time when its want rose).
func (r *round) noteWaiting(ci *claimInfo, keep, want int) {
	switch {
	case r.a.cfg.metrics == nil:
	case keep >= want:
		ci.setWaitSince(time.Time{})
	case ci.waitSince().IsZero():
		ci.setWaitSince(r.now)
	}
}

// noteServed records, with WithMetrics, how long ci waited once a hand-out
// made it hold all it wants.
func (r *round) noteServed(ci *claimInfo) {
	m := r.a.cfg.metrics
	if m == nil || ci.waitSince().IsZero() {
		return
	}
	keep := r.p.nHeld(ci) - int(ci.recycling())
	if keep >= r.wantNow(ci, keep) {
		m.served(r.p.name, r.a.cfg.clock.Since(ci.waitSince()))
		ci.setWaitSince(time.Time{})
	}
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
		n := p.nHeld(ci)
		keep := n - int(ci.recycling())
		want := r.wantNow(ci, keep)
		r.noteWaiting(ci, keep, want)
		// Pods reserved for the claim by a write of unknown outcome (or
		// another allocator's hand-out) may be its own: they count against
		// what it wants beyond what it holds, and the next write of its
		// record carries them (see commit). They never make it give up a
		// pod it holds: the hand-out may never land.
		// Nor are they in the shortfall: they exist, and go to the claim
		// or back to the pool; a pod created for them would stay idle
		// (Result.Shortfall is what the pool must create). Except those
		// terminating, finished or missing: they never serve, wherever
		// they go, so a pod must be created for them either way (found by
		// the machine: a terminating pod whose mark a newer pod version
		// re-dated, reserved for the claim whose landed record released
		// it, hid one pod of the claim's demand from the shortfall).
		nr, er := r.reservedFor(ci)
		ns, es := r.pendingStrays(ci)
		pending, ending := nr+ns, er+es
		reserved := min(max(0, want-keep), pending)
		want -= reserved
		pl := r.placementOf(ci)
		// A gang is handed all it lacks at once: not while pods may be on
		// their way to it (reserved, or marked for it), which would leave
		// it with part of what it wants if they never land. It waits for
		// them to settle.
		gangWait := pl.Gang && pending > 0
		if gangWait && want > keep {
			r.addShortfall(ci, want-keep)
			want = keep
		}
		var held []*podInfo // fetched from the store when needed
		if n > 0 && (replace || keep > want || pl.Selector != nil) {
			held = p.held(ci)
		}
		if n == 0 {
			if _, moving := r.a.heldElsewhere(ci.uid(), p.name); moving {
				r.addShortfall(ci, want)
				continue
			}
		}
		var lost int
		if replace {
			for _, pi := range held {
				if _, ok := p.lost[pi]; ok && !r.alive[pi] {
					lost++
				}
			}
		}
		var release []string
		for _, pod := range ci.release() {
			if ci.consumed(pod) {
				continue
			}
			if pi := p.heldPod(ci, pod); pi != nil && !pi.recycling() && !slices.Contains(release, pod) {
				release = append(release, pod)
			}
		}
		// A claim holding more than it wants gives back first the pods
		// that are gone: a strategy choosing among all of them could take
		// a pod in use instead.
		for _, pi := range held {
			if keep-want-len(release) <= 0 {
				break
			}
			if !replace && !pi.present && !pi.recycling() && !slices.Contains(release, pi.name()) {
				release = append(release, pi.name())
			}
		}
		// A pod its selector does not match (the selector or the pod's
		// labels changed, or a record lists it) is given back like one
		// its owner released: the claim never keeps one.
		for _, pi := range held {
			if pl.Selector != nil && !pi.recycling() && !(replace && r.gone(pi)) && !slices.Contains(release, pi.name()) && !pl.Selector.Matches(pi.labels()) {
				release = append(release, pi.name())
			}
		}
		if r.a.cfg.openSandbox {
			// Pods given back count against the lifetime bound too.
			want = max(0, want-len(release))
		}
		if gangWait && want > 0 {
			// Nor are the pods it gives back replaced meanwhile.
			back := min(want, len(release))
			r.addShortfall(ci, back)
			want -= back
		}
		extra := min(pending-reserved, max(0, want-(keep-len(release))))
		if extra > 0 {
			// The pods it gives back are replaced too: pods on their way
			// to it count against those replacements as well, or the
			// claim would end up with both (found by the machine: a
			// reserved pod adopted by the write that also handed out a
			// replacement for a released one). They are not in the
			// shortfall either.
			want -= extra
		}
		// The pods on their way counted against its demand that will
		// never serve are in the shortfall: those beyond the ones that
		// may.
		if dead := reserved + extra - (pending - ending); dead > 0 {
			r.addShortfall(ci, dead)
		}
		if keep == want && len(release) == 0 && lost == 0 {
			continue
		}
		if held == nil && n > 0 {
			held = p.held(ci)
		}
		req := algorithm.Request{UID: ci.uid(), Claim: ci.name(), Want: want, Priority: ci.priority, Created: ci.createdAt(), Arrival: uint64(ci.arrival), Placement: pl}
		for _, pi := range held {
			name := pi.name()
			if pi.recycling() {
				continue
			}
			if replace && r.gone(pi) {
				continue // dropped from the record by commit
			}
			req.Held = append(req.Held, name)
			if replace && !pi.ready && !slices.Contains(release, name) {
				release = append(release, name)
			}
		}
		slices.Sort(req.Held)
		if m := pl.Topology.Mode; m == algorithm.TopologySpread || m == algorithm.TopologyPack {
			req.HeldPods = make([]algorithm.Candidate, len(req.Held))
			for i, name := range req.Held {
				req.HeldPods[i] = p.heldPod(ci, name).candidateOf()
			}
		}
		req.Release = release
		req.Avoid = slices.Clone(ci.released())
		reqs = append(reqs, req)
	}
	slices.SortFunc(reqs, func(x, y algorithm.Request) int { return cmp.Compare(x.UID, y.UID) })
	requested := make(map[types.UID]*claimInfo, len(reqs))
	byUID := make(map[types.UID]*algorithm.Request, len(reqs))
	for i := range reqs {
		requested[reqs[i].UID] = p.claims.Get(string(reqs[i].UID))
		byUID[reqs[i].UID] = &reqs[i]
	}
	// The algorithm gets a copy of the free list: a strategy that sorts or
	// edits its input in place must not reorder the pool's own list, and
	// its action is checked against the pool's state, not against positions
	// in that list.
	if cap(p.offer) > 64 && len(p.free) < cap(p.offer)/4 {
		p.offer = nil // let the memory of a larger pool go
	}
	p.offer = slices.Grow(p.offer[:0], len(p.free))
	for _, f := range p.free {
		p.offer = append(p.offer, f.candidate())
	}
	act, err := safePlan(r.a.cfg.algorithm, algorithm.Input{Candidates: p.offer, Requests: reqs})
	if err != nil {
		return act, fmt.Errorf("pool %s: %w: %w", p.name, ErrPlan, err)
	}
	if r.a.cfg.openSandbox {
		act.Allocate = keepHistoryOut(reqs, requested, act)
	}
	if err := r.checkAction(requested, byUID, act); err != nil {
		if serr := p.takeStoreErr(); serr != nil {
			// Not the strategy's fault: the store could not say.
			return algorithm.Action{}, serr
		}
		return algorithm.Action{}, fmt.Errorf("pool %s: %w: %w", p.name, ErrPlan, err)
	}
	// The demand left unmet, by class, from the requests and the grants:
	// a strategy of the caller's may not fill ShortfallByClass.
	granted := make(map[types.UID]int, len(act.Allocate))
	for _, g := range act.Allocate {
		granted[g.UID] = len(g.Pods)
	}
	for i := range reqs {
		req := &reqs[i]
		if left := max(0, req.Want-(len(req.Held)-len(req.Release))) - granted[req.UID]; left > 0 {
			r.byClassOnly(requested[req.UID], left)
		}
	}
	return act, nil
}

// placementOf returns ci's placement, the pool's topology where ci leaves
// it to the pool.
func (r *round) placementOf(ci *claimInfo) algorithm.Placement {
	pl := ci.placement()
	if pl.Topology.Mode == algorithm.TopologyDefault {
		pl.Topology = r.a.cfg.topology
	}
	return pl
}

// addShortfall adds n pods to the demand ci leaves unmet that the
// algorithm does not see (r.shortfall), under ci's class too.
func (r *round) addShortfall(ci *claimInfo, n int) {
	r.shortfall += n
	r.byClassOnly(ci, n)
}

// byClassOnly adds n pods to ci's class in Result.ShortfallByClass (the
// algorithm's unmet demand is in act.Shortfall already).
func (r *round) byClassOnly(ci *claimInfo, n int) {
	if n == 0 {
		return
	}
	if r.byClass == nil {
		r.byClass = make(map[string]int)
	}
	class := ci.placement().Class
	if r.byClass[class] += n; r.byClass[class] <= 0 {
		delete(r.byClass, class)
	}
}

// safePlan runs the strategy, which is a plugin: a panic in it is an error
// of the plan, not of the process.
func safePlan(alg algorithm.Algorithm, in algorithm.Input) (act algorithm.Action, err error) {
	defer func() {
		if v := recover(); v != nil {
			act, err = algorithm.Action{}, fmt.Errorf("the strategy panicked: %v", v)
		}
	}()
	return alg.Plan(in)
}

// safeRecycle runs the recycler, which is a plugin: a panic in it is an
// error of that pod's recycling.
func safeRecycle(ctx context.Context, recycle Recycler, req RecycleRequest) (done bool, err error) {
	defer func() {
		if v := recover(); v != nil {
			done, err = false, fmt.Errorf("the recycler panicked: %v", v)
		}
	}()
	return recycle(ctx, req)
}

// lifetimeWant is what a claim wants under WithOpenSandbox, where its Want
// bounds the pods its record lists over its lifetime, released ones
// included: the keep pods it holds and is not recycling, and as many more
// as Want leaves once the recycling and released ones are counted. It is
// never below keep: a lower Want gives nothing back (plan then takes off
// the pods the owner gives back in this round).
func (r *round) lifetimeWant(ci *claimInfo, keep int) int {
	used := keep + int(ci.recycling())
	seen := make(map[string]struct{}, len(ci.released()))
	for _, pod := range ci.released() {
		if _, dup := seen[pod]; dup || r.p.heldPod(ci, pod) != nil {
			continue
		}
		seen[pod] = struct{}{}
		used++
	}
	return keep + max(0, int(ci.want)-used)
}

// keepHistoryOut takes out of act's grants, under WithOpenSandbox, the
// pods the claim's record lists already as released: OpenSandbox's format
// cannot say that such a pod is held again. Strategies are asked to avoid
// these pods (Request.Avoid) and may still pick one when no other is left.
// Each pod taken out goes to the first request, in algorithm.Less order,
// that still wants a pod and may take it, so that it does not stay idle
// while a claim that could use it waits.
func keepHistoryOut(reqs []algorithm.Request, requested map[types.UID]*claimInfo, act algorithm.Action) []algorithm.Grant {
	var dropped []string
	got := make(map[types.UID]int)
	out := make([]algorithm.Grant, 0, len(act.Allocate))
	for _, g := range act.Allocate {
		if ci := requested[g.UID]; ci != nil && len(ci.released()) > 0 {
			g.Pods = slices.DeleteFunc(slices.Clone(g.Pods), func(pod string) bool {
				if slices.Contains(ci.released(), pod) {
					dropped = append(dropped, pod)
					return true
				}
				return false
			})
		}
		got[g.UID] += len(g.Pods)
		if len(g.Pods) > 0 {
			out = append(out, g)
		}
	}
	if len(dropped) == 0 {
		return out
	}
	for _, g := range act.Release {
		got[g.UID] -= len(g.Pods)
	}
	order := make([]*algorithm.Request, len(reqs))
	for i := range reqs {
		order[i] = &reqs[i]
	}
	slices.SortFunc(order, func(a, b *algorithm.Request) int {
		if algorithm.Less(a, b) {
			return -1
		}
		return 1
	})
	for _, pod := range dropped {
		for _, req := range order {
			ci := requested[req.UID]
			if ci == nil || req.Want-len(req.Held)-got[req.UID] <= 0 || slices.Contains(ci.released(), pod) {
				continue
			}
			got[req.UID]++
			if k := slices.IndexFunc(out, func(g algorithm.Grant) bool { return g.UID == req.UID }); k >= 0 {
				out[k].Pods = append(out[k].Pods, pod)
			} else {
				out = append(out, algorithm.Grant{UID: req.UID, Claim: req.Claim, Pods: []string{pod}})
			}
			break
		}
	}
	return out
}

// checkLost reads live the held pods the listing lacks (WithReplaceLost),
// before they are replaced and dropped from their claims' records: a
// lagging listing may lack a pod that is still there, and dropping it
// would take from its claim a pod it uses. Only a pod found gone (or
// replaced by a new pod under its name) is dropped; one that cannot be
// read is kept.
func (r *round) checkLost() {
	if !r.a.cfg.replaceLost || len(r.p.lost) == 0 || r.a.cfg.podReader == nil {
		return
	}
	var absent []*podInfo
	for pi := range r.p.lost {
		if !pi.present {
			absent = append(absent, pi)
		}
	}
	if len(absent) == 0 {
		return
	}
	slices.SortFunc(absent, func(x, y *podInfo) int { return strings.Compare(x.name(), y.name()) })
	names := make([]string, len(absent))
	for i, pi := range absent {
		names[i] = pi.name()
	}
	for i, rd := range r.readPods(names) {
		pi := absent[i]
		switch {
		case apierrors.IsNotFound(rd.err), rd.err == nil && pi.uid() != "" && rd.pod.UID != pi.uid():
			// Gone: replaced, and dropped from the record.
		case rd.err != nil:
			r.errs = append(r.errs, fmt.Errorf("pool %s: pod %s: %w: %w", r.p.name, pi.name(), ErrRead, rd.err))
			fallthrough
		default:
			if r.alive == nil {
				r.alive = make(map[*podInfo]bool)
			}
			r.alive[pi] = true
		}
	}
}

// gone reports whether a held pod counts as gone for WithReplaceLost: the
// listing lacks it and no live read of this round found it.
func (r *round) gone(pi *podInfo) bool { return !pi.present && !r.alive[pi] }

// checkAction refuses an action that breaks the Algorithm contract, so that
// a faulty strategy can never hand out a pod that is not free or release a
// pod its claim does not hold. Every pod is checked against the pool's
// state, not against what the strategy was given (which it may have
// modified).
func (r *round) checkAction(requested map[types.UID]*claimInfo, reqs map[types.UID]*algorithm.Request, act algorithm.Action) error {
	taken := make(map[string]struct{})
	for _, g := range act.Allocate {
		if requested[g.UID] == nil {
			return fmt.Errorf("allocation to claim %s (uid %s) that was not requested", g.Claim, g.UID)
		}
		req := reqs[g.UID]
		if need := req.Want - (len(req.Held) - len(req.Release)); req.Placement.Gang && len(g.Pods) != need {
			return fmt.Errorf("claim %s: gang lacking %d pods given %d: all or nothing", g.Claim, need, len(g.Pods))
		}
		for _, pod := range g.Pods {
			pi := r.p.pods.Get(pod)
			if pi == nil || !r.p.candidate(pi) {
				return fmt.Errorf("claim %s: pod %s is not a candidate", g.Claim, pod)
			}
			if sel := req.Placement.Selector; sel != nil && !sel.Matches(pi.labels()) {
				return fmt.Errorf("claim %s: pod %s does not match its selector %s", g.Claim, pod, sel)
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
			if pi := r.p.heldPod(ci, pod); pi == nil || pi.recycling() {
				return fmt.Errorf("claim %s: released pod %s is not held", ci.name(), pod)
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
	if pi.recycling() {
		return
	}
	r.p.setState(pi, stateRecycling, ci, false)
}

func (r *round) queueReleases(grants []algorithm.Grant) {
	for _, g := range grants {
		ci := r.p.claims.Get(string(g.UID))
		for _, pod := range g.Pods {
			r.startRecycling(ci, r.p.heldPod(ci, pod))
		}
	}
}

// queueOrphans gives back every pod held by a claim that is not in the
// listing any more: deleted, force-deleted or moved to another pool. As it
// may just be missing from a lagging listing, its pods are given back once
// a live read finds it deleted, or once it has been missing for a
// Quarantine (then they are recycled and recorded released, as for a
// release the owner asked for).
func (r *round) queueOrphans() {
	var orphans, probe []*claimInfo
	for ci := range r.p.dirty {
		if ci.listed || r.p.nHeld(ci) == 0 {
			continue
		}
		orphans = append(orphans, ci)
		if since := ci.since(); !since.IsZero() && !ci.isGone() && r.now.Before(since.Add(r.a.cfg.quarantine)) {
			probe = append(probe, ci)
		}
	}
	lives := r.readClaims(probe)
	for _, ci := range orphans {
		lc, read := lives[ci]
		if read && !r.left(ci, lc) {
			continue
		}
		for _, pi := range r.p.held(ci) {
			if read && r.outbid(ci, pi, lc) {
				continue
			}
			r.startRecycling(ci, pi)
		}
	}
}

// outbid gives pi, held by ci from its mark alone, to the claim whose
// newer record lists it (newerRecordWins, WithPodMarkMigration) when lc,
// a live read of ci after it left the pool, shows that ci does not hold
// it: ci is deleted, or its record does not list the pod. A claim that
// moved to another pool with the pod in its record keeps it until it is
// recycled, as a claim that left does.
func (r *round) outbid(ci *claimInfo, pi *podInfo, lc liveClaim) bool {
	if ci.recRV != 0 || r.newerRecord(pi) == nil {
		return false
	}
	if !ci.isGone() {
		rec, _, err := readRecord(r.a.cfg.syncer, lc.obj)
		if err != nil || slices.Contains(rec.Held(), pi.name()) {
			return false
		}
	}
	r.drop(ci, pi)
	if r.newerRecordWins(pi) {
		return true
	}
	// (The store refused: ci holds it again, and it is recycled.)
	return !r.allocate(ci, pi.name())
}

// left reports, from a live read of a claim that left the pool's
// listing, whether it left the pool for certain: it no longer exists
// (ci.isGone() is set then), or WithClaimPool says it is in another pool
// (or none). A claim that could not be read has not.
func (r *round) left(ci *claimInfo, lc liveClaim) bool {
	switch {
	case apierrors.IsNotFound(lc.err):
		ci.setGone()
		return true
	case lc.err != nil:
		return false
	}
	poolOf := r.a.cfg.claimPool
	return poolOf != nil && poolOf(lc.obj) != r.p.name
}

// recycleJob is one pod to recycle (or settle) for a claim.
type recycleJob struct {
	ci     *claimInfo
	pi     *podInfo
	settle bool
}

// recycle offers every pod being given back or settled to the recycler,
// concurrently, and returns those done, per claim. A pod that left the
// listing is done. With pod marks, a pod is offered only while its mark
// names the claim it is recycled for.
func (r *round) recycle() (done, settled map[*claimInfo][]string) {
	type job = recycleJob
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
			out[ci] = append(out[ci], pi.name())
		case r.marks() && pi.markUID(r.p.name) != ci.uid():
			// Not marked for ci (yet): not ours to recycle.
		default:
			jobs = append(jobs, job{ci, pi, settle})
		}
	}
	for pi := range r.p.recycling {
		if ci := r.p.holderOf(pi); ci != nil && ci != unknownHolder {
			add(ci, pi, false)
		}
	}
	for pi := range r.p.settling {
		add(pi.settling(), pi, true)
	}
	for _, pods := range done {
		slices.Sort(pods)
	}
	for _, pods := range settled {
		slices.Sort(pods)
	}
	slices.SortFunc(jobs, func(x, y job) int { return strings.Compare(x.pi.name(), y.pi.name()) })
	r.findListed(jobs)
	// Decide every call, make them, then take the outcomes in.
	var e effects
	e.recycles = make([]*recycleCall, len(jobs))
	for i, j := range jobs {
		c := &recycleCall{req: RecycleRequest{Pool: r.p.name, Pod: j.pi.name(), UID: j.pi.uid(), ResourceVersion: j.pi.rv, Claim: j.ci.holder()}}
		if o := r.listed[j.pi]; o != nil && (o.UID == j.pi.uid() || o.UID == "") {
			c.req.Object = o
		}
		if r.marks() && r.a.cfg.fence {
			c.fence = r.fenceRecycle(j.pi)
		}
		e.recycles[i] = c
	}
	r.exec(&e)
	for i, j := range jobs {
		c := e.recycles[i]
		f := c.fence
		if f == nil {
			f = &podPatch{} // no marks, or WithRecycleFence(false): no fence
		}
		switch {
		case f.err == nil:
			if f.newRV != "" && f.newRV != j.pi.rv {
				// The stamp made a new version; the mark is as it was.
				j.pi.stalePodRV(j.pi.rv)
				j.pi.rv, j.pi.markOwn = f.newRV, false
			}
		case apierrors.IsNotFound(f.err):
			// Gone: recycled without a call, as a pod the listing lacks.
			c.done = true
		case apierrors.IsConflict(f.err):
			// The pod changed since the version known: its mark may name
			// another claim now. Not recycled; the next listing shows it.
			r.warn(r.claimErr(j.ci, fmt.Errorf("%w: pod %s changed since resourceVersion %s: recycled once a listing shows it still marked for the claim", ErrWrite, j.pi.name(), j.pi.rv)))
			continue
		default:
			r.errs = append(r.errs, r.claimErr(j.ci, fmt.Errorf("%w: pod %s: prove its mark before recycling: %w", ErrRecycle, j.pi.name(), f.err)))
			continue
		}
		if c.err != nil {
			r.errs = append(r.errs, r.claimErr(j.ci, fmt.Errorf("%w: pod %s: %w", ErrRecycle, j.pi.name(), c.err)))
			continue
		}
		if c.done {
			j.pi.recycled = true
			if j.settle {
				settled[j.ci] = append(settled[j.ci], j.pi.name())
			} else {
				done[j.ci] = append(done[j.ci], j.pi.name())
			}
		}
	}
	return done, settled
}

// fenceRecycle is the patch that proves, just before a recycler is
// called, that pi's mark names the claim it is recycled for at the
// resourceVersion the allocator knows, and stamps the recycle on the pod
// (docs/design.md, "Recycling is fenced"): one patch guarded by that
// version, which writes the mark it knows and the recycling stamp (the
// claim's UID and that version, so that every recycle writes a new
// value). It fails with a conflict if the pod changed since. The stamp
// makes a new version of the pod: a write of the pod that another
// allocator decided on an older view (its own unmark once it recycled the
// pod too, say) fails, and must look at the pod again. While the pod is
// marked for the claim no allocator can hand it out, and its mark goes
// only after its release is recorded, which comes after the recycler. The
// executor calls the recycler only once this patch succeeded, with the
// pod's new resourceVersion.
func (r *round) fenceRecycle(pi *podInfo) *podPatch {
	return &podPatch{name: pi.name(), rv: pi.rv, annotations: map[string]any{
		r.a.cfg.markKey:  pi.mark,
		r.a.cfg.stampKey: string(pi.markUID(r.p.name)) + "@" + pi.rv,
	}}
}

// guard turns a panic in a round on pool p (a plugin's: the syncer, the
// store, the readiness rule; or a bug) into an error: the pool fails
// closed, and the next Round rebuilds it. The caller holds p's lock.
func (a *defaultAllocator) guard(p *pool, err *error) {
	if v := recover(); v != nil {
		p.violate(fmt.Errorf("panic in a round: %v", v))
		*err = fmt.Errorf("pool %s: %w: panic in a round: %v", p.name, ErrInconsistent, v)
	}
}
