package allocator

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/syncer"
)

// Fencing with pod marks.
//
// Safety with any number of allocators rests on compare-and-swap writes
// (guarded by resourceVersions) and on the order of resourceVersions, which
// the API server takes from one etcd revision counter shared by pods and
// claims. Every allocator follows these rules:
//
//   - Hand-out: a pod is marked for the claim (guarded by the pod's
//     resourceVersion, from unmarked) before the claim's record lists it.
//     A record write adds a pod only when the pod's mark names the claim
//     and is newer than the claim version the write replaces: a mark made
//     in this round, or this allocator's own earlier mark when the claim
//     has not been written since.
//   - Keep: a record write lists as held only pods that the version it
//     replaces lists and whose mark names the claim (read live where the
//     mark as known is older than that version), and the unmarked pods a
//     record written before pod marks lists, which the claim holds until
//     they are marked and recycled. It never re-adds a pod from memory.
//   - Newer record wins: a newer version of a claim's record is taken in,
//     filtered by the marks. A pod it lists that is marked for another
//     claim, or absent, is not held by it (its next write drops it); a pod
//     it lists with no mark is of uncertain ownership: it is marked for the
//     claim and recycled before anyone else gets it (I13), or kept with
//     WithPodMarkMigration. Where the pod as known is older than the
//     record, the pod is read live before deciding.
//   - Missing pod: a record entry for a pod the listing lacks is read live
//     before the record is written without it. A pod that exists marked for
//     the claim stays held, as a lost pod (the pod listing lagged, or the
//     pod is of a pool the claim left, which takes it back); it is never
//     taken into the pool from a live read.
//   - Mark without record: a pod marked for a claim whose record does not
//     list it is recycled for that claim and recorded as released before
//     its mark goes. If the mark is newer than the record, a hand-out may
//     still be in flight: the pod waits a quarantine first (for liveness
//     only: the release write moves the claim's resourceVersion on, which
//     fences any write still in flight).
//   - Unmark: a mark naming claim c is removed, guarded by the pod's
//     resourceVersion, only when a version of c's record newer than the
//     mark does not list the pod as held, when c no longer exists, or when
//     this allocator's own hand-out of the pod failed for certain.
//   - Recycling is a write too: the recycler is called only for a pod whose
//     mark names the claim it is recycled for, proven by a fence write
//     just before (fenceRecycle), or, for a recycler that writes nothing
//     or only under the pod's known resourceVersion (WithRecycleFence),
//     by that precondition itself.
//   - Every record write makes a new version of the claim, even one that
//     writes what the record holds already (another allocator recorded the
//     release and crashed before the unmark): the API server keeps the
//     resourceVersion of a patch that changes nothing, and a mark known
//     only as older than its pod's version can go only after a record
//     version newer than that (AllocationSyncer.Write's contract). The one
//     write that may return the version it replaced lets a deleted claim
//     go; marks it leaves go once the claim is found gone (fenceGone).

// rvNum is a resourceVersion as a number, 0 if it is not one. It accepts
// what apimachinery's resourceversion.CompareResourceVersion accepts (a
// positive decimal integer without leading zeros) that fits in 64 bits:
// the allocator keeps versions as numbers, eight bytes each, to compare
// versions of different pods and claims (etcd revisions order every write).
func rvNum(rv string) uint64 {
	if rv == "" || rv[0] == '0' {
		return 0
	}
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// fenceGone justifies an unmark that needs no record version: the claim is
// gone, or the allocator's own hand-out of the pod failed for certain.
const fenceGone = math.MaxUint64

// unmarkEntry is a pod whose mark the allocator may remove.
type unmarkEntry struct {
	// uid is the claim the mark must still name.
	uid types.UID
	// fence is the resourceVersion of a version of that claim's record that
	// does not list the pod as held; the mark may go if it is older.
	fence uint64
}

// queueUnmark asks for pi's mark to be removed, justified by fence.
func (r *round) queueUnmark(pi *podInfo, uid types.UID, fence uint64) {
	if r.a.cfg.markKey == "" || pi == nil || pi.mark == "" || !pi.present {
		return
	}
	r.p.unmark[pi.name()] = unmarkEntry{uid: uid, fence: fence}
}

// marks reports whether pod marks are on.
func (r *round) marks() bool { return r.a.cfg.markKey != "" }

// takeIn takes in a version of claim ci's record (pod marks on): the
// pods it lists are held if their marks say so, pods ci held that it no
// longer lists are settled, and the rest are strays.
func (r *round) takeIn(ci *claimInfo, rec syncer.Record, rv uint64) {
	if rv != 0 && rv < ci.recRV {
		return // older than what is known
	}
	ci.recRV = rv
	ci.setReleased(rec.Released)
	held := rec.Held()
	for _, pi := range r.p.held(ci) {
		if slices.Contains(held, pi.name()) {
			continue
		}
		if rv != 0 && pi.present && pi.markUID(r.p.name) == ci.uid() && pi.markRV > rv {
			// The pod was marked for ci after this record version: a
			// hand-out may be in flight, or a newer record lists it (a
			// claim known so far only from marks, then listed from a
			// lagging cache). It is reserved for ci, as resolveMark does.
			r.drop(ci, pi)
			r.reserveFor(ci, pi)
			continue
		}
		// The newer record no longer lists a pod ci held: whoever wrote it,
		// the pod is not free as it is.
		r.toSettle(ci, pi)
	}
	if rv != 0 {
		// A pod reserved for ci (marked for it after the record then
		// known) that a record version newer than its mark does not list
		// held is not ci's: it is settled, no longer counted for ci.
		for pi := range r.p.reserved {
			if pi.reservedBy() == ci && pi.present && pi.markUID(r.p.name) == ci.uid() && pi.markRV != 0 && pi.markRV < rv && !slices.Contains(held, pi.name()) {
				r.startSettle(ci, pi)
			}
		}
	}
	var strays []string
	for _, name := range held {
		if r.p.heldPod(ci, name) != nil {
			continue
		}
		if !r.takeName(ci, name, 0) {
			strays = append(strays, name)
		}
	}
	r.setStrays(ci, strays)
}

// What takeName may rely on beyond the listing.
const (
	// podRead: the pod was read live, after the record was written.
	podRead = 1 << iota
	// claimRead: the claim was read live and its record lists the pod.
	claimRead
)

// takeName decides whether ci holds the pod its record lists under name.
// It returns false for a stray entry: ci does not hold it, and its next
// write drops it (unless a live read asked for here decides otherwise).
func (r *round) takeName(ci *claimInfo, name string, read int) bool {
	verified := read&podRead != 0
	p := r.p
	pi := p.pods.Get(name)
	if pi == nil || !pi.present {
		// Never seen, or gone: not reserved for anyone. The pod listing
		// may lag the record, though: the pod is read live, and held if
		// it exists marked for ci (found).
		if !verified && ci.listed {
			r.findLater(ci, name)
		}
		return false
	}
	switch h := pi.markUID(p.name); {
	case h == ci.uid():
		switch {
		case p.holderOf(pi) == ci:
			return true
		case pi.reservedBy() == ci:
			r.unreserve(ci, []*podInfo{pi}, true)
			return p.holderOf(pi) == ci
		case pi.settling() == ci:
			// Handed to it again after all (another allocator completed the
			// hand-out, or a lagging listing made an old mark look like a
			// hand-out that never landed): it is held, and the settling
			// ends. A recycle already asked for was guarded by the pod's
			// resourceVersion then (RecycleRequest), which moved on with
			// the hand-out. Giving it back now would take from the claim
			// a pod it wants.
			r.endSettle(pi)
			return r.allocate(ci, name)
		case p.holderOf(pi) == nil && pi.reservedBy() == nil && pi.settling() == nil:
			return r.allocate(ci, name)
		}
		return false
	case h != "":
		if p.holderOf(pi) == ci {
			r.drop(ci, pi)
		}
		if !verified && rvNum(pi.rv) < ci.recRV {
			r.verifyLater(pi, ci)
			return false
		}
		if !r.a.cfg.markMigrate && pi.markRV != 0 && pi.markRV < ci.recRV {
			// The pod was marked for another claim before this record
			// version was written: no allocator writes such a record (it
			// lists a pod only while the pod is marked for the claim).
			// Someone who can edit the claim wrote it (WithPodMarkMigration
			// lets such a record win, see newerRecordWins).
			r.warn(r.claimErr(ci, fmt.Errorf("%w: lists pod %s, which was marked for claim %s before the record was written: not handed to it",
				ErrUntrustedRecord, name, pi.mark)))
		}
		return false
	default:
		if holder := p.holderOf(pi); holder != nil || pi.reservedBy() != nil || pi.settling() != nil {
			return holder == ci
		}
		if !verified && rvNum(pi.rv) < ci.recRV {
			r.verifyLater(pi, ci)
			return false
		}
		if read&claimRead == 0 {
			// The record may be a lagging copy of one that no longer lists
			// the pod: read the claim live before acting on it.
			r.confirmLater(ci, name)
			return false
		}
		// The record says ci holds it and no mark does: who uses it is
		// uncertain (a record from before pod marks, a hand edit). It is
		// marked for ci, then recycled before anyone else gets it, or,
		// with WithPodMarkMigration, believed.
		if !r.allocate(ci, name) {
			return false
		}
		p.tomark[name] = ci.uid()
		if !r.a.cfg.markMigrate {
			r.startRecycling(ci, pi)
			r.warn(r.claimErr(ci, fmt.Errorf("%w: pod %s carries no mark: it is recycled before anyone gets it (WithPodMarkMigration believes such records)",
				ErrUntrustedRecord, name)))
		}
		return true
	}
}

// allocate records in the store and the pool that ci holds pod name.
func (r *round) allocate(ci *claimInfo, name string) bool {
	if pi := r.p.pods.Get(name); pi != nil {
		name = pi.name() // the pod's own string, not the record's copy
	}
	if err := r.a.cfg.store.Allocate(r.p.name, ci.holder(), r.onePod(name)); err != nil {
		r.storeFail(ci, err)
		return false
	}
	r.hold(ci, name)
	r.a.setHolds(ci, true)
	// It may now hold more than it wants: planned again.
	r.p.dirty[ci] = struct{}{}
	return true
}

// onePod returns a list of one pod, name, for a store call, which neither
// keeps nor changes it (store.Writer): the round's own, reused, so that a
// call for one pod allocates nothing. Store calls are made one at a time.
func (r *round) onePod(name string) []string {
	r.one[0] = name
	return r.one[:]
}

// drop ends ci's hold of pi without unmarking it: a newer record or mark
// says ci does not hold it.
func (r *round) drop(ci *claimInfo, pi *podInfo) {
	if err := r.a.cfg.store.Free(r.p.name, ci.uid(), r.onePod(pi.name())); err != nil {
		r.storeFail(ci, err)
		return
	}
	r.unhold(ci, pi, 0)
	r.a.setHolds(ci, r.p.nHeld(ci) > 0)
	r.p.dirty[ci] = struct{}{}
}

// toSettle moves a pod ci held, that ci's record no longer lists, to
// settling for ci: recycled (unless it already was), recorded as released,
// then unmarked.
func (r *round) toSettle(ci *claimInfo, pi *podInfo) {
	recycled := pi.recycled
	if !r.marks() || !pi.present || pi.markUID(r.p.name) != ci.uid() {
		// Gone, or not marked for ci: nothing of ci's to settle.
		r.drop(ci, pi)
		return
	}
	// Held (or recycling) to settling, then the store lets it go; the
	// state keeps the entry while it is dropped.
	r.p.setState(pi, stateSettling, ci, false)
	if pi.state != stateSettling {
		return // refused: the round fails closed
	}
	pi.recycled = recycled
	r.drop(ci, pi)
}

func (r *round) startSettle(ci *claimInfo, pi *podInfo) {
	if pi.settling() == ci {
		return
	}
	r.p.setState(pi, stateSettling, ci, false)
	pi.recycled = false
}

// endSettle ends pi's settling, if it is settling.
func (r *round) endSettle(pi *podInfo) {
	if pi == nil {
		return
	}
	if pi.state == stateSettling {
		pi.recycled = false
		r.p.endActive(pi)
	}
	r.maybeForget(pi)
}

// setStrays replaces ci's stray entries.
func (r *round) setStrays(ci *claimInfo, names []string) {
	p := r.p
	for _, name := range ci.strays() {
		if pi := p.pods.Get(name); pi != nil {
			pi.strays--
			r.maybeForget(pi)
		}
	}
	for _, name := range names {
		pi := p.podOrNew(name)
		pi.strays++
		p.refresh(pi)
	}
	ci.setStrays(names)
	if len(names) > 0 {
		ci.rewrite = true
		p.dirty[ci] = struct{}{}
	}
}

// addStray adds one stray entry to ci.
func (r *round) addStray(ci *claimInfo, name string) {
	if slices.Contains(ci.strays(), name) {
		return
	}
	r.setStrays(ci, append(slices.Clone(ci.strays()), name))
}

// removeStray removes one stray entry from ci.
func (r *round) removeStray(ci *claimInfo, name string) {
	if slices.Contains(ci.strays(), name) {
		r.setStrays(ci, slices.DeleteFunc(slices.Clone(ci.strays()), func(n string) bool { return n == name }))
	}
}

// maybeForget drops the entry of a pod that is neither listed nor needed.
func (r *round) maybeForget(pi *podInfo) {
	p := r.p
	if p.pods.Get(pi.name()) != pi {
		return
	}
	if pi.present || pi.reservedBy() != nil || pi.settling() != nil || pi.strays > 0 || p.holderOf(pi) != nil {
		p.refresh(pi)
		return
	}
	if rv := rvNum(pi.rv); rv != 0 && pi.nextPod() == nil {
		if p.tombs == nil {
			p.tombs = make(map[string]podTomb)
		}
		p.tombs[pi.name()] = podTomb{uid: pi.uid(), rv: rv, until: r.now.Add(r.a.cfg.quarantine)}
	}
	p.dropPod(pi)
}

// pruneTombs forgets the tombs older than a quarantine: listings lag less.
func (r *round) pruneTombs() {
	for name, t := range r.p.tombs {
		if r.now.After(t.until) {
			delete(r.p.tombs, name)
		}
	}
}

// dropPod removes pi's entry; a newer pod waiting under the name takes it.
func (p *pool) dropPod(pi *podInfo) {
	if p.pods.Get(pi.name()) != pi {
		return
	}
	pi.present = false
	p.refresh(pi)
	p.removePod(pi)
	if next := pi.nextPod(); next != nil {
		pi.setNextPod(nil)
		next.waiting = false
		next.strays = pi.strays
		p.pods.Set(next)
		p.refresh(next)
		if next.mark != "" {
			p.promoted = append(p.promoted, next)
		}
		return
	}
	p.pods.Del(pi.name())
}

// verifyLater asks for pi to be read live before ci's record is decided
// on: the pod as known is older than the record.
func (r *round) verifyLater(pi *podInfo, ci *claimInfo) {
	if r.verify == nil {
		r.verify = make(map[*podInfo][]*claimInfo)
	}
	r.verify[pi] = append(r.verify[pi], ci)
}

// verifyCalls returns the pods whose records were newer than the pods as
// known, with the live reads of them, for verified.
func (r *round) verifyCalls() (map[*podInfo][]*claimInfo, []*podInfo, []*podGet) {
	verify := r.verify
	r.verify = nil
	pis := slices.SortedFunc(maps.Keys(verify), func(x, y *podInfo) int { return strings.Compare(x.name(), y.name()) })
	calls := make([]*podGet, len(pis))
	for i, pi := range pis {
		calls[i] = &podGet{name: pi.name()}
	}
	return verify, pis, calls
}

// verified takes in the live reads of pods whose records were newer than
// the pods as known, and decides those records' entries again.
func (r *round) verified(verify map[*podInfo][]*claimInfo, pis []*podInfo, reads []*podGet) {
	for i, pi := range pis {
		rd := reads[i]
		switch {
		case apierrors.IsNotFound(rd.err):
			r.podGone(pi.name(), pi)
		case rd.err != nil:
			r.errs = append(r.errs, fmt.Errorf("pool %s: pod %s: %w: %w", r.p.name, pi.name(), ErrRead, rd.err))
			if r.unread == nil {
				r.unread = make(map[*podInfo]bool)
			}
			r.unread[pi] = true
			continue
		default:
			r.observePod(&rd.pod)
		}
		for _, ci := range verify[pi] {
			if !slices.Contains(ci.strays(), pi.name()) || r.p.heldPod(ci, pi.name()) != nil {
				continue
			}
			if r.takeName(ci, pi.name(), podRead) {
				r.removeStray(ci, pi.name())
			}
		}
		if now := r.p.pods.Get(pi.name()); now != nil {
			r.resolveMark(now)
		}
	}
}

// readPods reads the named pods of the pool live, concurrently, in order.
func (r *round) readPods(names []string) []*podGet {
	var e effects
	e.podReads = make([]*podGet, len(names))
	for i, name := range names {
		e.podReads[i] = &podGet{name: name}
	}
	r.exec(&e)
	return e.podReads
}

// findLater asks for the pod named name, which ci's record lists and the
// listing lacks, to be read live.
func (r *round) findLater(ci *claimInfo, name string) {
	if r.find == nil {
		r.find = make(map[string][]*claimInfo)
	}
	r.find[name] = append(r.find[name], ci)
}

// findCalls returns the names that records list and the listing lacks,
// with the live reads of them, for found.
func (r *round) findCalls() (map[string][]*claimInfo, []string, []*podGet) {
	find := r.find
	r.find = nil
	names := slices.Sorted(maps.Keys(find))
	calls := make([]*podGet, len(names))
	for i, name := range names {
		calls[i] = &podGet{name: name}
	}
	return find, names, calls
}

// found takes in the live reads of the pods that records list and the
// listing lacks. A pod that exists marked for one of those claims is held
// by it, as a pod missing from the listing (lost): the pod listing may
// lag, or the pod may be of the pool the claim left, which takes it back
// (queueOrphans). It is not taken into the pool: only a listing says
// which pool a pod is of, so it is never free here. Any other entry stays
// a stray, which the claim's next write drops.
func (r *round) found(find map[string][]*claimInfo, names []string, reads []*podGet) {
	for i, rd := range reads {
		name, pod := names[i], &rd.pod
		if rd.err != nil {
			if !apierrors.IsNotFound(rd.err) {
				r.errs = append(r.errs, fmt.Errorf("pool %s: pod %s: %w: %w", r.p.name, name, ErrRead, rd.err))
			}
			continue
		}
		h, ok := parseMark(r.p.name, pod.Annotations[r.a.cfg.markKey])
		if !ok {
			continue
		}
		for _, ci := range find[name] {
			if ci.uid() != h.UID || !slices.Contains(ci.strays(), name) || r.p.heldPod(ci, name) != nil {
				continue
			}
			pi := r.p.pods.Get(name)
			if pi != nil && (pi.present || r.p.holderOf(pi) != nil || pi.reservedBy() != nil || pi.settling() != nil || pi.uid() != "" && pi.uid() != pod.UID) {
				continue // known here otherwise: left to the listing
			}
			pi = r.p.podOrNew(name)
			// Its version too: a lagging listing showing an older one
			// must not undo what the live read showed.
			pi.setUID(pod.UID)
			pi.rv = pod.ResourceVersion
			pi.mark, pi.markOwn, pi.markRV = r.p.markString(pod.Annotations[r.a.cfg.markKey]), false, rvNum(pod.ResourceVersion)
			if r.allocate(ci, name) {
				r.removeStray(ci, name)
			}
		}
	}
}

// resolveMark decides what a pod's mark means when the claim it names
// does not hold the pod as far as the allocator knows.
func (r *round) resolveMark(pi *podInfo) {
	p := r.p
	if !r.marks() || !pi.present || p.pods.Get(pi.name()) != pi {
		return
	}
	if pi.mark == "" {
		// The mark is gone: whoever removed it settled the pod, and no
		// record may list it any more; or a held pod lost its mark, and
		// is of uncertain use.
		if pi.settling() != nil {
			r.endSettle(pi)
		}
		if ci := pi.reservedBy(); ci != nil {
			p.endActive(pi)
			p.dirty[ci] = struct{}{}
		}
		if ci := p.holderOf(pi); ci != nil && ci != unknownHolder && p.tomark[pi.name()] != ci.uid() {
			// Another allocator may have settled the pod: recorded it
			// released in a record newer than the one known here, then
			// unmarked it. The claim is read live before anything is
			// done: if its record still lists the pod, the mark was
			// removed by hand and the pod is of uncertain use.
			r.confirmLater(ci, pi.name())
		}
		return
	}
	h, ok := parseMark(p.name, pi.mark)
	if !ok {
		return // not a mark of ours: the pod stays out of the pool
	}
	if ci := p.holderOf(pi); ci != nil {
		if ci.uid() == h.UID || ci == unknownHolder || p.overruled(pi, ci) {
			return
		}
		// Marked for another claim: what we believed of ci is stale. Its
		// record, as known, still lists the pod: a stray entry.
		r.drop(ci, pi)
		if ci.listed {
			r.addStray(ci, pi.name())
		}
	}
	if pi.reservedBy() != nil {
		if pi.reservedBy().uid() == h.UID {
			return
		}
		p.endActive(pi)
	}
	if pi.settling() != nil {
		if pi.settling().uid() == h.UID {
			return
		}
		r.endSettle(pi)
	}
	if e, ok := p.unmark[pi.name()]; ok && e.uid == h.UID {
		return
	}
	ci := p.claims.Get(string(h.UID))
	if ci == nil {
		ci = &claimInfo{more: &claimMore{since: r.now}}
		ci.setIdent(p, h.Claim.Name, h.UID) // parseMark: the pool's namespace
		p.claims.Set(ci)
		p.addClaim(ci)
	}
	if p.heldPod(ci, pi.name()) != nil {
		return
	}
	if !ci.listed && ci.recRV == 0 {
		// Marked for a claim this pool does not list and whose record it
		// never read: deleted, force-deleted, moved to another pool, or
		// not in a lagging listing yet. It is handled like a claim that
		// left the pool. A claim whose record is known (listed before,
		// missing from this listing) is judged by that record below, as
		// a listed one is: a mark newer than the record may be a
		// hand-out in flight, not a holding. A newer record of another
		// claim that lists the pod (WithPodMarkMigration) wins only once
		// a live read shows that the claim the mark names no longer holds
		// it (queueOrphans): such a claim may hold it from another pool,
		// and a claim's resourceVersion moves on with any change, not
		// only its record's.
		p.dirty[ci] = struct{}{}
		r.allocate(ci, pi.name())
		return
	}
	if slices.Contains(ci.strays(), pi.name()) && r.takeName(ci, pi.name(), podRead) {
		// Its record lists the pod, which was not free when the record
		// was taken in (settling for another claim, or an older pod under
		// the name): now its mark says it is the claim's.
		r.removeStray(ci, pi.name())
		return
	}
	if ci.recRV != 0 && ci.recRV > pi.markRV {
		if r.newerRecordWins(pi) {
			return
		}
		r.startSettle(ci, pi)
		return
	}
	// The mark is newer than the record known: a hand-out may be in flight.
	r.reserveFor(ci, pi)
}

// newerRecordWins gives pi, under WithPodMarkMigration, to the listed
// claim whose record lists it as held and is newer than pi's mark, when
// the claim the mark names does not hold it; the pod is then marked for
// that claim. It reports whether it did.
//
// Such a record was written by something other than poolalloc, which
// writes a record listing a pod only while the pod is marked for that
// claim and removes a mark only once a newer version of the record no
// longer lists the pod: a claim version newer than the mark that lists
// the pod was edited after poolalloc let it go. That is what an
// OpenSandbox controller run in between does (see WithOpenSandbox): it
// knows nothing of marks and hands pods out by the records alone. Since a
// pod's resourceVersion bounds its mark's age only from above, a pod
// changed since it was marked (its status, say) makes the record look no
// newer, and the mark's claim settles the pod as usual.
func (r *round) newerRecordWins(pi *podInfo) bool {
	winner := r.newerRecord(pi)
	if winner == nil {
		return false
	}
	r.removeStray(winner, pi.name())
	if !r.allocate(winner, pi.name()) {
		return false
	}
	r.p.tomark[pi.name()] = winner.uid()
	if r.p.overrule == nil {
		r.p.overrule = make(map[string]string)
	}
	r.p.overrule[pi.name()] = pi.mark
	return true
}

// newerRecord is the claim newerRecordWins would give pi to, nil if none.
func (r *round) newerRecord(pi *podInfo) *claimInfo {
	if !r.a.cfg.markMigrate || pi.markRV == 0 {
		return nil
	}
	if r.strayIdx == nil {
		// Built once a round: which claims' records list a pod they do not
		// hold. A stray added later in the round is not in it, and the
		// rule then waits for the next round.
		r.strayIdx = make(map[string][]*claimInfo)
		for ci := range r.p.claims.All() {
			for _, name := range ci.strays() {
				r.strayIdx[name] = append(r.strayIdx[name], ci)
			}
		}
	}
	var winner *claimInfo
	for _, ci := range r.strayIdx[pi.name()] {
		if !ci.listed || ci.recRV <= pi.markRV || !slices.Contains(ci.strays(), pi.name()) {
			continue
		}
		if winner != nil {
			return nil // listed by two: neither record is believed
		}
		winner = ci
	}
	return winner
}

// reserveFor reserves pi for ci for a quarantine: it is marked for ci and
// a write listing it may still land (or a newer record list it).
func (r *round) reserveFor(ci *claimInfo, pi *podInfo) {
	r.p.reserve(pi, ci, r.now.Add(r.a.cfg.quarantine))
}

// confirmLater asks for ci to be read live before its record's entry for
// an unmarked pod is acted on.
func (r *round) confirmLater(ci *claimInfo, name string) {
	if r.confirm == nil {
		r.confirm = make(map[*claimInfo][]string)
	}
	r.confirm[ci] = append(r.confirm[ci], name)
}

// confirmJob is a claim whose record lists unmarked pods, read live.
type confirmJob struct {
	ci    *claimInfo
	names []string
	read  *claimGet
}

// confirmCalls returns the claims whose records list unmarked pods, with
// the live reads of them, for confirmed.
func (r *round) confirmCalls() []*confirmJob {
	var jobs []*confirmJob
	for ci, names := range r.confirm {
		jobs = append(jobs, &confirmJob{ci: ci, names: names, read: r.claimGet(ci, ci.object())})
	}
	r.confirm = nil
	slices.SortFunc(jobs, func(x, y *confirmJob) int { return compareNames(x.ci, y.ci) })
	return jobs
}

// confirmClaims reads live the claims whose records list unmarked pods,
// and acts on the entries the live record still lists.
func (r *round) confirmClaims() {
	if len(r.confirm) == 0 {
		return
	}
	jobs := r.confirmCalls()
	var e effects
	for _, j := range jobs {
		e.claimReads = append(e.claimReads, j.read)
	}
	r.exec(&e)
	r.confirmed(jobs)
}

// confirmed takes in the live reads of claims whose records list unmarked
// pods, and acts on the entries the live record still lists.
func (r *round) confirmed(jobs []*confirmJob) {
	var stale []staleUnmarked
	defer func() { r.unmarkedRead(stale) }()
	for _, j := range jobs {
		var held []string
		err := j.read.err
		if err == nil {
			var rec syncer.Record
			if rec, err = r.a.cfg.syncer.Read(j.read.obj); errors.Is(err, syncer.ErrMalformedRelease) {
				err = nil
			}
			held = rec.Held()
		}
		if err != nil {
			if !apierrors.IsNotFound(err) {
				r.errs = append(r.errs, r.claimErr(j.ci, fmt.Errorf("%w: %w", ErrRead, err)))
			}
			for _, name := range j.names {
				pi := r.p.heldPod(j.ci, name)
				switch {
				case pi == nil || !pi.present || pi.mark != "":
				case apierrors.IsNotFound(err):
					// The claim is gone: its pod is recycled as if its
					// record still listed it (whoever handed it out).
					r.p.tomark[pi.name()] = j.ci.uid()
					if !r.a.cfg.markMigrate {
						r.startRecycling(j.ci, pi)
					}
				default:
					// Still held, and read again next round: until then
					// it is not handed out, and no write keeps it.
					r.p.promoted = append(r.p.promoted, pi)
				}
			}
			continue
		}
		var taken []string
		for _, name := range j.names {
			if pi := r.p.heldPod(j.ci, name); pi != nil && pi.present && pi.mark == "" {
				listed := slices.Contains(held, name)
				if listed && rvNum(pi.rv) < rvNum(j.read.obj.GetResourceVersion()) {
					// The record read is newer than the pod as known: a
					// record lists a pod only once its mark names the
					// claim, so the pod may have been marked for it
					// since (given back and handed to it again, seen on
					// a lagging listing in between). It is read live
					// before it is taken to have lost its mark.
					stale = append(stale, staleUnmarked{j.ci, pi})
					continue
				}
				r.lostMark(j.ci, pi, listed)
				continue
			}
			if slices.Contains(held, name) && slices.Contains(j.ci.strays(), name) && r.p.heldPod(j.ci, name) == nil &&
				r.takeName(j.ci, name, podRead|claimRead) {
				taken = append(taken, name)
			}
		}
		if len(taken) > 0 {
			r.setStrays(j.ci, slices.DeleteFunc(slices.Clone(j.ci.strays()), func(n string) bool { return slices.Contains(taken, n) }))
		}
	}
}

// staleUnmarked is a pod held by ci, unmarked as known, that ci's record
// read live lists and is newer than.
type staleUnmarked struct {
	ci *claimInfo
	pi *podInfo
}

// unmarkedRead reads the stale pods live and decides on them as known
// then: still unmarked, each has lost its mark (lostMark); marked, its
// mark is looked at again. A pod whose read fails stays as it is, held,
// until a later round.
func (r *round) unmarkedRead(stale []staleUnmarked) {
	if len(stale) == 0 {
		return
	}
	names := make([]string, len(stale))
	for i, s := range stale {
		names[i] = s.pi.name()
	}
	for i, rd := range r.readPods(names) {
		s := stale[i]
		switch {
		case apierrors.IsNotFound(rd.err):
			r.podGone(s.pi.name(), s.pi)
		case rd.err != nil:
			r.errs = append(r.errs, fmt.Errorf("pool %s: pod %s: %w: %w", r.p.name, s.pi.name(), ErrRead, rd.err))
			continue
		default:
			r.observePod(&rd.pod)
		}
		switch now := r.p.pods.Get(s.pi.name()); {
		case now == s.pi && s.pi.present && s.pi.mark == "" && r.p.holderOf(s.pi) == s.ci:
			r.lostMark(s.ci, s.pi, true)
		case now != nil:
			r.resolveMark(now)
		}
	}
}

// resolvePods runs after the input is taken in (pod marks): pods whose
// records were newer than the pods as known, and pods reserved under the
// allocator's own marks, are read live, then pods whose marks changed are
// looked at.
func (r *round) resolvePods() {
	if !r.marks() {
		return
	}
	// A pod reserved by a write of unknown outcome is handed out when
	// that write is issued again (commit), on the view of it the pool
	// has, which an event source or listing may have left behind (the pod
	// may be terminating now). Its live read fences that: a pod changed
	// since the allocator marked it is no longer taken to carry the
	// allocator's own mark, and is not handed out again on the old write
	// (docs/design.md, "A reserved pod is read before it is handed out
	// again").
	for pi := range r.p.reserved {
		if pi.present && pi.markOwn {
			r.verifyLater(pi, pi.reservedBy())
		}
	}
	// One wave of reads: the pods known older than records that list them
	// or reserved (verify), the pods records list and the listing lacks
	// (find), the claims whose records list unmarked pods (confirm); then
	// their outcomes are taken in, in that order.
	verify, vpods, vreads := r.verifyCalls()
	find, fnames, freads := r.findCalls()
	confirm := r.confirmCalls()
	e := effects{podReads: slices.Concat(vreads, freads)}
	for _, j := range confirm {
		e.claimReads = append(e.claimReads, j.read)
	}
	r.exec(&e)
	r.verified(verify, vpods, vreads)
	r.found(find, fnames, freads)
	r.confirmed(confirm)
	r.adoptIncarnations()
	check := append(r.check, r.p.promoted...)
	r.check, r.p.promoted = nil, nil
	for _, pi := range check {
		pi.mark = r.p.markString(pi.mark) // its claim may be in now
		r.resolveMark(pi)
	}
	// Taking those in, and resolveMark, may ask for claims to be read
	// live: a second wave.
	r.confirmClaims()
}

// adoptIncarnations moves a claim's holding from a pod that is gone to the
// new pod under its name when the new pod's mark names the claim and the
// claim's record that lists the name was written after that mark: the
// record refers to the new pod (a record lists a pod only once its mark
// names the claim). Without this the claim would lose a pod it holds:
// the old pod is gone, and the new one would look marked for a claim that
// does not hold it. Found by the many-allocator machine: a lagging
// listing showed the old pod, the claim's record the new one.
func (r *round) adoptIncarnations() {
	p := r.p
	for _, old := range r.incarnations {
		next := old.nextPod()
		if next == nil || !next.present || old.present || p.pods.Get(old.name()) != old {
			continue
		}
		ci := p.holderOf(old)
		if ci == nil || ci == unknownHolder || old.recycling() || old.reservedBy() != nil || old.settling() != nil {
			continue
		}
		if next.markUID(p.name) != ci.uid() || next.markRV == 0 || next.markRV >= ci.recRV {
			continue
		}
		p.dropPod(old) // next takes the entry, which the store says ci holds
	}
	r.incarnations = nil
}

// lostMark acts on a held pod whose mark is gone, once the claim was read
// live: if the live record lists the pod, the mark was removed by hand
// and the pod is of uncertain use: it is marked for ci again, and
// recycled before anyone else gets it (unless WithPodMarkMigration).
// Otherwise a newer record no longer lists it and whoever wrote that
// record settled it: ci does not hold it.
//
// The allocator that handed the pod to ci itself, in this process, and
// has held it for ci since (podInfo.handed), knows the record is its own:
// it marks the pod again and ci keeps it. That is safe: the mark is
// written under the pod's resourceVersion as listed, unmarked, and no
// other allocator can have handed the pod out without marking it first.
// After a restart the record alone is not believed.
func (r *round) lostMark(ci *claimInfo, pi *podInfo, listed bool) {
	if !listed {
		r.drop(ci, pi)
		return
	}
	r.p.tomark[pi.name()] = ci.uid()
	if !r.a.cfg.markMigrate && !pi.handed {
		r.startRecycling(ci, pi)
	}
}

// errNoProto: a claim known only from a pod's mark cannot be read live
// before any claim of the pool was listed, as its Go type is unknown.
var errNoProto = errors.New("no claim of the pool was listed yet, so the claim's type is unknown")

// protoFor returns an object of the pool's claim type with ci's namespace
// and name, to read ci live. Nil before any claim of the pool was listed.
func (p *pool) protoFor(ci *claimInfo) client.Object {
	proto := p.proto
	if proto == nil {
		proto = p.anyProto()
	}
	if proto == nil {
		return nil
	}
	o, ok := proto.DeepCopyObject().(client.Object)
	if !ok {
		return nil
	}
	o.SetNamespace(ci.name().Namespace)
	o.SetName(ci.name().Name)
	o.SetUID(ci.uid())
	o.SetResourceVersion("")
	return o
}
