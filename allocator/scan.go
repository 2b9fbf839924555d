package allocator

import (
	"math"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// scan checks a round's pods and claims as prepare does, stamps the pods
// and claims the pool knows as listed in this round, and returns those
// that observePod and observeClaim must take in: new or changed ones
// (claims by index), in the listing's order. A pod or claim the pool
// knows, unchanged, costs a lookup and a comparison. The stamps find the
// duplicates. When the input is refused the error is that of its first
// pod, else its first claim, that is refused, and the pool's state is not
// changed.
//
// A listing in a stable order (a slice the caller keeps, or a List from the
// API server, sorted by name) shows the pods and claims in the order of
// podSeen and claimSeen, which are filled in listing order: scan looks for
// each one first at the place after the previous one's (a hint), which
// costs no lookup and reads the pool's entries one after another. An
// informer cache's List comes out in its map's order, which changes little
// from one List to the next: a pool recovered from the cache is read with
// the hint too, names and UIDs compared by address before content (refs,
// podInfo.listedUID), since the cache keeps their bytes in the order the
// objects were decoded. A listing in another order (after a relist, or
// shuffled) would pay a cache miss for each of a
// pod's name, index slot, entry, key and stamp: once the hint has missed
// maxHintMisses times more than it hit, scan takes the rest with
// scanUnordered, which finds unchanged objects by the addresses of their
// keys and reads the pool's entries in their own order (docs/design.md
// §13).
func (r *round) scan(pods []corev1.Pod, claims []Claim) ([]*corev1.Pod, []int, error) {
	changedPods, err := r.scanPods(pods)
	if err != nil {
		return nil, nil, err
	}
	changedClaims, err := r.scanClaims(claims)
	if err != nil {
		return nil, nil, err
	}
	return changedPods, changedClaims, nil
}

// scanChunk is how many pods or claims scan reads ahead at a time.
const scanChunk = 64

// maxHintMisses bounds how many more misses than hits a hint may have in a
// scan before it is no longer tried.
const maxHintMisses = 64

// hint is where scan looks first for the next pod or claim of a listing:
// at next in podSeen or claimSeen.
type hint struct {
	next         int
	hits, misses int
}

// off reports whether the hint has missed too often to be tried again in
// this scan.
func (h *hint) off() bool { return h.misses > h.hits+maxHintMisses }

// try reports whether to look at next, in an array of n.
func (h *hint) try(n int) bool { return h.next < n && !h.off() }

func (h *hint) count(hit bool) {
	if hit {
		h.hits++
	} else {
		h.misses++
	}
}

// podHead and claimHead are what scan reads of every listed pod or claim
// (a pod's namespace only when it is new or changed).
type podHead struct {
	name string
	uid  types.UID
	rv   string
}

func headOfPod(pod *corev1.Pod) podHead {
	m := &pod.ObjectMeta
	return podHead{name: m.Name, uid: m.UID, rv: m.ResourceVersion}
}

type claimHead struct {
	uid      types.UID
	rv       string
	want     int
	priority int32
}

// headOfClaim reads what scan needs of a listed claim.
func headOfClaim(c *Claim) claimHead {
	hd := claimHead{want: c.Want, priority: c.Priority}
	hd.uid, hd.rv = idOf(c.Object)
	return hd
}

// idOf reads an object's UID and resourceVersion: from its ObjectMeta
// directly when it has one (a typed claim), through the object's methods
// otherwise; empty for nil.
func idOf(o client.Object) (types.UID, string) {
	if a, ok := o.(metav1.ObjectMetaAccessor); ok {
		if m, ok := a.GetObjectMeta().(*metav1.ObjectMeta); ok && m != nil {
			return m.UID, m.ResourceVersion
		}
	}
	if o == nil {
		return "", ""
	}
	return o.GetUID(), o.GetResourceVersion()
}

// scanPods is scan's part for the pods.
func (r *round) scanPods(pods []corev1.Pod) ([]*corev1.Pod, error) {
	p := r.p
	// A chunk at a time: a first pass copies out of each pod what the
	// round reads, in a loop short enough for the cache misses of many
	// pods to overlap (a listing is larger than the caches); the next work
	// on the copies.
	var (
		changed []*corev1.Pod
		newPods map[string]struct{}
		h       hint
		heads   [scanChunk]podHead
	)
	for start := 0; start < len(pods); start += scanChunk {
		chunk := pods[start:min(start+scanChunk, len(pods))]
		for j := range chunk {
			heads[j] = headOfPod(&chunk[j])
		}
		if h.off() {
			return r.scanPodsUnordered(pods[start:], start, changed, &newPods)
		}
		for j := range chunk {
			hd := &heads[j]
			var pi *podInfo
			var st *stamp[*podInfo]
			if h.try(len(p.podSeen)) {
				if s := &p.podSeen[h.next]; !s.v.waiting && hd.name != "" && (sameString(s.v.ref, hd.name) || s.v.name() == hd.name) {
					pi, st = s.v, s // the entry of pods under that name
					if !sameString(pi.ref, hd.name) {
						setRef(&p.podRefs, p.podSeen, pi.idx, hd.name)
					}
				}
				h.count(pi != nil)
			}
			if pi == nil && hd.name != "" {
				if pi = p.pods.Get(hd.name); pi != nil && !sameString(pi.ref, hd.name) && p.podSeen.at(pi) != nil {
					setRef(&p.podRefs, p.podSeen, pi.idx, hd.name)
				}
			}
			take, err := r.scanPod(start+j, &chunk[j], hd, pi, st, &newPods)
			if err != nil {
				return nil, err
			}
			if take {
				changed = append(changed, &chunk[j])
			}
			if pi != nil {
				h.next = int(pi.idx) + 1
			}
		}
	}
	return changed, nil
}

// scanPod looks at pod j of the listing, read as hd, whose entry is pi (nil
// when the pool has none), with its stamp st if the caller has it: it
// stamps the entry and reports whether the round must observe the pod, or
// why the listing is refused. newPods holds the names of the pods new to
// the pool met so far.
func (r *round) scanPod(j int, pod *corev1.Pod, hd *podHead, pi *podInfo, st *stamp[*podInfo], newPods *map[string]struct{}) (bool, error) {
	p := r.p
	if hd.name == "" {
		return false, checkPod(p.name, j, pod)
	}
	if pi == nil {
		if pod.Namespace != p.name.Namespace || len(hd.name) > maxPodName {
			return false, checkPod(p.name, j, pod)
		}
		if *newPods == nil {
			*newPods = make(map[string]struct{})
		}
		if _, dup := (*newPods)[hd.name]; dup {
			return false, errPodTwice(p.name, hd.name)
		}
		(*newPods)[hd.name] = struct{}{}
		return true, nil
	}
	if st == nil {
		st = p.podSeen.at(pi)
	}
	if st.seen == p.gen {
		return false, errPodTwice(p.name, hd.name)
	}
	st.seen = p.gen
	if (hd.uid != "" && !pi.listedUID(hd.uid)) || !pi.unchanged(hd.rv) {
		// Changed: checked whole. (A version taken in before was
		// checked then: its namespace cannot have changed.)
		if pod.Namespace != p.name.Namespace {
			return false, checkPod(p.name, j, pod)
		}
		return true, nil
	}
	if pi.recycling() || pi.settling() != nil {
		r.noteListed(pi, pod)
	}
	return false, nil
}

// scanClaims is scan's part for the claims, as scanPods is for the pods.
func (r *round) scanClaims(claims []Claim) ([]int, error) {
	p := r.p
	var (
		changed   []int
		newClaims map[types.UID]struct{}
		h         hint
		heads     [scanChunk]claimHead
	)
	for start := 0; start < len(claims); start += scanChunk {
		chunk := claims[start:min(start+scanChunk, len(claims))]
		for j := range chunk {
			heads[j] = headOfClaim(&chunk[j])
		}
		if h.off() {
			return r.scanClaimsUnordered(claims[start:], start, changed, &newClaims)
		}
		for j := range chunk {
			hd := &heads[j]
			var ci *claimInfo
			var st *stamp[*claimInfo]
			if h.try(len(p.claimSeen)) {
				if s := &p.claimSeen[h.next]; hd.uid != "" && (sameString(s.v.ref, string(hd.uid)) || s.v.uid() == hd.uid) {
					ci, st = s.v, s // the entry of claims under uid
					if !sameString(ci.ref, string(hd.uid)) {
						setRef(&p.claimRefs, p.claimSeen, ci.idx, string(hd.uid))
					}
				}
				h.count(ci != nil)
			}
			if ci == nil && hd.uid != "" {
				if ci = p.claims.Get(string(hd.uid)); ci != nil && !sameString(ci.ref, string(hd.uid)) && p.claimSeen.at(ci) != nil {
					setRef(&p.claimRefs, p.claimSeen, ci.idx, string(hd.uid))
				}
			}
			take, err := r.scanClaim(start+j, &chunk[j], hd, ci, st, &newClaims)
			if err != nil {
				return nil, err
			}
			if take {
				changed = append(changed, start+j)
			}
			if ci != nil {
				h.next = int(ci.idx) + 1
			}
		}
	}
	return changed, nil
}

// scanClaim is scanPod for claim i of the listing.
func (r *round) scanClaim(i int, c *Claim, hd *claimHead, ci *claimInfo, st *stamp[*claimInfo], newClaims *map[types.UID]struct{}) (bool, error) {
	p := r.p
	// (A nil object has no UID: c is not read for a claim known and
	// unchanged.)
	if hd.uid == "" || hd.want < 0 || hd.want > math.MaxInt32 {
		return false, checkClaim(p.name, i, *c)
	}
	if ci == nil {
		if c.Object.GetNamespace() != p.name.Namespace {
			return false, checkClaim(p.name, i, *c)
		}
		if *newClaims == nil {
			*newClaims = make(map[types.UID]struct{})
		}
		if _, dup := (*newClaims)[hd.uid]; dup {
			return false, errClaimTwice(p.name, c.Object)
		}
		(*newClaims)[hd.uid] = struct{}{}
		return true, nil
	}
	if st == nil {
		st = p.claimSeen.at(ci)
	}
	if st.seen == p.gen {
		return false, errClaimTwice(p.name, c.Object)
	}
	st.seen = p.gen
	if hd.rv == "" || !ci.sawRV(hd.rv) || !ci.known() || !ci.listed ||
		hd.rv == ci.rv && (int64(hd.want) != int64(ci.want) || hd.priority != ci.priority) {
		if c.Object.GetNamespace() != p.name.Namespace {
			return false, checkClaim(p.name, i, *c)
		}
		return true, nil
	}
	return false, nil
}

// stampsOf sets stamps[i] to the stamp of found[i] in l (nil for a nil
// entry), in a loop of its own: the stamps' cache misses overlap.
func stampsOf[T stamped](l seenList[T], found []T, stamps []*stamp[T]) {
	var zero T
	for i, v := range found {
		stamps[i] = nil
		if v != zero {
			stamps[i] = l.at(v)
		}
	}
}

// scanPodsUnordered is scanPods for rest, the pods of the listing from
// base on, once the hint is off (scanUnordered).
func (r *round) scanPodsUnordered(rest []corev1.Pod, base int, changed []*corev1.Pod, newPods *map[string]struct{}) ([]*corev1.Pod, error) {
	p := r.p
	sc := &p.unordered
	heads := grown(sc.podHeads, len(rest))
	defer func() { clear(heads); sc.podHeads = heads[:0] }()
	at := sc.begin(len(p.podSeen))
	// Two loops: a pod's read and its lookup in one would chain their
	// cache misses.
	for i := range rest {
		heads[i] = headOfPod(&rest[i])
	}
	for i := range heads {
		sc.place(at, p.podRefs.lookup(heads[i].name), i)
	}
	take, err := scanUnordered(&unorderedScan[*podInfo, podHead]{
		seen: p.podSeen, refs: &p.podRefs, index: &p.pods, gen: p.gen, heads: heads,
		key: func(i int) string { return heads[i].name },
		one: func(i int, pi *podInfo, st *stamp[*podInfo]) (bool, error) {
			return r.scanPod(base+i, &rest[i], &heads[i], pi, st, newPods)
		},
		twice: func(i int) error { return errPodTwice(p.name, heads[i].name) },
	}, sc)
	if err != nil {
		return nil, err
	}
	for _, i := range take {
		changed = append(changed, &rest[i])
	}
	return changed, nil
}

// scanClaimsUnordered is scanPodsUnordered for the claims, found by the
// address of their UIDs.
func (r *round) scanClaimsUnordered(rest []Claim, base int, changed []int, newClaims *map[types.UID]struct{}) ([]int, error) {
	p := r.p
	sc := &p.unordered
	heads := grown(sc.claimHeads, len(rest))
	defer func() { clear(heads); sc.claimHeads = heads[:0] }()
	at := sc.begin(len(p.claimSeen))
	for i := range rest {
		heads[i] = headOfClaim(&rest[i])
	}
	for i := range heads {
		sc.place(at, p.claimRefs.lookup(string(heads[i].uid)), i)
	}
	take, err := scanUnordered(&unorderedScan[*claimInfo, claimHead]{
		seen: p.claimSeen, refs: &p.claimRefs, index: &p.claims, gen: p.gen, heads: heads,
		key: func(i int) string { return string(heads[i].uid) },
		one: func(i int, ci *claimInfo, st *stamp[*claimInfo]) (bool, error) {
			return r.scanClaim(base+i, &rest[i], &heads[i], ci, st, newClaims)
		},
		twice: func(i int) error { return errClaimTwice(p.name, rest[i].Object) },
	}, sc)
	if err != nil {
		return nil, err
	}
	for _, i := range take {
		changed = append(changed, base+int(i))
	}
	return changed, nil
}
