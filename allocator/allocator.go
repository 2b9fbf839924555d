package allocator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/internal/index"
	"github.com/poolalloc/poolalloc/store"
	"github.com/poolalloc/poolalloc/syncer"
)

// Claim is one claim of a round's input: the object as the caller listed it
// (a typed CRD or *unstructured.Unstructured) and what it asks for, read by
// the caller from its own API.
type Claim struct {
	// Object is the claim. Its namespace must be the pool's; its UID,
	// resourceVersion, creation and deletion timestamps and annotations are
	// read. It is never modified.
	Object client.Object
	// Want is the number of pods the claim wants to hold. Want and
	// Priority are read in every round that lists the claim, also when the
	// object is unchanged since the last: they may come from anywhere (the
	// object, another resource, a policy). They are not read from an object
	// older than the newest version of the claim the allocator knows (from
	// its own writes or an earlier listing): a lagging cache's stale copy
	// must not hand out or take back pods (docs/design.md I7). Such a claim keeps
	// the Want and Priority last read until a listing shows that version or
	// a newer one.
	Want int
	// Priority orders claims when the pool is short: higher first.
	Priority int32
	// Placement is where the claim's pods may run and how they are handed
	// to it (docs/design.md §6, "Placement"): a label selector on the
	// pool's pods, the class its unmet demand is reported under
	// (Result.ShortfallByClass), a topology layout (TopologyDefault takes
	// the pool's, WithTopology), and all or nothing (Gang). It is read
	// like Want: in every round that lists the claim, not from an object
	// older than the newest version known. The claim never gets a pod its
	// selector does not match, by the pod's labels as the round's listing
	// shows them; a pod it holds that stops matching (the selector or the
	// pod's labels changed) is given back and recycled, as if its owner
	// released it.
	Placement algorithm.Placement
}

// Input is what a round works on: a pool, its pods and its claims, as the
// caller lists them, in any order. A listing may come from a lagging
// informer cache, whose lists come out in a new order every time (such a
// listing costs a round more than one in a fixed order: see the README,
// Performance). The round changes nothing of the input.
type Input struct {
	// Pool names the pool. Its namespace is the namespace of all its pods
	// and claims.
	Pool types.NamespacedName
	// Pods are all the pool's pods. A held pod missing from the list is
	// reported lost.
	Pods []corev1.Pod
	// Claims are all the claims that reference the pool. A claim holding
	// pods of the pool that is missing from the list (deleted, force-deleted,
	// or moved to another pool) gives them all back through recycling.
	Claims []Claim
}

// Changes is what changed in a pool since the caller's last Round or
// Update: the input of Update for a caller that follows the pool through
// informer events instead of listing it whole every time.
type Changes struct {
	// Pool names the pool.
	Pool types.NamespacedName
	// Pods are pods added or changed.
	Pods []corev1.Pod
	// DeletedPods are names of pods that left the pool.
	DeletedPods []string
	// Claims are claims added or changed. An unchanged claim may be
	// passed again; it costs a map lookup.
	Claims []Claim
	// DeletedClaims are UIDs of claims that were deleted or no longer
	// reference the pool; the pods they hold are given back.
	DeletedClaims []types.UID
}

// LostPod is a pod a claim holds that is missing from the pool's listing or
// no longer ready.
type LostPod struct {
	Claim types.NamespacedName
	UID   types.UID
	Pod   string
	// Missing is true when the pod is not in the listing, false when it is
	// there but not ready.
	Missing bool
}

// Result reports what a round did and what the pool looks like after it.
type Result struct {
	Pool types.NamespacedName
	// Allocated lists pods handed out in this round, per claim; each one's
	// record write succeeded.
	Allocated []algorithm.Grant
	// Released lists pods whose recycling finished and whose release was
	// recorded in this round, per claim: they are free again.
	Released []algorithm.Grant
	// Recycling lists pods given back and not yet recycled, sorted.
	Recycling []string
	// Lost lists held pods that are missing or not ready.
	Lost []LostPod
	// Idle lists the ready pods no claim holds, in no particular order,
	// but for a pool that packs (WithTopology with TopologyPack): then the
	// pods on the nodes with the fewest pods in use come first, so that a
	// caller scaling the pool down deletes idle pods from the front and
	// empties nodes. Round fills it; Update leaves it nil, as listing them
	// costs the pool's size.
	Idle []string
	// IdleCount is the number of idle pods.
	IdleCount int
	// Held is the number of pods claims hold, those being recycled and
	// lost included.
	Held int
	// Starting is the number of the pool's pods that are not ready yet and
	// may still serve the shortfall: listed, never seen Ready by this
	// allocator, not terminating, not Succeeded or Failed, and held,
	// marked, reserved or recycled for no claim. A caller that creates
	// pods for the Shortfall creates Shortfall - Starting of them (never
	// fewer than none). Pods that are unready because a claim holds them,
	// that are on their way out, or that were Ready and are not any more
	// (broken, or restarted by a recycler) do not count: counting a broken
	// pod would have the caller wait for it for ever. An allocator that
	// restarted has not seen a broken pod Ready: until it does, such a
	// pod counts.
	Starting int
	// Warnings are what the round found wrong with claims and dealt with
	// itself, each a *ClaimError or an error naming the pod, matching its
	// sentinel: a record that differs from what its claim holds
	// (ErrUntrustedRecord; it is rewritten, an unmarked pod it lists is
	// recycled first), an owner's release list that cannot be read
	// (ErrInvalidRelease; ignored for that claim), a mark removal that lost
	// a race and is retried next round (ErrWrite). They are not errors of
	// the round: a caller need not requeue for them. Report them to the
	// claim's owner (an event, say).
	Warnings []error
	// Shortfall is how many more pods the pool must create to meet the
	// demand of its live claims. Pods on their way to a claim (reserved by
	// a hand-out whose write had an unknown outcome or may still be in
	// flight) are not in it: they exist, and go to the claim or back to
	// the pool. Such a pod that is terminating, finished or missing is in
	// it: it never serves, wherever it goes. A gang waiting for such pods to settle is the exception:
	// all it lacks is counted, though idle pods may serve it once they
	// have settled.
	Shortfall int
	// ShortfallByClass is Shortfall by the claims' Placement.Class: for
	// each class with unmet demand, how many pods of that class to create
	// (claims without a class under ""). Nil when Shortfall is 0. Starting
	// is not split by class: a caller that creates pods per class counts
	// its own pods of each class that are not Ready yet.
	ShortfallByClass map[string]int

	// reported is set once the round filled the fields that describe the
	// pool (WithMetrics sets its gauges from them only then).
	reported bool
}

// Allocator hands out the pods of pools to claims and records every
// hand-out on the claims.
//
// It is safe for concurrent use. Rounds on one pool are serialized; rounds
// on different pools run in parallel.
type Allocator interface {
	// Round plans and commits one allocation round for in.Pool. The first
	// round of a pool rebuilds the pool's allocations from the claims'
	// records. The Result is valid also when err is non-nil: err then says
	// what did not happen (a claim whose write failed, a recycle that
	// failed, a pool blocked by an unreadable record), and the caller
	// should run another round later. What the round dealt with itself is
	// in Result.Warnings, not in err.
	//
	// A ctx already ended makes Round return its error (errors.Is with
	// context.Canceled or context.DeadlineExceeded) and change nothing. A
	// ctx that ends during the round stops it before its writes if they
	// have not begun; writes already in flight fail with it and count as
	// writes of unknown outcome, which later rounds settle. Round logs
	// through logr.FromContextOrDiscard(ctx): nothing at the default
	// level, each warning at V(2), a one-line summary at V(4), and each
	// claim's hand-outs, releases and lost pods at V(5).
	Round(ctx context.Context, in Input) (Result, error)

	// Update is Round for a caller that tracks what changed: it applies
	// the changes to what the allocator last saw of the pool and runs a
	// round whose cost grows with the changes and the claims still
	// waiting, not with the pool. The pool's first round must be a Round,
	// which recovers the pool from a complete listing; Update before that
	// is ErrInvalidInput. ctx and logging are as for Round.
	Update(ctx context.Context, ch Changes) (Result, error)

	// Record decodes claim's record as the allocator reads it, with its
	// syncer (WithKeys, WithSyncer) and without an API call: the pods it
	// holds (Record.Held), those it released, and its owner's release
	// request. Errors are those of syncer.AllocationSyncer.Read.
	Record(claim client.Object) (syncer.Record, error)

	// ForgetPool drops everything known about a pool that was deleted. A
	// pool created again under the same name starts empty. It waits for a
	// round in progress on that pool to finish; a call that waited for the
	// pool meanwhile runs on the pool created anew. With WithMetrics it
	// deletes the pool's gauges; no call that raced it sets them again.
	ForgetPool(pool types.NamespacedName) error

	// Store returns the store the allocator keeps its index of holdings
	// in, read-only: only the allocator changes holdings, and only after
	// the records on the API server say so.
	Store() store.Reader
}

// New returns the default Allocator. The client writes claims' records and
// is used by the default syncer; it may be nil when WithSyncer is given.
func New(c client.Client, opts ...Option) (Allocator, error) {
	cfg, err := newConfig(c, opts)
	if err != nil {
		return nil, err
	}
	return &defaultAllocator{
		protoObj:   cfg.claimType,
		cfg:        cfg,
		pools:      make(map[types.NamespacedName]*pool),
		claimPools: index.New(claimUID, 0),
	}, nil
}

var _ Allocator = (*defaultAllocator)(nil)

type defaultAllocator struct {
	cfg *config

	// mu guards pools and claimPools. It is taken after a pool's mu, never
	// before, and held only for map access.
	mu    sync.Mutex
	pools map[types.NamespacedName]*pool
	// claimPools records, for each claim holding pods, its entry in a pool
	// where it holds them (only its UID and pool are read here), and
	// morePools its entries in the other pools, for the rare claim that
	// holds pods in several. A claim moved from pool A to pool B is served
	// in B only when it holds nothing in A any more.
	claimPools index.Index[*claimInfo]
	morePools  map[types.UID][]*claimInfo

	// protoMu guards protoObj: a claim listed in some pool, whose Go type
	// and kind serve to read claims known only from pod marks in pools
	// that have listed none.
	protoMu  sync.Mutex
	protoObj client.Object
}

func (a *defaultAllocator) proto() client.Object {
	a.protoMu.Lock()
	defer a.protoMu.Unlock()
	return a.protoObj
}

func (a *defaultAllocator) setProto(o client.Object) {
	a.protoMu.Lock()
	defer a.protoMu.Unlock()
	if a.protoObj == nil {
		a.protoObj = o
	}
}

func (a *defaultAllocator) Store() store.Reader { return readOnly{a.cfg.store} }

func (a *defaultAllocator) Record(claim client.Object) (syncer.Record, error) {
	return a.cfg.syncer.Read(claim)
}

// readOnly hides the writer half of the store: asserting the value Store
// returns to a writer fails.
type readOnly struct{ r store.Reader }

var _ store.Reader = readOnly{}

func (s readOnly) HolderOf(pool types.NamespacedName, pod string) (store.Holder, bool, error) {
	return s.r.HolderOf(pool, pod)
}
func (s readOnly) Held(pool types.NamespacedName, uid types.UID) ([]string, error) {
	return s.r.Held(pool, uid)
}
func (s readOnly) Count(pool types.NamespacedName, uid types.UID) (int, error) {
	return s.r.Count(pool, uid)
}
func (s readOnly) Holders(pool types.NamespacedName) ([]store.Holder, error) {
	return s.r.Holders(pool)
}
func (s readOnly) Snapshot(pool types.NamespacedName) (map[string]store.Holder, error) {
	return s.r.Snapshot(pool)
}
func (s readOnly) Pools() ([]types.NamespacedName, error) { return s.r.Pools() }

// lookupPool returns the pool's state, nil if the allocator has none.
func (a *defaultAllocator) lookupPool(name types.NamespacedName) *pool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pools[name]
}

func (a *defaultAllocator) getPool(name types.NamespacedName) *pool {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pools[name]
	if p == nil {
		p = a.newPool(name)
		a.pools[name] = p
	}
	return p
}

func (a *defaultAllocator) ForgetPool(name types.NamespacedName) error {
	for {
		p := a.lookupPool(name)
		if p == nil {
			break
		}
		p.mu.Lock()
		if p.dead {
			p.mu.Unlock()
			continue
		}
		// The store is emptied and the pool dropped under the pool's lock,
		// before it leaves the map: a round that looked it up waits, then
		// finds it dead and starts from a new pool; none runs on what is
		// dropped here.
		err := a.forget(p)
		p.mu.Unlock()
		return err
	}
	return a.forget(&pool{name: name})
}

// forget empties the store and the metrics of pool p, whose lock the
// caller holds (or that no one else knows), and drops it.
func (a *defaultAllocator) forget(p *pool) error {
	if err := a.cfg.store.DeletePool(p.name); err != nil {
		return fmt.Errorf("pool %s: forget: %w", p.name, storeErr(err))
	}
	if m := a.cfg.metrics; m != nil {
		m.forget(p.name)
	}
	a.drop(p, false)
	return nil
}

// drop makes the allocator forget the state of pool p, whose lock the
// caller holds: p is marked dead, so that a call waiting for its lock
// looks the pool up again, and the next Round starts a new pool, which
// recovers from the records and marks. What the store holds for the pool
// is left for that recovery to replace.
//
// With emptyStore, what the store holds for the pool goes too: the new
// pool's first Round would otherwise meet holders it does not know before
// its recovery empties the store (which it does anyway, and reports an
// error then if the store cannot).
func (a *defaultAllocator) drop(p *pool, emptyStore bool) {
	p.dead = true
	if emptyStore {
		_ = a.cfg.store.DeletePool(p.name)
	}
	for c := range p.claims.All() {
		a.setHolds(c, false)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pools[p.name] == p {
		delete(a.pools, p.name)
	}
}

// finish ends a call on pool p, whose lock the caller holds, with the
// call's error err: a pool whose state broke the diagram, whose store
// failed, or, with WithInvariantChecks, that fails its self-check, fails
// closed (docs/design.md, "Failure").
func (a *defaultAllocator) finish(p *pool, err error) error {
	fail := p.violation
	p.violation = nil
	merr := p.checkMoved()
	serr := p.takeStoreErr()
	if serr != nil && !errors.Is(err, ErrStore) {
		err = errors.Join(err, serr)
	}
	if fail == nil && merr != nil && serr == nil {
		fail = merr // (a store that fails makes passive states unknowable)
	}
	if fail == nil && a.cfg.checks && p.recovered {
		if cerr := p.checkInvariants(a); cerr != nil {
			fail = fmt.Errorf("pool %s: %w: %w", p.name, ErrInconsistent, cerr)
		}
	}
	if fail == nil && !errors.Is(err, ErrStore) {
		return err
	}
	if fail != nil && !errors.Is(err, ErrInconsistent) {
		err = errors.Join(err, fail)
	}
	a.drop(p, true)
	return err
}

// setHolds records whether the claim of ci holds pods in ci's pool.
func (a *defaultAllocator) setHolds(ci *claimInfo, holds bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.setHoldsLocked(ci, holds)
}

// setHoldsLocked is setHolds for a caller holding a.mu.
func (a *defaultAllocator) setHoldsLocked(ci *claimInfo, holds bool) {
	uid, name := ci.uid(), ci.pool.name
	first := a.claimPools.Get(string(uid))
	more := a.morePools[uid]
	inPool := func(e *claimInfo) bool { return e.pool.name == name }
	if holds {
		switch {
		case first == nil || inPool(first):
			a.claimPools.Set(ci)
		case !slices.ContainsFunc(more, inPool):
			if a.morePools == nil {
				a.morePools = make(map[types.UID][]*claimInfo)
			}
			a.morePools[uid] = append(more, ci)
		}
		return
	}
	switch {
	case first == nil:
		return
	case inPool(first) && len(more) == 0:
		a.claimPools.Del(string(uid))
		return
	case inPool(first):
		a.claimPools.Set(more[0])
		more = more[1:]
	default:
		more = slices.DeleteFunc(more, inPool)
	}
	if len(more) == 0 {
		delete(a.morePools, uid)
	} else {
		a.morePools[uid] = more
	}
}

// heldElsewhere returns a pool other than name where claim uid holds pods.
func (a *defaultAllocator) heldElsewhere(uid types.UID, name types.NamespacedName) (types.NamespacedName, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.heldElsewhereLocked(uid, name)
}

// heldElsewhereLocked is heldElsewhere for a caller holding a.mu.
func (a *defaultAllocator) heldElsewhereLocked(uid types.UID, name types.NamespacedName) (types.NamespacedName, bool) {
	if first := a.claimPools.Get(string(uid)); first != nil && first.pool.name != name {
		return first.pool.name, true
	}
	for _, other := range a.morePools[uid] {
		if other.pool.name != name {
			return other.pool.name, true
		}
	}
	return types.NamespacedName{}, false
}

// pool is the allocator's state for one pool. mu serializes rounds on the
// pool and guards every field.
type pool struct {
	name types.NamespacedName
	// store is the index of holdings, the allocator's (see holderOf).
	store store.AllocationStore

	mu sync.Mutex
	// recovered is set once the pool's allocations were rebuilt from the
	// claims' records.
	recovered bool
	// gen counts rounds; objects seen in a round carry its gen (see
	// podSeen and claimSeen).
	gen  uint64
	pods index.Index[*podInfo]
	// podSeen lists every podInfo of the pool, the entries of pods and the
	// newer pods waiting in their next, each at its podInfo.idx with the
	// gen of the round that last listed it. A round finds the pods missing
	// from its listing by scanning this array, not the podInfos. Every
	// podInfo in it but the waiting ones is the entry of pods under its
	// name; every claimInfo in claimSeen the entry of claims under its UID.
	podSeen seenList[*podInfo]
	// claimSeen does the same for the claims of claims (claimInfo.idx).
	claimSeen seenList[*claimInfo]
	// podRefs and claimRefs find stamps of podSeen and claimSeen by their
	// refs; unordered is what scan reuses from round to round for a
	// listing in no order (scanUnordered).
	podRefs, claimRefs refTable
	unordered          unorderedScratch
	// free holds the candidates: present, ready, unheld, not reserved
	// pods. Order is arbitrary but deterministic given the history; each
	// podInfo knows its index for O(1) removal.
	free []freePod
	// nStarting counts the pods in stateStarting.
	nStarting int
	// nHeldPods counts the pods the store says the pool's claims hold
	// (round.hold and round.unhold follow every change of the store).
	nHeldPods int
	// arrivals is the next claimInfo.arrival; arrived are the claims
	// added since orderArrivals last ran.
	arrivals uint32
	arrived  []*claimInfo
	// offer is the copy of free handed to the algorithm, kept to reuse
	// its memory.
	offer  []algorithm.Candidate
	claims index.Index[*claimInfo]
	// forgotten holds the newest resourceVersion of claims that left the
	// pool holding nothing, so that a lagging listing showing one again
	// is not taken for a new claim. It is cleared when it grows large.
	forgotten map[types.UID]uint64
	// proto is a claim of the pool as listed: its Go type and kind are
	// used to read claims known only from pod marks.
	proto client.Object
	// kinds are the Go types and kinds of the pool's claims (claimMeta).
	kinds []*claimKind
	// anyProto returns a claim listed in any pool, when this pool has none.
	anyProto func() client.Object

	// dirtyPeak is the largest size of dirty since it was last rebuilt.
	dirtyPeak int

	// The sets below let a round visit only what may change, never the
	// whole pool. Those of pods are keyed by the incarnation, and setState
	// alone changes them (docs/design.md, "The pod state").

	// dirty holds the claims whose holdings may change: changed, short of
	// pods, giving pods back, terminating, orphaned. A claim leaves it
	// once settled.
	dirty map[*claimInfo]struct{}
	// recycling holds the pods in stateRecycling.
	recycling map[*podInfo]struct{}
	// reserved holds the pods in stateReserved.
	reserved map[*podInfo]struct{}
	// lost holds the pods in stateLost.
	lost map[*podInfo]struct{}
	// unmark holds pods whose mark the allocator may remove (WithPodMarks),
	// with the claim UID the mark must still name and what justifies it.
	unmark map[string]unmarkEntry
	// settling holds the pods in stateSettling.
	settling map[*podInfo]struct{}
	// tomark holds held pods recovered from records that carry no mark yet,
	// or whose mark a newer record overrules (see newerRecordWins).
	tomark map[string]types.UID
	// overrule holds, for the pods of tomark whose mark names another
	// claim, that mark: the one value markHeld may replace (nil when
	// empty).
	overrule map[string]string
	// promoted holds pods that took over their name from an older pod
	// with it (dropPod): their marks are looked at in the next round.
	promoted []*podInfo
	// tombs remembers, for a quarantine, the last version of pods whose
	// entries were dropped once they left the pool: a lagging listing that
	// still shows such a pod at that version or older does not bring it
	// back (allocated lazily).
	tombs map[string]podTomb
	// places are the pods' podPlaces by placeKey, those with the same key
	// chained through podPlace.next; placeSeed seeds placeKey, and is set
	// when the pool is made.
	places    map[uint64]*podPlace
	placeSeed maphash.Seed
	// storeErr is the first error the store returned on a read since the
	// last round reported it. The round's concurrent writes read the store
	// too: storeMu guards it.
	storeMu  sync.Mutex
	storeErr error
	// violation is the first move of a pod's state that setState refused
	// in the current round: the pool fails closed.
	violation error
	// moved are the pods whose state changed in the current call, checked
	// at its end (checkMoved). rebuilding is set while recovery rebuilds
	// every pod's state, whose moves checkMoved skips (forgetMoves): they
	// are not recorded.
	moved      []*podInfo
	rebuilding bool
	// dead is set when the pool's state was dropped (ForgetPool, or the
	// pool failed closed): a round that waited for mu looks the pool up
	// again.
	dead bool
	// metrics are the allocator's (WithMetrics), nil without.
	metrics *metrics
}

// overruled reports whether pi, held by ci, waits to be marked for ci over
// the mark it carries (see newerRecordWins).
func (p *pool) overruled(pi *podInfo, ci *claimInfo) bool {
	old, ok := p.overrule[pi.name()]
	return ok && old == pi.mark && p.tomark[pi.name()] == ci.uid()
}

// unknownHolder stands for the holder of a pod when the store could not
// say, or names a claim the pool does not know: the pod is held, by no
// claim the pool can act for.
var unknownHolder = &claimInfo{key: "/", pool: &pool{}}

// holderOf returns the claim holding pi, as the store says: nil when none
// does. Only a pod's entry is ever held, not a newer pod waiting under its
// name.
func (p *pool) holderOf(pi *podInfo) *claimInfo {
	if pi == nil || pi.waiting {
		return nil
	}
	h, ok, err := p.store.HolderOf(p.name, pi.name())
	switch {
	case err != nil:
		p.noteStoreErr(err)
		return unknownHolder
	case !ok:
		return nil
	}
	if ci := p.claims.Get(string(h.UID)); ci != nil {
		return ci
	}
	p.noteStoreErr(fmt.Errorf("store: pod %s is held by %s, which the pool does not know", pi.name(), h))
	return unknownHolder
}

// held returns the pods ci holds, by name, as the store says.
func (p *pool) held(ci *claimInfo) []*podInfo {
	names, err := p.store.Held(p.name, ci.uid())
	if err != nil {
		p.noteStoreErr(err)
		return nil
	}
	if len(names) == 0 {
		return nil
	}
	out := make([]*podInfo, 0, len(names))
	for _, name := range names {
		if pi := p.pods.Get(name); pi != nil {
			out = append(out, pi)
		} else {
			p.noteStoreErr(fmt.Errorf("store: claim %s holds pod %s, which the pool does not know", ci.name(), name))
		}
	}
	return out
}

// nHeld returns how many pods ci holds, as the store says.
func (p *pool) nHeld(ci *claimInfo) int {
	n, err := p.store.Count(p.name, ci.uid())
	if err != nil {
		p.noteStoreErr(err)
		return 0
	}
	return n
}

// noteStoreErr records an error of the store's reader. The round's
// concurrent writes read the store too, so it takes storeMu.
func (p *pool) noteStoreErr(err error) {
	p.storeMu.Lock()
	defer p.storeMu.Unlock()
	if p.storeErr == nil {
		p.storeErr = fmt.Errorf("pool %s: %w: %w", p.name, ErrStore, err)
	}
}

// takeStoreErr returns the store error noted since it was last taken.
func (p *pool) takeStoreErr() error {
	p.storeMu.Lock()
	defer p.storeMu.Unlock()
	err := p.storeErr
	p.storeErr = nil
	return err
}

// podTomb is the last known version of a pod whose entry was dropped.
type podTomb struct {
	uid   types.UID
	rv    uint64
	until time.Time
}

func (p *pool) addPod(pi *podInfo) { p.podSeen.add(pi) }

// removePod forgets the podInfo pi: it leaves the state that counts it. A
// pod no decision concerns may go (a held one only when its hold passes
// to the newer pod under its name, see adoptIncarnations).
func (p *pool) removePod(pi *podInfo) {
	if pi.state.active() {
		p.violate(fmt.Errorf("pod %s (uid %s): forgotten while %s", pi.name(), pi.uid(), pi.state))
	}
	p.setState(pi, stateGone, nil, true)
	p.podSeen.remove(pi)
}
func (p *pool) seePod(pi *podInfo)          { p.podSeen.see(pi, p.gen) }
func (p *pool) podSeenNow(pi *podInfo) bool { return p.podSeen.seenIn(pi, p.gen) }

func (p *pool) addClaim(ci *claimInfo) {
	ci.arrival = p.arrivals
	p.arrivals++
	p.arrived = append(p.arrived, ci)
	p.claimSeen.add(ci)
}

// orderArrivals gives the claims first seen since the last call their
// arrival order: those first seen in an earlier round keep theirs, and
// among those first seen together the claim with the older resourceVersion
// at first sight comes first (created earlier, unless changed since);
// claims with no numeric resourceVersion (known only from pod marks) keep
// the order they were met in, after the others.
func (p *pool) orderArrivals() {
	if len(p.arrived) > 1 {
		// Each claim's key is read once: a recovery brings thousands.
		type keyed struct {
			key uint64
			ci  *claimInfo
		}
		ks := make([]keyed, len(p.arrived))
		for i, ci := range p.arrived {
			ks[i] = keyed{arrivalKey(ci), ci}
		}
		byKey := func(a, b keyed) int { return cmp.Compare(a.key, b.key) }
		if !slices.IsSortedFunc(ks, byKey) {
			nums := make([]uint32, len(p.arrived))
			for i, ci := range p.arrived {
				nums[i] = ci.arrival
			}
			slices.SortStableFunc(ks, byKey)
			for i := range ks {
				ks[i].ci.arrival = nums[i]
			}
		}
	}
	clear(p.arrived)
	if cap(p.arrived) > 64 {
		p.arrived = nil
	} else {
		p.arrived = p.arrived[:0]
	}
}

func arrivalKey(ci *claimInfo) uint64 {
	if n := rvNum(ci.rv); n != 0 {
		return n
	}
	return math.MaxUint64
}
func (p *pool) removeClaim(ci *claimInfo) { p.claimSeen.remove(ci) }
func (p *pool) seeClaim(ci *claimInfo)    { p.claimSeen.see(ci, p.gen) }

func (a *defaultAllocator) newPool(name types.NamespacedName) *pool {
	return &pool{
		name:      name,
		store:     a.cfg.store,
		anyProto:  a.proto,
		pods:      index.New((*podInfo).name, 0),
		claims:    index.New(claimUID, 0),
		dirty:     make(map[*claimInfo]struct{}),
		recycling: make(map[*podInfo]struct{}),
		reserved:  make(map[*podInfo]struct{}),
		lost:      make(map[*podInfo]struct{}),
		unmark:    make(map[string]unmarkEntry),
		settling:  make(map[*podInfo]struct{}),
		metrics:   a.cfg.metrics,
		tomark:    make(map[string]types.UID),
		placeSeed: maphash.MakeSeed(),
	}
}

// podInfo is what the pool knows of a pod, from the listings and its own
// writes; which claim holds it is the store's to say (pool.holderOf).
type podInfo struct {
	// The fields a round reads for every pod of a listing come first.

	// key is the pod's name followed by its UID, one string for the two
	// (see name and uid); nameLen is the length of the name. A pod listed
	// under a known name with another UID is a new pod (see next).
	key string
	rv  string
	// idx is the pod's place in pool.podSeen, freeIdx in pool.free (-1
	// when not there).
	idx, freeIdx   int32
	present, ready bool
	// waiting is set while the pod is an entry's next.
	waiting bool
	// markOwn is set while mark is a value this allocator wrote itself at
	// exactly markRV.
	markOwn bool
	// state is the pod's role, changed by pool.setState alone; the claim
	// it concerns is the store's holder (held, lost) or more.claim
	// (reserved, settling, recycling).
	state podState
	// recycled is set once the recycler reported the pod done (recycling
	// or settling), so that a failed release write does not recycle it
	// twice.
	recycled bool
	// ending is set while the listed pod is terminating or has finished
	// (phase Succeeded or Failed): it will not become ready. wasReady is
	// set once a listing showed the pod ready: not ready again, it is not
	// counted on to serve (stateUnready, not stateStarting).
	ending, wasReady bool

	// place is the pod's node and zone, shared with the pool's other pods
	// there.
	place *podPlace
	// mark is the pod's mark annotation as last seen or written (only with
	// pod marks): "<claim name>/<claim uid>".
	mark string
	// markRV bounds from above the resourceVersion at which the mark got
	// its value: the pod's resourceVersion when the allocator first saw
	// the value, or its own write of it. 0 when unknown or unmarked.
	markRV uint64
	// Which claim holds the pod is the store's to say (pool.holderOf).

	// strays counts the claims whose record lists the pod as held although
	// they do not hold it (a record edited by hand, a pod recreated under
	// the name, a stale record). Such a pod is not a candidate.
	strays  int32
	nameLen uint16 // a pod name has at most maxPodName bytes (checkPod)
	// handed is set while the pod is held by the claim this allocator
	// handed it to (its own record write, in this process): a mark removed
	// by hand is then written again, not taken for a forged record (see
	// lostMark).
	handed bool
	// more is what few pods need, nil when empty: see reservedBy and
	// nextPod.
	more *podMore
	// ref is the name a listing gave the pod (see stamped.listedRef).
	ref string
	// uidRef is empty or the UID string a listing last gave the pod, equal
	// to uid(): a listed UID at its address is the pod's without a read of
	// either string (listedUID; docs/design.md §13).
	uidRef string
}

// podMore is what a podInfo needs only for some pods.
type podMore struct {
	// oldRVs are resourceVersions the pod had before writes of ours: a
	// listing showing one of them is older than what we know.
	oldRVs []string
	// claim is the claim of a reserved, settling or recycling pod
	// (setState). A reserved pod is settled no earlier than reservedUntil
	// (see pool.reserve).
	claim         *claimInfo
	reservedUntil time.Time
	// next is a newer pod under the same name (another UID), waiting for
	// this one to be released: it takes this entry's place then.
	next *podInfo
}

// claim is the claim pi is reserved, settling or recycling for, nil in
// the other states.
func (pi *podInfo) claim() *claimInfo {
	if pi.more == nil {
		return nil
	}
	return pi.more.claim
}

// setClaim sets the claim of pi's active state; setState alone calls it.
func (pi *podInfo) setClaim(ci *claimInfo, until time.Time) {
	if pi.more == nil && ci == nil && until.IsZero() {
		return
	}
	m := pi.edit()
	m.claim, m.reservedUntil = ci, until
	if ci == nil {
		m.reservedUntil = time.Time{}
	}
	pi.tidy()
}

// settling returns the claim pi is being settled for (stateSettling), nil
// if none: marked for that claim, whose record does not list it as held,
// it is recycled for it and recorded as released before the mark is
// removed (docs/design.md I13).
func (pi *podInfo) settling() *claimInfo {
	if pi.state != stateSettling {
		return nil
	}
	return pi.claim()
}

// reservedBy returns the claim pi is reserved for (stateReserved), nil if
// none: a write that may have handed the pod to it has an unknown outcome,
// or another allocator marked it for it.
func (pi *podInfo) reservedBy() *claimInfo {
	if pi.state != stateReserved {
		return nil
	}
	return pi.claim()
}

// recycling reports whether pi is being given back (stateRecycling).
func (pi *podInfo) recycling() bool { return pi.state == stateRecycling }

func (pi *podInfo) nextPod() *podInfo {
	if pi.more == nil {
		return nil
	}
	return pi.more.next
}

func (pi *podInfo) setNextPod(next *podInfo) {
	if pi.more == nil && next == nil {
		return
	}
	pi.edit().next = next
	pi.tidy()
}

// edit returns pi.more to change it, made if need be; tidy lets it go
// again once empty.
func (pi *podInfo) edit() *podMore {
	if pi.more == nil {
		pi.more = &podMore{}
	}
	return pi.more
}

func (pi *podInfo) tidy() {
	if m := pi.more; m != nil && len(m.oldRVs) == 0 && m.claim == nil && m.reservedUntil.IsZero() && m.next == nil {
		pi.more = nil
	}
}

func (pi *podInfo) oldRVs() []string {
	if pi.more == nil {
		return nil
	}
	return pi.more.oldRVs
}

func (pi *podInfo) reservedUntil() time.Time {
	if pi.more == nil {
		return time.Time{}
	}
	return pi.more.reservedUntil
}

// newPodInfo returns the entry of a pod, not in the free list; uid is
// empty when not known.
func newPodInfo(name string, uid types.UID) *podInfo {
	pi := new(podInfo)
	initPodInfo(pi, name+string(uid), len(name))
	return pi
}

// initPodInfo makes pi, a zero entry, the entry of a pod whose key (name,
// then UID) is key, with a name of nameLen bytes.
func initPodInfo(pi *podInfo, key string, nameLen int) {
	pi.key, pi.nameLen, pi.freeIdx = key, uint16(nameLen), -1
}

// name is the pod's name, a part of key.
func (pi *podInfo) name() string { return pi.key[:pi.nameLen] }

// uid is the pod's UID, empty when not known; a part of key.
func (pi *podInfo) uid() types.UID { return types.UID(pi.key[pi.nameLen:]) }

// setUID sets the pod's UID.
func (pi *podInfo) setUID(uid types.UID) {
	if uid != pi.uid() {
		pi.key = pi.name() + string(uid)
		pi.uidRef = ""
	}
}

// listedUID reports whether uid, the UID of a pod listed under pi's name,
// is pi's: by its address first (uidRef), which reads neither string, then
// by content, keeping uid as uidRef when it is. A cache's List copies its
// objects but not their strings, so an unchanged pod's UID is found at
// the same address every time, while its bytes, made when the pod was
// decoded, are far from the listing's order (docs/design.md §13).
func (pi *podInfo) listedUID(uid types.UID) bool {
	if sameString(pi.uidRef, string(uid)) {
		return true
	}
	if pi.uid() != uid {
		return false
	}
	pi.uidRef = string(uid)
	return true
}

// podPlace is where a pod runs.
type podPlace struct {
	node, zone string
	labels     podLabels
	// nodeLabels are the node's labels (WithNodeLabels), nil without.
	nodeLabels podLabels
	// next is another place with the same placeKey.
	next *podPlace
}

// podLabels are a pod's labels as the algorithm sees them
// (algorithm.Candidate.Labels): read-only, shared by the pods of a
// podPlace.
type podLabels map[string]string

// Has implements labels.Labels.
func (l podLabels) Has(key string) bool { _, ok := l[key]; return ok }

// Get implements labels.Labels.
func (l podLabels) Get(key string) string { return l[key] }

// Lookup implements labels.Labels.
func (l podLabels) Lookup(key string) (string, bool) { v, ok := l[key]; return v, ok }

// maxPlaces bounds pool.places.
const maxPlaces = 1 << 14

// placeOf returns the podPlace of node and labels that the pool's pods
// share: pods of one template on one node share one. With nodeLabels
// (WithNodeLabels) a new one reads the node's labels once; its zone is the
// pod's zone label, else the node's. Finding a place the pool has costs no
// allocation.
func (p *pool) placeOf(node string, labels map[string]string, nodeLabels func(string) map[string]string) *podPlace {
	return p.placeAt(p.placeKey(node, labels), node, labels, nodeLabels)
}

// placeAt is placeOf given k, the placeKey of node and labels.
func (p *pool) placeAt(k uint64, node string, labels map[string]string, nodeLabels func(string) map[string]string) *podPlace {
	if pl := p.findPlace(k, node, labels); pl != nil {
		return pl
	}
	return p.addPlace(k, &podPlace{node: node, zone: labels[ZoneLabel], labels: maps.Clone(labels)}, nodeLabels)
}

// findPlace returns the pool's place of node and labels, whose placeKey
// is k, nil if it has none.
func (p *pool) findPlace(k uint64, node string, labels map[string]string) *podPlace {
	for pl := p.places[k]; pl != nil; pl = pl.next {
		if pl.node == node && maps.Equal(pl.labels, podLabels(labels)) {
			return pl
		}
	}
	return nil
}

// addPlace makes pl, a place the pool does not have, whose placeKey is k,
// the pool's, reading its node's labels with nodeLabels if set.
func (p *pool) addPlace(k uint64, pl *podPlace, nodeLabels func(string) map[string]string) *podPlace {
	if p.places == nil || len(p.places) >= maxPlaces {
		p.places = make(map[uint64]*podPlace)
	}
	if nodeLabels != nil && pl.node != "" {
		pl.nodeLabels = maps.Clone(nodeLabels(pl.node))
		if pl.zone == "" {
			pl.zone = pl.nodeLabels[ZoneLabel]
		}
	}
	pl.next = p.places[k]
	p.places[k] = pl
	return pl
}

// placeKey hashes a node and a label set, whatever order the labels come
// in: the sum of a hash of each label's key and value. It only reads the
// pool's seed, and may run on several goroutines at once.
func (p *pool) placeKey(node string, labels map[string]string) uint64 {
	return maphash.String(p.placeSeed, node) + p.labelsKey(labels)
}

// labelsKey is placeKey's hash of a label set.
func (p *pool) labelsKey(labels map[string]string) uint64 {
	var h uint64
	for k, v := range labels {
		h += maphash.String(p.placeSeed, k)*0x9e3779b97f4a7c15 ^ maphash.String(p.placeSeed, v)
	}
	return h
}

// samePlace reports whether pi's place is node and labels.
func (pi *podInfo) samePlace(node string, labels map[string]string) bool {
	return pi.place != nil && pi.place.node == node && maps.Equal(pi.place.labels, podLabels(labels))
}

// labels returns pi's labels, for a selector.
func (pi *podInfo) labels() labels.Labels {
	if pi.place == nil || pi.place.labels == nil {
		return labels.Set(nil)
	}
	return pi.place.labels
}

// freePod is an entry of the free list: the pod's name and place, 24
// bytes; the algorithm gets it as an algorithm.Candidate (candidate).
type freePod struct {
	Name  string
	place *podPlace
}

func (pi *podInfo) freeEntry() freePod { return freePod{Name: pi.name(), place: pi.place} }

func (pi *podInfo) candidateOf() algorithm.Candidate { return pi.freeEntry().candidate() }

// candidate is f as the algorithm sees it.
func (f freePod) candidate() algorithm.Candidate {
	c := algorithm.Candidate{Name: f.Name}
	if pl := f.place; pl != nil {
		c.Node, c.Zone = pl.node, pl.zone
		if pl.labels != nil {
			c.Labels = pl.labels
		}
		if pl.nodeLabels != nil {
			c.NodeLabels = pl.nodeLabels
		}
	}
	return c
}

// candidate reports whether pi is offered to the algorithm (stateFree).
func (p *pool) candidate(pi *podInfo) bool { return pi.state == stateFree }

// claimInfo is what the pool knows of a claim.
type claimInfo struct {
	// The fields a round reads for every claim of a listing come first,
	// within one cache line: uid, rv, meta and obj (known), idx, listed.

	// key is the claim's name and UID as a pod mark names them,
	// "<name>/<uid>": one string for the two, shared with the marks of its
	// pods, the store and the maps keyed by UID (see uid and name).
	key string
	// rv is the newest resourceVersion already processed. A listed object
	// with it, or with an older one, is unchanged or older than obj: its
	// record is not decoded again (see sawRV).
	rv string
	// ver is the newest version of the claim known, nil for a claim known
	// only from its pods' marks: from the listing, a write, or a live read.
	// Writes are based on it. With the annotation syncer it is what
	// writes need of the object (see claimobj.go); otherwise it holds the
	// client.Object itself. object returns it either way.
	ver *claimMeta
	// idx is the claim's place in pool.claimSeen.
	idx int32
	// listed is whether the claim was in the latest listing of this pool.
	listed      bool
	terminating bool
	// rewrite is set when the claim's record differs from what it holds:
	// its next write restores it.
	rewrite bool
	// unsettled is set after a write of unknown outcome, until a write of
	// the claim succeeds: its record may legitimately differ meanwhile.
	unsettled bool

	priority int32
	want     int32
	// arrival orders the claims of the pool by when the allocator first
	// saw them (see pool.orderArrivals): algorithm.Request.Arrival.
	arrival uint32
	// nameLen is the length of the claim's name in key.
	nameLen int32
	// pool is the claim's pool, whose namespace is the claim's. The pods
	// the claim holds are the store's to say (pool.held, pool.nHeld,
	// pool.heldPod); how many of them are being recycled is in more
	// (recycling).
	pool *pool
	// created is the creation time in Unix nanoseconds (see createdAt).
	created int64

	// With pod marks:
	// recRV is the resourceVersion of the newest version of the claim whose
	// record the allocator took in (listed, written, or read live).
	recRV uint64

	// more is what few claims need, nil when empty.
	more *claimMore
	// ref is the UID a listing gave the claim (see stamped.listedRef).
	ref string
}

// claimMore is what a claimInfo needs only for some claims: those with
// releases, a record to mistrust, or known only from pod marks. See its
// accessors and setters below.
type claimMore struct {
	// release is the owner's release list, as last decoded.
	release []string
	// released is the released list as last written or read.
	released []string
	// consumed holds entries of release already honoured while the owner
	// still lists them: a pod handed back to the same claim later is not
	// released again on the strength of the old entry.
	consumed map[string]struct{}
	// untrusted is set when the claim's record lists pods it does not hold.
	untrusted error
	// strays are pods its record lists as held that it does not hold (pod
	// marks).
	strays []string
	// since is when a claim known only from pod marks was first met.
	since time.Time
	// oldRVs are resourceVersions processed before rv that are not
	// numbers (see sawRV), oldest first.
	oldRVs []string
	// gone is set once a live read found the claim deleted (pod marks).
	gone bool
	// recycling counts the held pods being recycled.
	recycling int32
	// placement is the claim's Placement, nil if it has none.
	placement *algorithm.Placement
	// waitSince is when the claim began to want more than it holds, with
	// WithMetrics (poolalloc_time_to_serve_seconds); zero while it holds
	// all it wants.
	waitSince time.Time
}

// placement returns c's Placement, the zero one if it has none.
func (c *claimInfo) placement() algorithm.Placement {
	if c.more == nil || c.more.placement == nil {
		return algorithm.Placement{}
	}
	return *c.more.placement
}

// setPlacement takes pl as c's Placement and reports whether it changed.
// It runs for every listed claim in every round, so it compares
// selectors by their requirements, which allocates nothing.
func (c *claimInfo) setPlacement(pl algorithm.Placement) bool {
	if pl.Selector != nil && pl.Selector.Empty() {
		pl.Selector = nil
	}
	var old *algorithm.Placement
	if c.more != nil {
		old = c.more.placement
	}
	if pl.Selector == nil && pl.Class == "" && pl.Topology == (algorithm.Topology{}) && !pl.Gang {
		if old == nil {
			return false
		}
		c.more.placement = nil
		return true
	}
	if old != nil && sameSelector(old.Selector, pl.Selector) && old.Class == pl.Class && old.Topology == pl.Topology && old.Gang == pl.Gang {
		return false
	}
	// A copy, so that only a placement kept costs an allocation (pl
	// itself would escape on every call).
	kept := pl
	c.edit().placement = &kept
	return true
}

// sameSelector reports whether two selectors select the same pods, as far
// as their requirements (or, for selectors without any, their strings)
// tell.
func sameSelector(a, b labels.Selector) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	ra, oka := a.Requirements()
	rb, okb := b.Requirements()
	if oka && okb {
		return slices.EqualFunc(ra, rb, labels.Requirement.Equal)
	}
	return a.String() == b.String()
}

func (c *claimInfo) waitSince() time.Time {
	if c.more == nil {
		return time.Time{}
	}
	return c.more.waitSince
}

func (c *claimInfo) setWaitSince(t time.Time) {
	if c.more != nil || !t.IsZero() {
		c.edit().waitSince = t
		c.tidy()
	}
}

// recycling is how many of the pods the claim holds are being recycled.
func (c *claimInfo) recycling() int32 {
	if c.more == nil {
		return 0
	}
	return c.more.recycling
}

// addRecycling changes recycling by d.
func (c *claimInfo) addRecycling(d int32) {
	c.edit().recycling += d
	c.tidy()
}

func (c *claimInfo) isGone() bool { return c.more != nil && c.more.gone }

// setGone records that a live read found the claim deleted; it is never
// undone.
func (c *claimInfo) setGone() { c.edit().gone = true }

func (c *claimInfo) release() []string {
	if c.more == nil {
		return nil
	}
	return c.more.release
}

func (c *claimInfo) released() []string {
	if c.more == nil {
		return nil
	}
	return c.more.released
}

func (c *claimInfo) consumed(pod string) bool {
	if c.more == nil {
		return false
	}
	_, ok := c.more.consumed[pod]
	return ok
}

func (c *claimInfo) strays() []string {
	if c.more == nil {
		return nil
	}
	return c.more.strays
}

func (c *claimInfo) since() time.Time {
	if c.more == nil {
		return time.Time{}
	}
	return c.more.since
}

// edit returns c.more to change it, made if need be; tidy lets it go
// again once empty.
func (c *claimInfo) edit() *claimMore {
	if c.more == nil {
		c.more = &claimMore{}
	}
	return c.more
}

func (c *claimInfo) tidy() {
	if m := c.more; m != nil && len(m.release) == 0 && len(m.released) == 0 && len(m.consumed) == 0 &&
		m.untrusted == nil && len(m.strays) == 0 && m.since.IsZero() && len(m.oldRVs) == 0 && !m.gone && m.recycling == 0 && m.waitSince.IsZero() &&
		m.placement == nil {
		c.more = nil
	}
}

func (c *claimInfo) setSince(t time.Time) {
	if c.more != nil || !t.IsZero() {
		c.edit().since = t
		c.tidy()
	}
}

func (c *claimInfo) setReleased(released []string) {
	if c.more != nil || len(released) > 0 {
		c.edit().released = released
		c.tidy()
	}
}

func (c *claimInfo) consume(pod string) {
	m := c.edit()
	if m.consumed == nil {
		m.consumed = make(map[string]struct{})
	}
	m.consumed[pod] = struct{}{}
}

func (c *claimInfo) setUntrusted(err error) {
	if c.more != nil || err != nil {
		c.edit().untrusted = err
		c.tidy()
	}
}

func (c *claimInfo) setStrays(names []string) {
	if c.more != nil || len(names) > 0 {
		c.edit().strays = names
		c.tidy()
	}
}

// maxRVs bounds how many resourceVersions that are not numbers a claim
// remembers.
const maxRVs = 4

// sawRV reports whether a listed version of the claim with resourceVersion
// rv is one the allocator already processed or older than one it did.
// resourceVersions are opaque, but the API server's are decimal counters in
// practice: when both are numbers, an older one is recognised however many
// versions ago it was; otherwise only the last few are remembered.
func (c *claimInfo) sawRV(rv string) bool {
	if rv == c.rv {
		return rv != ""
	}
	if c.rv == "" {
		return false
	}
	if got, newest := rvNum(rv), rvNum(c.rv); got != 0 && newest != 0 {
		return got < newest
	}
	return c.more != nil && slices.Contains(c.more.oldRVs, rv)
}

func (c *claimInfo) addRV(rv string) {
	if rv == "" || c.sawRV(rv) {
		return
	}
	if c.rv != "" && (rvNum(c.rv) == 0 || rvNum(rv) == 0) {
		m := c.edit()
		if len(m.oldRVs) == maxRVs-1 {
			m.oldRVs = slices.Delete(m.oldRVs, 0, 1)
		}
		m.oldRVs = append(m.oldRVs, c.rv)
	}
	c.rv = rv
}

func (c *claimInfo) holder() store.Holder { return store.Holder{UID: c.uid(), Claim: c.name()} }

// setIdent sets the claim's pool, name and UID.
func (c *claimInfo) setIdent(p *pool, name string, uid types.UID) {
	c.setKey(p, name+claimKeySep+string(uid), len(name))
}

// claimKeySep separates a claim's name from its UID in its key, as in a
// pod mark.
const claimKeySep = "/"

// setKey sets the claim's pool and key, its name, claimKeySep and its UID
// (see key), made by the caller; the name is nameLen bytes of it.
func (c *claimInfo) setKey(p *pool, key string, nameLen int) {
	c.key, c.pool, c.nameLen = key, p, int32(nameLen)
}

// claimUID is the key of claims in pool.claims.
func claimUID(c *claimInfo) string { return string(c.uid()) }

// uid is the claim's UID, a part of key.
func (c *claimInfo) uid() types.UID { return types.UID(c.key[c.nameLen+1:]) }

// name is the claim's namespace and name, a part of key.
func (c *claimInfo) name() types.NamespacedName {
	return types.NamespacedName{Namespace: c.pool.name.Namespace, Name: c.key[:c.nameLen]}
}

// noTime is claimInfo.created for a zero creation time.
const noTime = math.MinInt64

func unixNanos(t time.Time) int64 {
	if t.IsZero() {
		return noTime
	}
	return t.UnixNano()
}

// createdAt is the claim's creation time.
func (c *claimInfo) createdAt() time.Time {
	if c.created == noTime {
		return time.Time{}
	}
	return time.Unix(0, c.created)
}

// maxForgotten bounds pool.forgotten.
const maxForgotten = 4096

// forget remembers the newest resourceVersion of a claim that left the
// pool.
func (p *pool) forget(ci *claimInfo) {
	rv := ci.recRV
	if ci.known() {
		rv = max(rv, rvNum(ci.objRV()))
	}
	if rv == 0 {
		return
	}
	if p.forgotten == nil || len(p.forgotten) >= maxForgotten {
		p.forgotten = make(map[types.UID]uint64)
	}
	p.forgotten[ci.uid()] = rv
}
