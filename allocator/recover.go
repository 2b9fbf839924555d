package allocator

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/internal/blocks"
	"github.com/poolalloc/poolalloc/internal/index"
	spread "github.com/poolalloc/poolalloc/internal/parallel"
	"github.com/poolalloc/poolalloc/store"
	"github.com/poolalloc/poolalloc/syncer"
)

// Recovery (docs/design.md I5, §13): a pool's first Round rebuilds its
// state from the listing, the claims' records and, with pod marks, the
// pods' marks, in one pass over the listing (first):
//
//   - prepare checks the input (as scan does in later rounds) and makes
//     the pods' and claims' entries, decoding every claim's record and
//     finding every pod's place, on every core (spread.Split): each pod
//     and claim is independent. It builds the pods' index while the
//     records are decoded, and the claims' while each record's pods are
//     sorted (splitAll). It changes nothing of the pool.
//   - The store forgets the pool, and nothing more happens if a record
//     cannot be read (readable).
//   - installPods puts the pods in, in listing order, each in the state
//     the listing gives it with no holder, then installClaims the claims'
//     entries; meanwhile, with pod marks, giveMarked gives every claim the
//     pods its record lists that are listed and marked for it, all claims
//     in one store write. prepare's entries and the store's come from
//     blocks (one allocation for many): a recovery makes thousands.
//   - rebuild takes the claims in: every other record entry goes through
//     takeName's rules, then the marks that no record backs are resolved.
//     A claim that then holds what it wants, with nothing pending, is not
//     planned in the round, and no version of it is kept (as settle would
//     drop it at the round's end): only claims with something to do cost
//     the round more than their entries.
//
// A pool whose recovery failed (a record it cannot read) keeps its pods;
// the next Round observes them as any round does and recovers the claims
// again (recover).

// minSplit is the least number of pods or claims prepare gives a core:
// below it, a goroutine costs more than it saves.
const minSplit = 256

// keyBlock is how many bytes of entries' keys recovery makes at once
// (keys), as it makes the entries themselves from blocks (package blocks):
// one allocation for many pods or claims, not one or two each.
const keyBlock = 8 << 10

// keys makes entries' key strings (a name, a separator, a UID) from shared
// blocks of keyBlock bytes: a key is a part of its block, which stays in
// memory while any of its keys is in use.
type keys struct{ b strings.Builder }

// join returns a + sep + c.
func (k *keys) join(a, sep, c string) string {
	n := len(a) + len(sep) + len(c)
	if k.b.Cap()-k.b.Len() < n {
		k.b = strings.Builder{}
		k.b.Grow(max(n, keyBlock))
	}
	start := k.b.Len()
	k.b.WriteString(a)
	k.b.WriteString(sep)
	k.b.WriteString(c)
	return k.b.String()[start:]
}

// listing is a pool's first listing, checked and made into entries by
// prepare.
type listing struct {
	pods []*podInfo // the entries of the input's pods, in its order
	// places are the places prepare found, each range of pods its own
	// (placesOf), in the order of the ranges: installPods makes them the
	// pool's.
	places [][]*podPlace
	podIdx index.Index[*podInfo]
	claims []recClaim // the input's claims, in its order
	claIdx index.Index[*claimInfo]
}

// recClaim is a listed claim met at recovery: its entry (with its
// record's release lists), its object as listed, and the pods its record
// holds.
type recClaim struct {
	ci  *claimInfo
	obj client.Object
	// The pods its record holds (split): with pod marks, those listed and
	// marked for the claim (one in one, more in mine), which recovery
	// gives it at once, then the names of the others (rest); without, the
	// entries of those the pool has, then the names of the others.
	one  *podInfo
	mine []*podInfo
	rest []string
	// err says why the record cannot be read (the pool is blocked); warn
	// why its release list cannot (reported, and taken as empty).
	err, warn error
}

// splitAll splits the pods of the claims of prep whose records can be read
// (split), on several goroutines for many claims.
func (r *round) splitAll(prep []recClaim, pods *index.Index[*podInfo]) {
	spread.Split(len(prep), minSplit, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if prep[i].err == nil {
				prep[i].split(r.p, pods, r.marks())
			}
		}
	})
}

// split sorts the pods f's record holds (in rest) with pods, the pool's
// pods by name: with marks, into those listed and marked for its claim and
// the rest; without, into those the pool has an entry for and the names of
// the others. It only reads pods and their entries.
func (f *recClaim) split(p *pool, pods *index.Index[*podInfo], marks bool) {
	held := f.rest
	f.rest = nil
	for _, name := range held {
		if pi := pods.Get(name); pi != nil && (!marks || pi.present && p.markNames(pi, f.ci)) {
			if f.one == nil {
				f.one = pi
			} else {
				f.mine = append(f.mine, pi)
			}
		} else {
			f.rest = append(f.rest, name)
		}
	}
}

// given appends to out the entries split found (with marks, of the pods
// listed and marked for f's claim).
func (f *recClaim) given(out []*podInfo) []*podInfo {
	if f.one != nil {
		out = append(out, f.one)
	}
	return append(out, f.mine...)
}

// names appends to out the names of all the pods f's record holds: those
// of given, then the rest.
func (f *recClaim) names(out []string) []string {
	if f.one != nil {
		out = append(out, f.one.name())
	}
	for _, pi := range f.mine {
		out = append(out, pi.name())
	}
	return append(out, f.rest...)
}

// prepare checks a pool's first input as scan would (a pod without a
// name, of another namespace, with too long a name, or listed twice; a
// claim as checkClaim says, or listed twice), returning the error of the
// first problem in the input's order, pods first, and makes
// the entries of its pods and claims, decoding the claims' records. The
// readiness rule and the syncer's Read run on several goroutines at once.
// It changes nothing of the pool.
func (r *round) prepare(in Input) (*listing, error) {
	l := &listing{pods: make([]*podInfo, len(in.Pods))}
	firstBad := newFirstIndex(len(in.Pods))
	var mu sync.Mutex
	places := map[int][]*podPlace{} // by the first pod of their range
	spread.Split(len(in.Pods), minSplit, func(lo, hi int) {
		local := placesOf{p: r.p}
		var made blocks.Blocks[podInfo]
		var ks keys
		defer func() {
			mu.Lock()
			places[lo] = local.made
			mu.Unlock()
		}()
		for i := lo; i < hi; i++ {
			pod := &in.Pods[i]
			if pod.Name == "" || pod.Namespace != r.p.name.Namespace || len(pod.Name) > maxPodName {
				firstBad.note(i)
				return
			}
			pi := made.Next(hi - i)
			initPodInfo(pi, ks.join(pod.Name, "", string(pod.UID)), len(pod.Name))
			r.listedPod(pi, pod)
			pi.place = local.of(pod.Spec.NodeName, pod.Labels)
			l.pods[i] = pi
		}
	})
	for _, lo := range slices.Sorted(maps.Keys(places)) {
		l.places = append(l.places, places[lo])
	}
	// The pods' index, while the claims' records are decoded; then the
	// claims' index, while their pods are found in the pods'.
	var (
		podErr, claimErr error
		badClaim         int
	)
	both(func() {
		l.podIdx = index.New((*podInfo).name, len(in.Pods))
		for i, pi := range l.pods {
			if i == firstBad.at() {
				podErr = checkPod(r.p.name, i, &in.Pods[i])
				return
			}
			if _, added := l.podIdx.Insert(pi); !added {
				podErr = errPodTwice(r.p.name, pi.name())
				return
			}
		}
	}, func() {
		l.claims, badClaim = r.prepareClaims(in.Claims)
	})
	if podErr != nil {
		return nil, podErr
	}
	both(func() {
		l.claIdx = index.New(claimUID, len(l.claims))
		for i := range l.claims {
			if i == badClaim {
				claimErr = checkClaim(r.p.name, i, in.Claims[i])
				return
			}
			if _, added := l.claIdx.Insert(l.claims[i].ci); !added {
				claimErr = errClaimTwice(r.p.name, l.claims[i].obj)
				return
			}
		}
	}, func() {
		if badClaim == len(l.claims) {
			r.splitAll(l.claims, &l.podIdx)
		}
	})
	if claimErr != nil {
		return nil, claimErr
	}
	return l, nil
}

// firstIndex is the least index noted by the bodies of a parallel.Split.
type firstIndex struct{ i atomic.Int64 }

// newFirstIndex returns a firstIndex at n, which no index of [0, n) is.
func newFirstIndex(n int) *firstIndex {
	f := &firstIndex{}
	f.i.Store(int64(n))
	return f
}

// note records index i.
func (f *firstIndex) note(i int) {
	for {
		at := f.i.Load()
		if int64(i) >= at || f.i.CompareAndSwap(at, int64(i)) {
			return
		}
	}
}

// at returns the least index noted.
func (f *firstIndex) at() int { return int(f.i.Load()) }

// listedPod fills in pi, the new entry of a pod listed for the first time:
// what a listing says of it (observePod for a new pod, with no entry to
// compare with). Its mark is kept as listed; recover resolves it.
func (r *round) listedPod(pi *podInfo, pod *corev1.Pod) {
	pi.present, pi.rv = true, pod.ResourceVersion
	if key := r.a.cfg.markKey; key != "" {
		if mark := pod.Annotations[key]; mark != "" {
			pi.mark, pi.markRV = mark, rvNum(pod.ResourceVersion)
		}
	}
	r.readStatus(pi, pod)
}

// readStatus takes in what pod says of pi's readiness.
func (r *round) readStatus(pi *podInfo, pod *corev1.Pod) {
	// A pod being deleted is never handed out, whatever the readiness
	// rule says (OpenSandbox's, for one, looks only at phase and the
	// Ready condition, which a terminating pod keeps for a while).
	pi.ready = pod.DeletionTimestamp == nil && r.a.cfg.ready(pod)
	pi.wasReady = pi.wasReady || pi.ready
	pi.ending = pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// both runs a and b at once, on two cores if there are.
func both(a, b func()) {
	spread.Split(2, 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if i == 0 {
				a()
			} else {
				b()
			}
		}
	})
}

// prepareClaims checks claims with checkClaim (bad is the first that
// fails, len(claims) if none), makes their entries and decodes their
// records, on several goroutines for many claims. The pods each record
// holds are in rest, for splitAll to sort.
func (r *round) prepareClaims(claims []Claim) (out []recClaim, bad int) {
	out = make([]recClaim, len(claims))
	firstBad := newFirstIndex(len(claims))
	spread.Split(len(claims), minSplit, func(lo, hi int) {
		var made blocks.Blocks[claimInfo]
		var ks keys
		for i := lo; i < hi; i++ {
			c := claims[i]
			if checkClaim(r.p.name, i, c) != nil {
				firstBad.note(i)
				return
			}
			f := &out[i]
			f.ci, f.obj = made.Next(hi-i), c.Object
			r.initClaimInfo(f.ci, ks.join(c.Object.GetName(), claimKeySep, string(c.Object.GetUID())), c)
			var rec syncer.Record
			rec, f.warn, f.err = readRecord(r.a.cfg.syncer, c.Object)
			if f.err == nil {
				f.ci.setRelease(rec.Release)
				f.ci.setReleased(rec.Released)
				f.rest = heldOf(rec)
			}
		}
	})
	return out, firstBad.at()
}

// heldOf is rec.Held(), which recovery only reads: rec.Allocated itself
// when it has no repeat and Released is empty (the common record of one
// or a few pods), with no copy made.
func heldOf(rec syncer.Record) []string {
	const few = 16 // pairs compared, rather than a set built
	if len(rec.Released) > 0 || len(rec.Allocated) > few {
		return rec.Held()
	}
	for i, pod := range rec.Allocated {
		if slices.Contains(rec.Allocated[:i], pod) {
			return rec.Held()
		}
	}
	return rec.Allocated
}

// claimInfoOf makes the entry of a claim listed for the first time, in
// r's pool. Its version is not kept yet: recover keeps it for the claims
// the round may write (see recover), observeClaim always.
func (r *round) claimInfoOf(c Claim) *claimInfo {
	ci := new(claimInfo)
	r.initClaimInfo(ci, c.Object.GetName()+claimKeySep+string(c.Object.GetUID()), c)
	return ci
}

// initClaimInfo makes ci, a zero entry, the entry claimInfoOf makes for c,
// whose key (see setKey) is key.
func (r *round) initClaimInfo(ci *claimInfo, key string, c Claim) {
	o := c.Object
	// The claim's namespace is the pool's (checked): one string for all.
	ci.want, ci.priority = int32(c.Want), c.Priority
	ci.created, ci.terminating = unixNanos(o.GetCreationTimestamp().Time), o.GetDeletionTimestamp() != nil
	ci.setKey(r.p, key, len(o.GetName()))
	ci.setPlacement(c.Placement)
	if r.a.cfg.metrics != nil && c.Want > 0 && !ci.terminating {
		// Waiting since its creation, until plan finds it holds all it
		// wants (a claim recovered with its pods, say).
		since := ci.createdAt()
		if since.IsZero() || since.After(r.now) {
			since = r.now
		}
		ci.setWaitSince(since)
	}
	ci.addRV(o.GetResourceVersion())
}

// newClaimInfo is claimInfoOf with the version kept.
func (r *round) newClaimInfo(c Claim) *claimInfo {
	ci := r.claimInfoOf(c)
	r.p.setObj(ci, c.Object, r.a.cfg)
	return ci
}

// readRecord decodes a claim's record with s. A malformed release list is
// the owner's request, not something the allocator wrote: it is returned
// as warn and taken as empty. Anything else unreadable is err, which makes
// the pool fail closed.
func readRecord(s syncer.AllocationSyncer, o client.Object) (rec syncer.Record, warn, err error) {
	rec, err = s.Read(o)
	if err == nil {
		// A syncer of the caller's may not check names as the default
		// one does.
		for _, pods := range [...][]string{rec.Allocated, rec.Release, rec.Released} {
			for _, pod := range pods {
				if pod == "" || len(pod) > maxPodName {
					return rec, nil, fmt.Errorf("%w: %q is not a pod name", syncer.ErrMalformedRecord, pod)
				}
			}
		}
		return rec, nil, nil
	}
	if errors.Is(err, syncer.ErrMalformedRelease) {
		rec.Release = nil
		return rec, err, nil
	}
	return rec, nil, err
}

// readRecord is readRecord for a claim of the round: a warning is
// reported, an error is the pool's (blocked).
func (r *round) readRecord(ci *claimInfo, o client.Object) (syncer.Record, error) {
	rec, warn, err := readRecord(r.a.cfg.syncer, o)
	r.recordRead(ci, warn, err)
	if err != nil {
		return rec, r.blocked(ci.uid(), ci.name(), err)
	}
	return rec, nil
}

// recordRead reports warn, a release list ci's record cannot be read.
func (r *round) recordRead(ci *claimInfo, warn, err error) {
	if warn != nil && err == nil {
		r.warn(r.claimErr(ci, fmt.Errorf("%w: %w", ErrInvalidRelease, warn)))
	}
}

// first is the round of a pool that has no state yet (made by this call
// if made): prepare, installPods, recover, then a round as any other. An
// input prepare refuses leaves a pool this call made to no one.
func (r *round) first(in Input, made bool) (Result, error) {
	p := r.p
	l, err := r.prepare(in)
	if err != nil {
		if made {
			r.a.drop(p, false) // nothing of it was kept
		}
		return *r.res, err
	}
	// A pool starts from an empty store (see drop).
	if err := r.a.cfg.store.DeletePool(p.name); err != nil {
		return *r.res, fmt.Errorf("pool %s: recover: %w", p.name, storeErr(err))
	}
	var g *gifts
	err = r.readable(l.claims)
	if err == nil && r.marks() {
		// The store writes that give the claims their marked pods touch
		// nothing of the pool: they go on while the pods and the claims'
		// entries are put in (installClaims leaves alone what giveMarked
		// reads of an entry).
		both(func() {
			r.installPods(l)
			r.installClaims(l.claims, &l.claIdx)
		}, func() { g = r.giveMarked(l.claims) })
	} else {
		r.installPods(l)
		if err == nil {
			r.installClaims(l.claims, &l.claIdx)
		}
	}
	if err == nil {
		err = r.rebuild(l.claims, l, g)
	}
	if err != nil {
		r.report()
		return *r.res, err
	}
	r.setProto(in.Claims)
	r.listIdle = true
	return r.run()
}

// installPods makes l's pods the pool's, in the pool's first round, the
// store holding nothing of the pool: each is listed in this round and in
// the state the listing gives it with no holder.
func (r *round) installPods(l *listing) {
	p := r.p
	// The pods' moves are not kept (see forgetMoves); the free list is
	// made once, for as many pods as may be free.
	p.rebuilding = true
	defer func() { p.rebuilding = false }()
	p.free = slices.Grow(p.free, len(l.pods))
	p.pods = l.podIdx
	p.podSeen = slices.Grow(p.podSeen[:0], len(l.pods))
	// The places prepare found become the pool's (placeAt), in the order
	// they were met: a range's place that the pool has already is
	// replaced by the pool's in its pods.
	var canon map[*podPlace]*podPlace
	for _, made := range l.places {
		for _, pl := range made {
			k := p.placeKey(pl.node, pl.labels)
			if c := p.findPlace(k, pl.node, pl.labels); c != nil {
				if canon == nil {
					canon = make(map[*podPlace]*podPlace)
				}
				canon[pl] = c
				continue
			}
			p.addPlace(k, pl, r.a.cfg.nodeLabels)
		}
	}
	for _, pi := range l.pods {
		p.podSeen.addSeen(pi, p.gen)
		if c, ok := canon[pi.place]; ok {
			pi.place = c // (a lookup in a nil map, mostly)
		}
		p.toPassiveAs(pi, nil)
	}
}

// placesOf finds the places of a range of pods on its own (prepare): the
// podPlaces it made, each once, in the order it made them. installPods
// makes them the pool's. The pods of a pool mostly share a few label sets:
// each set is kept once (sets), its places share its map (read only, as
// every place's), and a pod whose labels are the last pod's costs one
// comparison of the two, no hashing of its labels.
type placesOf struct {
	p     *pool
	found map[rangePlace]*podPlace
	sets  map[uint64]*rangeLabels // by labelsKey, chained
	last  *rangeLabels
	made  []*podPlace
}

// rangeLabels is a label set met in a range of pods (placesOf).
type rangeLabels struct {
	labels podLabels
	next   *rangeLabels // another with the same labelsKey
}

// rangePlace is a place of a range of pods: its node and its label set.
type rangePlace struct {
	node string
	set  *rangeLabels
}

// of returns the place of node and labels, made if the range has none.
func (l *placesOf) of(node string, labels map[string]string) *podPlace {
	ls := l.last
	if ls == nil || !maps.Equal(ls.labels, podLabels(labels)) {
		ls = l.setOf(labels)
		l.last = ls
	}
	k := rangePlace{node, ls}
	if pl := l.found[k]; pl != nil {
		return pl
	}
	if l.found == nil {
		l.found = make(map[rangePlace]*podPlace)
	}
	pl := &podPlace{node: node, zone: labels[ZoneLabel], labels: ls.labels}
	l.found[k] = pl
	l.made = append(l.made, pl)
	return pl
}

// setOf returns the range's label set equal to labels, made if it has
// none.
func (l *placesOf) setOf(labels map[string]string) *rangeLabels {
	k := l.p.labelsKey(labels)
	for ls := l.sets[k]; ls != nil; ls = ls.next {
		if maps.Equal(ls.labels, podLabels(labels)) {
			return ls
		}
	}
	if l.sets == nil {
		l.sets = make(map[uint64]*rangeLabels)
	}
	ls := &rangeLabels{labels: maps.Clone(labels), next: l.sets[k]}
	l.sets[k] = ls
	return ls
}

// recover rebuilds the pool's allocations from the claims' records, in a
// round of a pool whose recovery failed before (first did it otherwise):
// its pods are in, each observed. It changes nothing unless every record
// can be read.
func (r *round) recover(claims []Claim) error {
	p := r.p
	// The input was checked (scan): nothing is refused here.
	prep, _ := r.prepareClaims(claims)
	r.splitAll(prep, &p.pods)
	if err := r.readable(prep); err != nil {
		return err
	}
	if err := r.a.cfg.store.DeletePool(p.name); err != nil {
		return fmt.Errorf("pool %s: recover: %w", p.name, storeErr(err))
	}
	p.nHeldPods = 0
	for _, pi := range p.pods.Entries() {
		pi.strays = 0
		p.reset(pi)
	}
	r.installClaims(prep, nil)
	return r.rebuild(prep, nil, nil)
}

// readable reports the first claim of prep, in the listing's order, whose
// record cannot be read (the pool is blocked), and, without pod marks, the
// first that lists a pod an earlier one lists; it reports the release
// lists it cannot read before it. It changes nothing of the pool.
func (r *round) readable(prep []recClaim) error {
	var (
		owner map[string]*claimInfo
		names []string
	)
	if !r.marks() {
		owner = make(map[string]*claimInfo, len(prep))
	}
	for i := range prep {
		f := &prep[i]
		r.recordRead(f.ci, f.warn, f.err)
		if f.err != nil {
			return r.blocked(f.ci.uid(), f.ci.name(), f.err)
		}
		if owner == nil {
			continue
		}
		names = f.names(names[:0])
		for _, pod := range names {
			if other, dup := owner[pod]; dup {
				return r.blocked(f.ci.uid(), f.ci.name(), fmt.Errorf("%w: pod %s is also listed by claim %s (uid %s)",
					syncer.ErrMalformedRecord, pod, other.name(), other.uid()))
			}
			owner[pod] = f.ci
		}
	}
	return nil
}

// installClaims makes the claims of prep, every record readable, the
// pool's, in the listing's order, with idx as their index (nil: one is
// made), ready for rebuild. It touches neither the pods nor the store, and
// of the claims' entries nothing giveMarked reads: in the first round it
// runs while the store is written.
func (r *round) installClaims(prep []recClaim, idx *index.Index[*claimInfo]) {
	p := r.p
	if idx != nil {
		p.claims = *idx
	} else {
		p.claims = index.New(claimUID, len(prep))
		for i := range prep {
			p.claims.Set(prep[i].ci)
		}
	}
	p.dirty = make(map[*claimInfo]struct{})
	for _, s := range p.claimSeen {
		s.v.idx = -1
	}
	clear(p.claimSeen)
	p.claimSeen = slices.Grow(p.claimSeen[:0], len(prep))
	p.arrived = slices.Grow(p.arrived, len(prep))
	marks := r.marks()
	for i := range prep {
		ci := prep[i].ci
		p.addClaim(ci)
		p.seeClaim(ci)
		ci.listed = true
		if marks {
			ci.recRV = rvNum(ci.rv) // takeInMarked: the record's version
		}
	}
}

// rebuild takes the claims of prep, every record readable and installed
// (installClaims), into a pool whose pods are in and whose store holds
// nothing, or, with g, the marked pods giveMarked gave (with l, the
// listing prepare made). Claims with something to do are marked dirty;
// the others keep nothing of their version (quiet).
func (r *round) rebuild(prep []recClaim, l *listing, g *gifts) error {
	p, a := r.p, r.a
	p.rebuilding = true
	defer func() { p.rebuilding = false }()
	// How many pods each claim was given here.
	given := make([]int32, len(prep))
	if r.marks() {
		if g == nil {
			g = r.giveMarked(prep)
		}
		r.takeInMarked(prep, g, given)
		// A marked pod held now is held by the claim its mark names
		// (takeName gives a marked pod to no other): resolveMark would
		// leave it as it is. The others' marks are resolved, in the
		// listing's order: what resolveMark does may depend on it (claims
		// known only from marks arrive in that order).
		listed := r.input
		var check []*podInfo
		for i := range listed {
			var pi *podInfo
			if l != nil {
				pi = l.pods[i]
			} else if pi = p.pods.Get(listed[i].Name); pi == nil {
				continue
			}
			if pi.mark != "" && pi.state != stateHeld && pi.state != stateLost || pi.mark == "" && pi.state.held() {
				check = append(check, pi)
			}
		}
		for _, pi := range check { // resolveMark may change podSeen
			pi.mark = p.markString(pi.mark) // the claims are in now
			r.resolveMark(pi)
		}
		r.check = r.check[:0]
	} else {
		r.takeInUnmarked(prep, given)
		r.setHoldsAll(prep, given)
	}
	for i := range prep {
		ci := prep[i].ci
		if r.quiet(ci, given[i]) {
			ci.ver = settledVer
			continue
		}
		p.setObj(ci, prep[i].obj, a.cfg)
		p.dirty[ci] = struct{}{}
	}
	p.recovered = true
	p.forgetMoves()
	return nil
}

// gifts are the marked pods giveMarked gave: the pods of allocs[k], whose
// names are its Pods, are mine[at[k]:at[k+1]], for prep[of[k]]; failed[k]
// is the store's error when they were not given.
type gifts struct {
	allocs []store.Allocation
	mine   []*podInfo
	at, of []int
	failed []error
}

// giveMarked gives each claim of prep the pods its record lists that are
// listed and marked for it (recClaim.split), all claims in one store
// write (allocateAll), and records which claims hold pods (setHolds). It
// touches nothing of the pool but its store: it may run while the pods
// are put in (installPods). takeInMarked takes what it gave in.
func (r *round) giveMarked(prep []recClaim) *gifts {
	n := 0
	for i := range prep {
		n += len(prep[i].mine) + 1
	}
	g := &gifts{
		mine:   make([]*podInfo, 0, n),
		allocs: make([]store.Allocation, 0, len(prep)),
		at:     make([]int, 0, len(prep)+1),
		of:     make([]int, 0, len(prep)),
	}
	names := make([]string, 0, n)
	for i := range prep {
		f := &prep[i]
		start := len(g.mine)
		g.mine = f.given(g.mine)
		if len(g.mine) == start {
			continue
		}
		for _, pi := range g.mine[start:] {
			names = append(names, pi.name())
		}
		g.allocs = append(g.allocs, store.Allocation{Holder: f.ci.holder(), Pods: names[start:len(g.mine):len(g.mine)]})
		g.at, g.of = append(g.at, start), append(g.of, i)
	}
	g.at = append(g.at, len(g.mine))
	g.failed = r.allocateAll(g.allocs)
	a := r.a
	a.mu.Lock()
	defer a.mu.Unlock()
	a.claimPools.Grow(a.claimPools.Len() + len(g.allocs))
	for k := range g.allocs {
		if g.failed[k] == nil {
			a.setHoldsLocked(prep[g.of[k]].ci, true)
		}
	}
	return g
}

// takeInMarked takes in the records of prep at recovery (pod marks on),
// as takeIn does a record version newer than any known: nothing is held or
// reserved yet. The pods a record lists that are listed and marked for its
// claim (the common case) were given by g (giveMarked); every other entry
// goes through takeName, claim after claim in the listing's order.
// given[i] is how many pods prep[i] was given by g (takeName marks a claim
// it gives a pod to dirty). Each claim's recRV, its record's version, was
// set by installClaims.
//
// Giving the marked pods first changes nothing takeName decides: at
// recovery it gives a claim only pods marked for it, and what it decides
// for a pod marked for another claim, or for an unmarked or missing pod,
// does not depend on who holds the pods marked for their claims.
func (r *round) takeInMarked(prep []recClaim, g *gifts, given []int32) {
	p := r.p
	for k, al := range g.allocs {
		i, pods := g.of[k], g.mine[g.at[k]:g.at[k+1]]
		ci := prep[i].ci
		if err := g.failed[k]; err != nil {
			r.storeFail(ci, err)
			prep[i].rest = append(prep[i].rest, al.Pods...) // not given: stray entries
			continue
		}
		given[i] = int32(len(pods))
		for _, pi := range pods {
			p.nHeldPods++
			if pi.mark == ci.key {
				pi.mark = ci.key // one string for the claim and its pods' marks
			}
			p.toPassiveAs(pi, ci)
		}
	}
	for i := range prep { // in the listing's order
		if len(prep[i].rest) == 0 {
			continue
		}
		ci := prep[i].ci
		var strays []string
		for _, name := range prep[i].rest {
			if !r.takeName(ci, name, 0) {
				strays = append(strays, name)
			}
		}
		if len(strays) > 0 {
			r.setStrays(ci, strays)
		}
	}
}

// markNames reports whether pi's mark names ci.
func (p *pool) markNames(pi *podInfo, ci *claimInfo) bool {
	return pi.mark == ci.key || pi.mark != "" && pi.markUID(p.name) == ci.uid()
}

// takeInUnmarked takes in the records of prep at recovery without pod
// marks: each is believed, the pods it lists held unless its claim holds
// them in another pool that recovered already (it moved), all claims in
// one store write. given[i] is how many pods prep[i] was given.
func (r *round) takeInUnmarked(prep []recClaim, given []int32) {
	p, a := r.p, r.a
	// The claims held in another pool (moved), found under one lock.
	var elsewhere map[int]types.NamespacedName
	a.mu.Lock()
	for i := range prep {
		if other, ok := a.heldElsewhereLocked(prep[i].ci.uid(), p.name); ok {
			if elsewhere == nil {
				elsewhere = make(map[int]types.NamespacedName)
			}
			elsewhere[i] = other
		}
	}
	a.mu.Unlock()
	n := 0
	for i := range prep {
		n += len(prep[i].mine) + 1 + len(prep[i].rest)
	}
	var (
		names  = make([]string, 0, n)   // the pods' own strings, not the records' copies
		pis    = make([]*podInfo, 0, n) // their entries, nil where there is none yet
		allocs = make([]store.Allocation, 0, len(prep))
		of     = make([]int, 0, 2*len(prep)) // where each allocation's pods start, and its claim
	)
	for i := range prep {
		f := &prep[i]
		start := len(names)
		pis = f.given(pis)
		names = f.names(names)
		for range f.rest {
			pis = append(pis, nil)
		}
		if other, ok := elsewhere[i]; ok {
			// Pods a moved claim holds in a pool that already recovered
			// stay there.
			kept := slices.DeleteFunc(names[start:], func(pod string) bool {
				h, held, err := a.cfg.store.HolderOf(other, pod)
				return err == nil && held && h.UID == f.ci.uid()
			})
			names, pis = names[:start+len(kept)], pis[:start+len(kept)]
			clear(pis[start:]) // found by name
		}
		if len(names) > start {
			allocs = append(allocs, store.Allocation{Holder: f.ci.holder(), Pods: names[start:len(names):len(names)]})
			of = append(of, start)
			of = append(of, i)
		}
	}
	failed := r.allocateAll(allocs)
	for k, al := range allocs {
		start, i := of[2*k], of[2*k+1]
		ci := prep[i].ci
		if err := failed[k]; err != nil {
			r.storeFail(ci, fmt.Errorf("recover: %w", err))
			continue
		}
		given[i] = int32(len(al.Pods))
		for j, name := range al.Pods {
			pi := pis[start+j]
			if pi == nil {
				pi = p.podOrNew(name)
			}
			p.nHeldPods++
			p.toPassiveAs(pi, ci)
		}
	}
}

// allocateAll makes allocs in the store, in order, with one call if the
// store is a store.BulkWriter; failed[k] is the error of allocs[k], nil
// if it was made.
func (r *round) allocateAll(allocs []store.Allocation) (failed []error) {
	failed = make([]error, len(allocs))
	if b, ok := r.a.cfg.store.(store.BulkWriter); ok {
		for done := 0; done < len(allocs); {
			k, err := b.AllocateAll(r.p.name, allocs[done:])
			if err == nil {
				break
			}
			failed[done+k] = err
			done += k + 1
		}
		return failed
	}
	for k, al := range allocs {
		failed[k] = r.a.cfg.store.Allocate(r.p.name, al.Holder, al.Pods)
	}
	return failed
}

// setHoldsAll records, under one lock, which claims of prep hold pods in
// the pool (setHolds).
func (r *round) setHoldsAll(prep []recClaim, given []int32) {
	a := r.a
	a.mu.Lock()
	defer a.mu.Unlock()
	a.claimPools.Grow(a.claimPools.Len() + len(prep))
	for i := range prep {
		if given[i] > 0 {
			a.setHoldsLocked(prep[i].ci, true)
		}
	}
}

// quiet reports whether ci, recovered holding n pods, has nothing for the
// round to do: as settled says, and nothing the plan would change (no
// selector to check its pods against, no lost pod to replace). Such a
// claim is not planned, and no version of it is kept: a write reads it
// again (see letGo).
func (r *round) quiet(ci *claimInfo, n int32) bool {
	if _, dirty := r.p.dirty[ci]; dirty {
		return false
	}
	if n != ci.want || ci.terminating || ci.rewrite || ci.recycling() > 0 || len(ci.release()) > 0 || len(ci.strays()) > 0 ||
		r.a.cfg.replaceLost || ci.placement().Selector != nil {
		return false
	}
	// It holds all it wants (plan's noteWaiting).
	r.noteWaiting(ci, int(n), int(n))
	return true
}

// toPassiveAs moves pi to the passive state the listing gives it with
// holder as its holder: what the store says, known to the caller, which
// just wrote it (passive asks the store).
func (p *pool) toPassiveAs(pi *podInfo, holder *claimInfo) {
	to, h := p.passiveAs(pi, holder)
	p.setState(pi, to, h, false)
}
