package allocator

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/syncer"
)

// write is one claim's record change in a round, and its outcome.
type write struct {
	ci   *claimInfo
	add  []string // pods handed to the claim
	done []string // pods whose recycling finished
	drop []string // held pods that no longer exist (WithReplaceLost)
	// adopt are pods reserved for the claim by an earlier write of unknown
	// outcome. Every write of the claim keeps them in its record: dropping
	// them could take a pod the owner already saw without a release. Once
	// a write succeeds they are held for certain.
	adopt []string
	// marked are the pods of add whose mark was written for this write.
	marked []string
	// settled are pods settled for the claim (pod marks): recycled, to be
	// recorded as released although its record does not list them held.
	settled []string

	// marks are the live marks of pods the base record lists that are
	// known only at a version older than it, or not at all (staleMarks),
	// by name.
	marks map[string]liveMark

	// What readFor and based read and decide made of it, for the write.
	base      client.Object  // the version the write replaces
	reread    bool           // base is the version known, let go and read again
	own       bool           // base is the version known, not a live read
	baseRec   *syncer.Record // base's record, nil if it cannot be read
	releaseOK bool           // base's release list could be read
	want      syncer.Record  // the record to write
	fin       bool           // whether the claim keeps the finalizer
	skip      bool           // set by readFor, based or decide: nothing to write

	// Outcome, set by wrote and read by apply.
	obj     client.Object // the claim as stored after the write
	fresh   client.Object // a newer claim read live along the way
	rec     syncer.Record // what was written
	gone    bool          // the claim no longer exists
	unknown bool          // the write may or may not have landed
	landed  bool          // it landed, as a live read showed; obj is not set
	wrote   bool          // rec is stored: the write succeeded, or landed
	err     error
}

// commit writes every changed claim, concurrently, then applies the
// outcomes to the store and the pool in one place.
func (r *round) commit(allocs []algorithm.Grant, done, settled map[*claimInfo][]string) {
	p := r.p
	byClaim := make(map[*claimInfo]*write)
	get := func(ci *claimInfo) *write {
		w := byClaim[ci]
		if w == nil {
			w = &write{ci: ci}
			byClaim[ci] = w
		}
		return w
	}
	for _, g := range allocs {
		get(p.claims.Get(string(g.UID))).add = g.Pods
	}
	for ci, pods := range done {
		get(ci).done = pods
	}
	for ci, pods := range settled {
		// A pod the known record already lists as released needs no write:
		// its mark may go if that record is newer than the mark.
		var write, freed []string
		for _, name := range pods {
			pi := p.entryIn(name, stateSettling)
			switch {
			case slices.Contains(ci.released(), name) && pi != nil && ci.recRV > pi.markRV && pi.markRV != 0:
				r.endSettle(pi)
				r.queueUnmark(pi, ci.uid(), ci.recRV)
			case ci.isGone():
				r.endSettle(pi)
				r.queueUnmark(pi, ci.uid(), fenceGone)
			default:
				write = append(write, name)
				continue
			}
			freed = append(freed, name)
		}
		if len(freed) > 0 {
			r.res.Released = append(r.res.Released, algorithm.Grant{UID: ci.uid(), Claim: ci.name(), Pods: freed})
		}
		if len(write) > 0 {
			get(ci).settled = write
		}
	}
	for ci := range p.dirty {
		if r.a.cfg.replaceLost && ci.listed {
			for _, pi := range p.held(ci) {
				if r.gone(pi) && !pi.recycling() {
					get(ci).drop = append(get(ci).drop, pi.name())
				}
			}
		}
		if ci.rewrite && ci.listed {
			get(ci) // its record differs from what it holds
		}
		// A terminating claim that holds nothing but still carries the
		// finalizer (a removal that failed, or a restart) gets it removed.
		if ci.listed && ci.terminating && p.nHeld(ci) == 0 && r.hasFinalizer(ci) {
			get(ci)
		}
	}
	// A claim with pods reserved by a write of unknown outcome gets its
	// write issued again, with those pods: once it succeeds they are held
	// for certain, and a write still in flight can no longer land (the
	// resourceVersion moved on).
	// Only when every reserved pod of the claim may still be handed to it
	// (present, ready, within what it wants). Otherwise, without pod marks,
	// the claim is not written at all until its reservations settle, since
	// a write without them (based on a live read) could drop a pod its
	// owner already saw; with marks, a write keeps every pod the version it
	// replaces lists and that is marked for the claim, reserved ones too.
	frozen := make(map[*claimInfo]bool)
	for ci, pods := range r.reservationsByClaim() {
		room := max(0, int(ci.want)-(p.nHeld(ci)-int(ci.recycling())))
		ok := ci.listed && !ci.terminating && len(pods) <= room
		for _, pi := range pods {
			ok = ok && pi.present && pi.ready && !r.unread[pi]
			if r.marks() && ci.known() {
				// A write adds a pod only under a mark newer than the
				// version it replaces: no one can have settled the pod
				// since (that write would be newer).
				ok = ok && pi.markOwn && pi.markUID(p.name) == ci.uid() && rvNum(ci.objRV()) < pi.markRV
			}
		}
		if !ok {
			frozen[ci] = !r.marks()
			continue
		}
		w := get(ci)
		for _, pi := range pods {
			w.adopt = append(w.adopt, pi.name())
		}
	}
	writes := make([]*write, 0, len(byClaim))
	for ci, w := range byClaim {
		if frozen[ci] {
			continue
		}
		if ci.objDeleted() {
			w.add = nil // I8: a terminating claim gets nothing new
		}
		slices.Sort(w.adopt)
		writes = append(writes, w)
	}
	slices.SortFunc(writes, func(x, y *write) int { return compareNames(x.ci, y.ci) })
	// Read, mark, decide, then write (docs/design.md, "Decide, then
	// act"): the reads each write rests on run concurrently; then each
	// write's marks, and, once a write's marks are done (and those of
	// every write before it), its record is decided on what was read and
	// what the pool knows, and written while later marks are still being
	// made.
	var claims, pods effects
	reads := make([]*claimGet, len(writes))
	for i, w := range writes {
		if reads[i] = r.readFor(w); reads[i] != nil {
			claims.claimReads = append(claims.claimReads, reads[i])
		}
	}
	r.exec(&claims)
	stale := make([][]string, len(writes))
	for i, w := range writes {
		stale[i] = r.based(w, reads[i])
		for _, name := range stale[i] {
			pods.podReads = append(pods.podReads, &podGet{name: name})
		}
	}
	r.exec(&pods)
	k := 0
	for i, w := range writes {
		for _, name := range stale[i] {
			r.staleMark(w, name, pods.podReads[k])
			k++
		}
	}
	jobs := make([][]*markJob, len(writes))
	marks := make([]*effects, len(writes))
	for i, w := range writes {
		if !w.skip {
			jobs[i] = r.markJobs(w)
		} else {
			// Not written (gone, or its read failed): nothing is
			// handed to it, so nothing is marked for it.
			w.add = nil
		}
		marks[i] = &effects{patches: r.markPatches(jobs[i])}
	}
	calls := make([]*recordWrite, len(writes))
	r.executor().pipeline(marks, func(i int) *effects {
		w := writes[i]
		r.tookMarks(w, jobs[i], marks[i].patches)
		r.decide(w)
		if calls[i] = r.writeCall(w); calls[i] == nil {
			return nil
		}
		return &effects{writes: []*recordWrite{calls[i]}}
	})
	for i, w := range writes {
		if calls[i] != nil {
			r.wrote(w, calls[i])
		}
	}
	for _, w := range writes {
		if r.failed {
			// The store refused to follow a durable write: the pool fails
			// closed, and the records say what the writes did.
			return
		}
		r.apply(w)
	}
	if !r.failed {
		r.unmarkPods()
	}
}

func compareNames(x, y *claimInfo) int {
	switch {
	case x.name().String() < y.name().String():
		return -1
	case x.name().String() > y.name().String():
		return 1
	case x.uid() < y.uid():
		return -1
	case x.uid() > y.uid():
		return 1
	}
	return 0
}

// desired is the record and finalizer state w asks for, given base, the
// claim version the write is based on (own: the newest version of the
// claim the allocator knows). The pods come from the allocator's own view
// (the store), never from base's record, so a tampered record is
// overwritten rather than trusted; only the owner's release list is read
// from base.
//
// baseRec is base's record as decoded (nil if it cannot be read; a record
// whose release list alone is malformed is read without it), releaseOK
// whether its release list could be read.
func (r *round) desired(w *write, baseRec *syncer.Record, releaseOK, own bool) (syncer.Record, bool) {
	ci := w.ci
	release := ci.release()
	if !own && releaseOK {
		release = baseRec.Release
	}
	gone := make(map[string]struct{}, len(w.done)+len(w.drop))
	for _, p := range slices.Concat(w.done, w.drop) {
		gone[p] = struct{}{}
	}
	allocated := make([]string, 0, r.p.nHeld(ci)+len(w.add))
	if r.marks() {
		// Only pods the version replaced lists, and that are marked for
		// the claim, are kept: nothing is re-added from memory.
		if baseRec != nil {
			for _, name := range baseRec.Held() {
				pi := r.p.recordPod(ci, name)
				if (pi == nil || !pi.present) && !ci.listed {
					// A claim that left this pool (moved) may hold pods of
					// its new pool: not this pool's to judge (one known
					// here only from a live read is not this pool's
					// either).
					if _, ok := gone[name]; !ok {
						allocated = append(allocated, name)
					}
					continue
				}
				mine := pi != nil && pi.markUID(r.p.name) == ci.uid()
				awaiting := pi != nil && (pi.mark == "" || r.p.overruled(pi, ci)) && r.p.holderOf(pi) == ci && r.p.tomark[name] == ci.uid()
				if awaiting {
					// Listed without a mark (a record from before pod
					// marks) and held until it is marked and recycled:
					// dropping it would free a pod of uncertain use.
					mine = true
				}
				if pi != nil && !pi.present && pi.mark == "" && r.p.holderOf(pi) == ci {
					// Held and missing (lost) before its mark could be
					// written: kept until it is released, as a marked pod
					// that goes missing is. Dropped, the store would go on
					// holding a pod no record lists, and keep a new pod
					// under its name out of the pool.
					mine = true
				}
				if live, ok := w.marks[name]; ok {
					h, _ := parseMark(r.p.name, live.mark)
					// Read live as known (the same pod, its mark not
					// written yet), a pod awaiting its mark stays: its
					// mark is tried again next round.
					mine = h.UID == ci.uid() || awaiting && live.is(pi) && r.p.markString(live.mark) == pi.mark
				}
				if _, ok := gone[name]; !ok && mine && (pi == nil || pi.settling() == nil) {
					allocated = append(allocated, name)
				}
			}
		}
	} else {
		for _, pi := range r.p.held(ci) {
			if _, ok := gone[pi.name()]; !ok {
				allocated = append(allocated, pi.name())
			}
		}
	}
	if r.a.cfg.openSandbox {
		return r.desiredOpenSandbox(w, baseRec, allocated, release)
	}
	allocated = append(allocated, w.add...)
	allocated = append(allocated, w.adopt...)
	slices.Sort(allocated)

	// Released keeps the pods the owner still lists in release, so the
	// owner can see they are done; a pod handed out again leaves it.
	var released []string
	for _, p := range ci.released() {
		if slices.Contains(release, p) && !slices.Contains(w.add, p) {
			released = append(released, p)
		}
	}
	for _, p := range slices.Concat(w.done, w.settled) {
		if !slices.Contains(released, p) {
			released = append(released, p)
		}
	}
	// A pod the claim holds is never also written as released, whatever
	// the allocator remembers of the released list.
	released = slices.DeleteFunc(released, func(p string) bool {
		_, found := slices.BinarySearch(allocated, p)
		return found
	})
	slices.Sort(released)
	stillRecycling := int(ci.recycling()) - len(w.done)
	return syncer.Record{Allocated: allocated, Release: release, Released: released},
		len(allocated) > 0 || stillRecycling > 0
}

// desiredOpenSandbox is desired for WithOpenSandbox, given the pods the
// claim keeps holding (held, before w's hand-outs): the record lists the
// pods as OpenSandbox's controller would. The allocated list is base's,
// in its order and with its repeats, less the pods that are neither held
// nor released (a stray entry the allocator does not trust), then the
// held pods base did not list, then w's hand-outs. The released list is
// the one last known, in its order, then the pods w finished recycling;
// a held pod leaves it. Nothing else is removed or sorted. The finalizer
// stays while the claim lives and is listed in this pool.
func (r *round) desiredOpenSandbox(w *write, baseRec *syncer.Record, held, release []string) (syncer.Record, bool) {
	ci := w.ci
	holds := make(map[string]struct{}, len(held)+len(w.add)+len(w.adopt))
	for _, p := range slices.Concat(held, w.add, w.adopt) {
		holds[p] = struct{}{}
	}
	// The released list as known, repeats and all, then what w finished
	// recycling that it does not list yet.
	var released []string
	inReleased := make(map[string]struct{})
	for _, p := range ci.released() {
		if _, h := holds[p]; !h {
			inReleased[p] = struct{}{}
			released = append(released, p)
		}
	}
	for _, p := range slices.Concat(w.done, w.settled) {
		_, h := holds[p]
		if _, dup := inReleased[p]; !h && !dup {
			inReleased[p] = struct{}{}
			released = append(released, p)
		}
	}
	var allocated []string
	listed := make(map[string]struct{})
	if baseRec != nil {
		for _, p := range baseRec.Allocated {
			_, h := holds[p]
			_, rel := inReleased[p]
			if h || rel {
				allocated = append(allocated, p)
				listed[p] = struct{}{}
			}
		}
	}
	var missing []string
	for _, p := range held {
		if _, ok := listed[p]; !ok {
			missing = append(missing, p)
		}
	}
	slices.Sort(missing)
	for _, p := range slices.Concat(missing, w.add, w.adopt) {
		if _, ok := listed[p]; !ok {
			allocated = append(allocated, p)
			listed[p] = struct{}{}
		}
	}
	stillRecycling := int(ci.recycling()) - len(w.done)
	// Kept while the claim lives in this pool; one that left it (moved,
	// or detached as OpenSandbox does on pause, taking the finalizer off
	// itself) does not get it back from the pool it left.
	fin := len(held)+len(w.add)+len(w.adopt) > 0 || stillRecycling > 0 || !ci.terminating && ci.listed
	return syncer.Record{Allocated: allocated, Release: release, Released: released}, fin
}

// A claim's record write is decided and made in steps (docs/design.md
// §10); apply applies its outcome.
//
// A write is based on a version of the claim whose spec the caller showed
// the allocator (a listing) or on the allocator's own last write of it: the
// claim's Want is read by the caller, so a version the allocator only read
// live could ask for something else. Live reads therefore decide outcomes
// (gone? landed?) and never become the base of a plan, but for one: a
// settled claim's version, let go (letGo), is read again, and used only
// when it is at the resourceVersion known, which makes it that version. A
// conflict is left for the next round, when the listing shows the new
// version.
//
// The steps, each deciding on what is known and then making its calls
// for every claim at once: readFor decides the live read of the claim the
// write rests on, if any (where the version known was let go, or the
// claim left the listing); based takes it in and decides the live reads
// of pods its record lists whose marks are known only older than it
// (staleMark takes each in); decide makes the record; writeCall is the
// write, and wrote takes in its outcome.
func (r *round) readFor(w *write) *claimGet {
	w.skip = true // until prepared in full
	base := w.ci.object()
	w.own = base != nil
	if base == nil && w.ci.letGone() && w.ci.listed {
		// The version known was let go when the claim settled: read it
		// again. Read at the resourceVersion known, it is that version;
		// at another, the claim changed since the listing, and the write
		// waits for the listing to show the change, as after a conflict.
		w.reread = true
		return r.claimGet(w.ci, nil)
	}
	if base == nil {
		// A claim known only from its pods' marks.
		if w.ci.isGone() {
			w.gone = true
			return nil
		}
		if base = r.p.protoFor(w.ci); base == nil {
			w.err = fmt.Errorf("read claim: %w", errNoProto)
			return nil
		}
	}
	w.base = base
	if !w.ci.listed {
		// Not in the listing: it may be gone or moved; ask the server.
		// Such a write only gives pods back, which needs no spec.
		return r.claimGet(w.ci, base)
	}
	return nil
}

// based takes in rd, the read readFor decided on (nil if none), and
// returns the pods whose live marks the write must be decided on.
func (r *round) based(w *write, rd *claimGet) []string {
	if w.gone || w.err != nil {
		return nil
	}
	base := w.base
	if rd != nil {
		switch {
		case apierrors.IsNotFound(rd.err):
			w.gone = true
			return nil
		case rd.err != nil:
			w.err = fmt.Errorf("read claim: %w", rd.err)
			return nil
		case !w.reread:
			base, w.fresh, w.own = rd.obj, rd.obj, false
		case rd.obj.GetResourceVersion() != w.ci.rv:
			w.err = apierrors.NewConflict(schema.GroupResource{}, w.ci.name().Name,
				fmt.Errorf("claim %s changed since resourceVersion %s, which the allocator knows", w.ci.name(), w.ci.rv))
			return nil
		default:
			base, w.own = rd.obj, true
		}
	}
	if base.GetDeletionTimestamp() != nil {
		w.add = nil // I8: a terminating claim gets nothing new
	}
	var baseRec *syncer.Record
	decoded, err := r.a.cfg.syncer.Read(base)
	if err == nil || errors.Is(err, syncer.ErrMalformedRelease) {
		baseRec = &decoded
	}
	if w.fresh != nil && baseRec != nil && r.marks() && !r.givenUp(w.ci, w.fresh) {
		// Read live, the claim is at a version newer than the record the
		// round decided on. If that record holds a pod the write would
		// give back as settled (docs/design.md I13: recycled because a record
		// newer than its mark did not list it), another allocator handed
		// the pod to the claim again since: the decision is stale, and
		// writing it would take from the claim a pod it holds and wants
		// (I7; TestRegressionSettleDoesNotUndoANewerHandOut). Nothing is
		// written; the next round sees the new record. Not so for a claim
		// this pool gives its pods back to whatever its record says: no
		// round here would see that record, and giving the pod back is
		// what settling it does
		// (TestRegressionSettleForAClaimThatLeftThePoolGoesThrough).
		if n := rvNum(base.GetResourceVersion()); n == 0 || n > w.ci.recRV {
			held := baseRec.Held()
			for _, name := range w.settled {
				if slices.Contains(held, name) {
					w.err = apierrors.NewConflict(schema.GroupResource{}, w.ci.name().Name,
						fmt.Errorf("claim %s holds pod %s again in a record newer than the one known", w.ci.name(), name))
					return nil
				}
			}
		}
	}
	w.base, w.baseRec, w.releaseOK, w.skip = base, baseRec, err == nil, false
	return r.staleMarks(w.ci, base, baseRec)
}

// decide makes the record w writes from what readFor and based read.
func (r *round) decide(w *write) {
	if w.skip {
		return
	}
	s := r.a.cfg.syncer
	rec, fin := r.desired(w, w.baseRec, w.releaseOK, w.own)
	if len(w.add) == 0 && len(w.done) == 0 && len(w.drop) == 0 && len(w.adopt) == 0 && len(w.settled) == 0 &&
		(!w.ci.rewrite || w.baseRec != nil && sameRecord(*w.baseRec, rec)) && fin == s.HasFinalizer(w.base) {
		// Nothing to change (a rewrite that would write what is there
		// already changes nothing either).
		w.obj, w.rec, w.skip = w.base, rec, true
		return
	}
	w.want, w.fin = rec, fin
}

// writeCall is the write decide made for w, nil if none.
func (r *round) writeCall(w *write) *recordWrite {
	if w.skip {
		return nil
	}
	return &recordWrite{uid: w.ci.uid(), name: w.ci.name(), base: w.base, rec: w.want, fin: w.fin}
}

// wrote takes in the outcome of w's write, c.
func (r *round) wrote(w *write, c *recordWrite) {
	obj, err, base, rec := c.obj, c.err, w.base, w.want
	if err == nil && obj.GetResourceVersion() == base.GetResourceVersion() &&
		(obj.GetDeletionTimestamp() == nil || len(obj.GetFinalizers()) > 0) {
		// The new version is what fences the marks of pods the record no
		// longer lists; without one the write achieved nothing. (A write
		// that removed the last finalizer of a deleted claim let it go:
		// the API server returns its last state at the version replaced.)
		w.err = fmt.Errorf("claim %s: write record: the syncer returned the claim at resourceVersion %s, the one it replaced (AllocationSyncer.Write must make a new version)",
			w.ci.name(), base.GetResourceVersion())
		return
	}
	if err == nil {
		w.obj, w.rec, w.wrote = obj, rec, true
		return
	}
	if apierrors.IsNotFound(err) {
		w.gone = true
		return
	}
	w.err = err
	if definite(err) {
		return
	}
	// The write may have landed. The executor read the claim back: if it
	// shows the new record, it did. Otherwise the request may still be in
	// flight, so the new pods are reserved, not freed.
	if rb := c.readBack; rb != nil && rb.err == nil {
		w.fresh = rb.obj
		if got, rerr := r.a.cfg.syncer.Read(rb.obj); rerr == nil && slices.Equal(sortedCopy(got.Held()), sortedCopy(rec.Held())) {
			w.rec, w.err, w.landed, w.wrote = rec, nil, true, true
			return
		}
	}
	w.unknown = true
}

// nilObject reports whether o is nil or a nil pointer.
func nilObject(o client.Object) bool {
	if o == nil {
		return true
	}
	v := reflect.ValueOf(o)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// recordPod is the pod that ci's record means by name: the pool's entry,
// or, where the entry is an older pod under the name that is gone and not
// ci's (lost) pod, the newer pod waiting under the name, whose mark then
// decides.
func (p *pool) recordPod(ci *claimInfo, name string) *podInfo {
	pi := p.pods.Get(name)
	if pi != nil && !pi.present && p.holderOf(pi) != ci {
		if next := pi.nextPod(); next != nil && next.present {
			return next
		}
	}
	return pi
}

// staleMarks returns the names of the pods base's record lists as held
// whose marks w must read live before it decides on them (staleMark),
// since what the pool knows of them is older than the record or nothing:
//   - listed, with a mark as known that does not name ci and is older
//     than base: a write must not drop a pod the record lists on a belief
//     older than the record (the pod may have been marked for ci since);
//   - not listed, for a claim the pool lists, and either neither held
//     nor reserved here (no entry, or one in stateGone) or known only as
//     older than base and not held by ci: the pod may have been deleted
//     since the record was written (its recycling recorded by a write
//     that lost to another allocator's), so keeping it on its last-known
//     mark would keep a pod that is no more; or a lagging listing may
//     hide a pod another allocator handed to ci (after the claim this
//     allocator believes holds it let it go), so dropping it unread would
//     take a pod the owner may have seen (I7;
//     TestRegressionPodOfAGoneClaimStaysWithItsNewHolder). A pod ci holds
//     that the listing lacks is lost, and kept.
func (r *round) staleMarks(ci *claimInfo, base client.Object, baseRec *syncer.Record) []string {
	if !r.marks() || baseRec == nil {
		return nil
	}
	baseRV := rvNum(base.GetResourceVersion())
	var out []string
	for _, name := range baseRec.Held() {
		pi := r.p.recordPod(ci, name)
		switch {
		case pi == nil || !pi.present:
			if ci.listed && (pi == nil || pi.state == stateGone || r.p.holderOf(pi) != ci && rvNum(pi.rv) < baseRV) {
				out = append(out, name)
			}
		case pi.markUID(r.p.name) != ci.uid() && rvNum(pi.rv) < baseRV:
			out = append(out, name)
		}
	}
	return out
}

// liveMark is a pod's mark as read live, and the UID of the pod read;
// found is false if there was none.
type liveMark struct {
	mark  string
	uid   types.UID
	found bool
}

// is reports whether the pod read is pi, not none or another pod under
// its name.
func (l liveMark) is(pi *podInfo) bool { return l.found && l.uid == pi.uid() }

// staleMark takes in rd, a live read of the pod named name (see
// staleMarks): w decides on the mark of the pod under the name now, which
// may be a newer pod than the one listed (the record names pods by name);
// no pod means no mark. A read that fails decides nothing, so w is not
// written this round: the pod is neither kept nor dropped on a guess.
func (r *round) staleMark(w *write, name string, rd *podGet) {
	var live liveMark
	switch {
	case rd.err == nil:
		live = liveMark{mark: rd.pod.Annotations[r.a.cfg.markKey], uid: rd.pod.UID, found: true}
	case !apierrors.IsNotFound(rd.err):
		if !w.skip {
			w.err, w.skip = fmt.Errorf("read pod %s, which its record lists: %w", name, rd.err), true
		}
		return
	}
	if w.marks == nil {
		w.marks = make(map[string]liveMark)
	}
	w.marks[name] = live
}

// givenUp reports whether the pool gives back what ci holds here whatever
// ci's record says (queueOrphans): ci is not in the listing, and live (as
// read, live) it is in another pool (WithClaimPool) or, without
// WithClaimPool, it has been missing from the listing for the quarantine.
func (r *round) givenUp(ci *claimInfo, live client.Object) bool {
	if ci.listed || live == nil {
		return false
	}
	if r.a.cfg.claimPool != nil {
		return r.left(ci, liveClaim{obj: live})
	}
	since := ci.since()
	return !since.IsZero() && !r.now.Before(since.Add(r.a.cfg.quarantine))
}

// definite reports whether err proves the write did not land.
func definite(err error) bool {
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err), apierrors.IsInvalid(err),
		apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsBadRequest(err),
		apierrors.IsRequestEntityTooLargeError(err), apierrors.IsMethodNotSupported(err):
		return true
	}
	var recErr *syncer.RecordError
	return errors.As(err, &recErr)
}

// sameRecord reports whether two records list the same pods, in any
// order.
func sameRecord(x, y syncer.Record) bool {
	return slices.Equal(sortedCopy(x.Allocated), sortedCopy(y.Allocated)) &&
		slices.Equal(sortedCopy(x.Release), sortedCopy(y.Release)) &&
		slices.Equal(sortedCopy(x.Released), sortedCopy(y.Released))
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// apply brings the store and the pool in line with w's outcome. Only a
// durable write changes the store (I4).
func (r *round) apply(w *write) {
	ci, st, p := w.ci, r.a.cfg.store, r.p
	if w.fresh != nil && w.fresh.GetDeletionTimestamp() != nil {
		ci.terminating = true // safe to learn from a live read: it never reverts
	}
	committed := w.err == nil && !w.gone
	if !committed && !w.unknown && r.marks() {
		// Not recorded released, for certain: the record still lists the
		// pods as held, and the owner may use them again (it may take back
		// its release request). With pod marks they are recycled again
		// before they are released, however their release is written
		// (their marks keep them out of the pool until it is). After a
		// write of unknown outcome, which may have recorded them released,
		// they stay recycled: the next write records what the server may
		// hold already; so they do without pod marks, where the next write
		// is made from what the allocator holds. A pod counted done only
		// because the listing lacked it was never recycled (recycle sets
		// recycled only on the recycler's word): the listing may lag, and
		// the pod show up again as it was.
		for _, name := range w.done {
			if pi := p.heldPod(ci, name); pi != nil {
				pi.recycled = false
			}
		}
	}
	for _, name := range w.marked {
		if !committed || !slices.Contains(w.add, name) {
			if w.unknown && slices.Contains(w.add, name) {
				continue // reserved; its mark stays while it may be held
			}
			// The hand-out failed for certain: no record lists the pod,
			// and none can while it carries the mark.
			r.queueUnmark(p.pods.Get(name), ci.uid(), fenceGone)
		}
	}
	switch {
	case w.gone:
		ci.setGone()
		// Nothing durable is left to change: recycled pods are free; the
		// rest are given back through recycling next round.
		if len(w.done) > 0 {
			if err := st.Free(p.name, ci.uid(), w.done); err != nil {
				r.storeFail(ci, err)
				return
			}
			for _, name := range w.done {
				r.unhold(ci, p.pods.Get(name), fenceGone)
			}
			r.res.Released = append(r.res.Released, algorithm.Grant{UID: ci.uid(), Claim: ci.name(), Pods: w.done})
		}
		for _, name := range w.settled {
			pi := p.entryIn(name, stateSettling)
			r.endSettle(pi)
			r.queueUnmark(pi, ci.uid(), fenceGone)
		}
		if len(w.settled) > 0 {
			r.res.Released = append(r.res.Released, algorithm.Grant{UID: ci.uid(), Claim: ci.name(), Pods: w.settled})
		}
		ci.listed = false
	case w.err != nil:
		r.errs = append(r.errs, r.claimErr(ci, fmt.Errorf("%w: %w", ErrWrite, w.err)))
		if w.unknown {
			// What the server holds for the claim is unknown until a write
			// of it succeeds: its record is not checked for tampering.
			ci.unsettled = true
			for _, name := range w.add {
				p.reserve(p.pods.Get(name), ci, r.now.Add(r.a.cfg.quarantine))
			}
		}
	default:
		after := w.obj
		if after == nil {
			after = w.fresh
		}
		if w.obj != nil && ci.listed {
			p.setObj(ci, w.obj, r.a.cfg)
			ci.addRV(w.obj.GetResourceVersion())
			if w.obj.GetDeletionTimestamp() != nil {
				ci.terminating = true
			}
		}
		fence := uint64(0)
		if after != nil {
			fence = rvNum(after.GetResourceVersion())
		}
		if r.marks() {
			if fence > ci.recRV {
				ci.recRV = fence
			}
			// Names the record keeps that the claim does not hold here
			// (kept by their marks, e.g. a newer pod under a name whose
			// old pod another claim still holds) stay strays, so that
			// the claim takes them once the pod is free of that.
			var strays []string
			if ci.listed {
				for _, name := range w.rec.Held() {
					if p.heldPod(ci, name) != nil || slices.Contains(w.add, name) || slices.Contains(w.adopt, name) {
						continue
					}
					// Kept by a live read of its mark (staleMarks): held.
					if pi := p.pods.Get(name); pi != nil && pi.present && p.holderOf(pi) == nil && pi.reservedBy() == nil && pi.settling() == nil {
						// Only a read of the pod listed tells its mark (the
						// pod under the name may be a newer one).
						live := w.marks[name]
						if h, ok := parseMark(p.name, live.mark); ok && h.UID == ci.uid() && live.is(pi) {
							pi.mark, pi.markOwn, pi.markRV = p.markString(live.mark), false, max(pi.markRV, fence)
							if r.allocate(ci, name) {
								continue
							}
						}
					}
					strays = append(strays, name)
				}
			}
			r.setStrays(ci, strays)
		}
		ci.setReleased(w.rec.Released)
		ci.setRelease(w.rec.Release)
		for _, name := range w.done {
			if slices.Contains(ci.release(), name) {
				ci.consume(name)
			}
		}
		for _, name := range w.settled {
			pi := p.entryIn(name, stateSettling)
			r.endSettle(pi)
			r.queueUnmark(pi, ci.uid(), fence)
		}
		if len(w.settled) > 0 {
			r.res.Released = append(r.res.Released, algorithm.Grant{UID: ci.uid(), Claim: ci.name(), Pods: w.settled})
		}
		free := append(slices.Clone(w.done), w.drop...)
		if len(free) > 0 {
			if err := st.Free(p.name, ci.uid(), free); err != nil {
				r.storeFail(ci, err)
				return
			}
			for _, name := range free {
				r.unhold(ci, p.pods.Get(name), fence)
			}
		}
		if len(w.done) > 0 {
			r.res.Released = append(r.res.Released, algorithm.Grant{UID: ci.uid(), Claim: ci.name(), Pods: w.done})
		}
		if r.marks() && w.wrote {
			r.letGoUnrecorded(w)
		}
		for _, name := range w.adopt {
			p.endActive(p.pods.Get(name))
		}
		if newly := append(slices.Clone(w.add), w.adopt...); len(newly) > 0 {
			if err := st.Allocate(p.name, ci.holder(), newly); err != nil {
				r.storeFail(ci, err)
				return
			}
			for _, name := range newly {
				r.hold(ci, name)
				p.pods.Get(name).handed = true // by this allocator, now
			}
			if len(w.add) > 0 {
				r.res.Allocated = append(r.res.Allocated, algorithm.Grant{UID: ci.uid(), Claim: ci.name(), Pods: slices.Clone(w.add)})
				r.noteServed(ci)
			}
		}
		r.a.setHolds(ci, p.nHeld(ci) > 0)
		ci.setUntrusted(nil)
		ci.rewrite = false
		if w.obj != nil {
			ci.unsettled = false
		}
	}
}

// letGoUnrecorded brings the store in line with w's record, stored (pod
// marks): a pod the claim holds here (held or lost; a recycling pod ends
// through its release) that the record no longer lists was left out on
// what its mark says, most often as read live (staleMarks): the pod is
// gone, another pod is under its name, or it is marked for another claim.
// Such a pod is let go as a newer record's omission lets it go (takeIn): a
// pod still marked for the claim is settled for it, one the live read
// shows gone or not the claim's is dropped, and an unmarked one is
// recycled first (I13). Left held, it would count for the claim while no
// record lists it, and the claim would never be handed its replacement
// (TestRegressionRefusedMigrationMarkKeepsStoreAndRecordAlike).
func (r *round) letGoUnrecorded(w *write) {
	ci := w.ci
	held := sortedCopy(w.rec.Held())
	var omitted []*podInfo
	for _, pi := range r.p.held(ci) {
		name := pi.name()
		if _, ok := slices.BinarySearch(held, name); ok || pi.recycling() ||
			slices.Contains(w.add, name) || slices.Contains(w.adopt, name) {
			continue
		}
		omitted = append(omitted, pi)
	}
	for _, pi := range omitted {
		live, read := w.marks[pi.name()]
		switch {
		case read && (!live.is(pi) || live.mark != "" && r.p.markString(live.mark) != pi.mark):
			// Gone, another pod under its name, or marked anew since.
			r.drop(ci, pi)
		case pi.present && pi.mark == "":
			r.startRecycling(ci, pi)
		default:
			r.toSettle(ci, pi)
		}
	}
}

// report fills the parts of the result that describe the pool. It visits
// the free list and the recycling and lost sets, not the whole pool.
// scaleDownOrder orders idle, the names of the pool's free pods, for a
// pool that packs (WithTopology): pods on the nodes with the fewest pods
// in use first (by node name among equals, then by pod name), so that a
// caller that deletes idle pods from the front empties nodes.
func (r *round) scaleDownOrder(idle []string) {
	busy := make(map[string]int)
	for pi := range r.p.pods.All() {
		if pi.present && pi.state != stateFree && pi.place != nil {
			busy[pi.place.node]++
		}
	}
	type entry struct{ node, name string }
	es := make([]entry, len(idle))
	for i, name := range idle {
		es[i].name = name
		if pi := r.p.pods.Get(name); pi != nil && pi.place != nil {
			es[i].node = pi.place.node
		}
	}
	slices.SortFunc(es, func(x, y entry) int {
		if c := cmp.Compare(busy[x.node], busy[y.node]); c != 0 {
			return c
		}
		if c := strings.Compare(x.node, y.node); c != 0 {
			return c
		}
		return strings.Compare(x.name, y.name)
	})
	for i, e := range es {
		idle[i] = e.name
	}
}

func (r *round) report() {
	res, p := r.res, r.p
	res.IdleCount, res.Idle, res.Starting, res.Held, res.reported = len(p.free), nil, p.nStarting, p.nHeldPods, true
	if r.listIdle {
		res.Idle = make([]string, len(p.free))
		for i, c := range p.free {
			res.Idle[i] = c.Name
		}
		if r.a.cfg.topology.Mode == algorithm.TopologyPack {
			r.scaleDownOrder(res.Idle)
		}
	}
	res.Recycling, res.Lost = nil, nil
	for pi := range p.recycling {
		res.Recycling = append(res.Recycling, pi.name())
	}
	slices.Sort(res.Recycling)
	for pi := range p.lost {
		ci := p.holderOf(pi)
		if ci == nil || ci == unknownHolder {
			continue
		}
		res.Lost = append(res.Lost, LostPod{Claim: ci.name(), UID: ci.uid(), Pod: pi.name(), Missing: !pi.present})
	}
	slices.SortFunc(res.Lost, func(x, y LostPod) int { return strings.Compare(x.Pod, y.Pod) })
}
