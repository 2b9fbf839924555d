package allocator

import (
	"math"
	"sync"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/internal/index"
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
// costs no lookup and reads the pool's entries one after another. A
// listing in another order (an informer cache's, whose List comes out in
// map order, another one each time) would pay a cache miss for each of a
// pod's name, index slot, entry, key and stamp. Once the hint has missed
// maxHintMisses times more than it hit, scan takes the rest of the listing
// in the order of where its names (claims: objects, then UIDs) are in
// memory (scanPodsByAddress), which is the same from one listing of an
// informer cache to the next, and puts podSeen and claimSeen in that order
// the first time: the hint then finds the entries again, and every read
// follows memory. What the round does with the pods and claims does not
// depend on that order.
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

// podHead and claimHead are what scan reads of a listed pod or claim.
type podHead struct {
	name, ns string
	uid      types.UID
	rv       string
}

func headOfPod(pod *corev1.Pod) podHead {
	m := &pod.ObjectMeta
	return podHead{name: m.Name, ns: m.Namespace, uid: m.UID, rv: m.ResourceVersion}
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
	var (
		changed []*corev1.Pod
		newPods map[string]struct{}
		h       hint
		heads   [scanChunk]podHead
	)
	// A chunk at a time: a first pass copies out of each pod what the
	// round reads, in a loop short enough for the cache misses of many
	// pods to overlap (a listing is larger than the caches); the second
	// works on the copies.
	for start := 0; start < len(pods); start += scanChunk {
		if h.off() {
			return r.scanPodsByAddress(pods, start, changed, newPods)
		}
		chunk := pods[start:min(start+scanChunk, len(pods))]
		for j := range chunk {
			heads[j] = headOfPod(&chunk[j])
		}
		for j := range chunk {
			hd := &heads[j]
			var pi *podInfo
			var st *stamp[*podInfo]
			if h.try(len(p.podSeen)) {
				if s := &p.podSeen[h.next]; !s.v.waiting && s.v.name() == hd.name {
					pi, st = s.v, s // the entry of pods under that name
				}
				h.count(pi != nil)
			}
			if pi == nil && hd.name != "" {
				pi = p.pods.Get(hd.name)
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
		if hd.ns != p.name.Namespace || len(hd.name) > maxPodName {
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
	if (pi.uid() != hd.uid && hd.uid != "") || !pi.unchanged(hd.rv) {
		// Changed: checked whole. (A version taken in before was
		// checked then: its namespace cannot have changed.)
		if hd.ns != p.name.Namespace {
			return false, checkPod(p.name, j, pod)
		}
		return true, nil
	}
	if pi.recycling() || pi.settling() != nil {
		r.noteListed(pi, pod)
	}
	return false, nil
}

// scanPodsByAddress is scanPods for pods[start:], a listing out of the
// pool's order; changed and newPods are what scanPods found before start.
// It takes the pods in the order of the addresses of their names' bytes,
// which it reads without reading the bytes: whatever order a listing is
// in, that is the order its names are in memory, and an informer cache's
// listings share their names. So the round reads the names in one sweep
// through that memory, and the pool's entries in the order of podSeen
// once podSeen is in that order too: byAddressPass puts podSeen in the
// order it met the entries when that was not podSeen's. The pods to
// observe are collected in the listing's order.
func (r *round) scanPodsByAddress(pods []corev1.Pod, start int, changed []*corev1.Pod, newPods map[string]struct{}) ([]*corev1.Pod, error) {
	p := r.p
	n := len(pods) - start
	sc := getScratch(n)
	defer putScratch(sc)
	heads, addrs := sc.pheads[:n], sc.addrs[:n]
	for j := range n {
		heads[j] = headOfPod(&pods[start+j])
		addrs[j] = uintptr(unsafe.Pointer(unsafe.StringData(heads[j].name)))
	}
	// The heads in that order, read in a loop of their own (their cache
	// misses overlap), then one after another.
	order, sorted := byAddress(addrs, sc.order[:n], sc.tmp[:n], sc.keys[:n], &sc.count), sc.psorted[:n]
	for k, j := range order {
		sorted[k] = heads[j]
	}
	take := sc.take[:n]
	err := byAddressPass(order, &p.podSeen, &p.pods, sc.pmet[:0],
		func(k int) string { return sorted[k].name },
		func(pi *podInfo, k int) bool { return !pi.waiting && pi.name() == sorted[k].name },
		func(k int, pi *podInfo, st *stamp[*podInfo]) (err error) {
			j := int(order[k])
			take[j], err = r.scanPod(start+j, &pods[start+j], &sorted[k], pi, st, &newPods)
			return err
		},
		func() { p.seenReordered = true })
	if err != nil {
		return nil, err
	}
	for j, t := range take {
		if t {
			changed = append(changed, &pods[start+j])
		}
	}
	return changed, nil
}

// byAddressPass takes the listed objects in the order of order (object
// order[k] k-th), each found with a hint into seen (the entry after the
// last one found), else through idx, a chunk at a time in stages (GetMany,
// stampsOf) once the hint misses too often: key is the k-th object's key,
// same whether an entry is its, take looks at it given its entry (nil when
// the pool has none) and its stamp. The error is that of the first object
// in the listing (the least order[k]) that take refuses. When the hint
// missed for more than one object in eight, seen is put in the order the
// entries were met (met is room for them), so that the next listing in
// this order finds them with the hint, and reordered is called.
func byAddressPass[T stamped](order []int32, seen *seenList[T], idx *index.Index[T], met []T,
	key func(k int) string, same func(e T, k int) bool, take func(k int, e T, st *stamp[T]) error, reordered func()) error {
	var zero T
	bad, badErr := int32(math.MaxInt32), error(nil)
	var h hint
	look := func(k int, e T, st *stamp[T]) {
		if err := take(k, e, st); err != nil && order[k] < bad {
			bad, badErr = order[k], err
		}
		if e != zero {
			met = append(met, e)
			h.next = int(*e.seenIdx()) + 1
		}
	}
	var (
		keys   [scanChunk]string
		found  [scanChunk]T
		stamps [scanChunk]*stamp[T]
	)
	for c := 0; c < len(order); c += scanChunk {
		end := min(c+scanChunk, len(order))
		if h.off() {
			for k := c; k < end; k++ {
				keys[k-c] = key(k)
			}
			idx.GetMany(keys[:end-c], found[:end-c])
			stampsOf(*seen, found[:end-c], stamps[:end-c])
			for k := c; k < end; k++ {
				look(k, found[k-c], stamps[k-c])
			}
			continue
		}
		for k := c; k < end; k++ {
			var e T
			var st *stamp[T]
			if h.try(len(*seen)) {
				if s := &(*seen)[h.next]; same(s.v, k) {
					e, st = s.v, s
				}
				h.count(e != zero)
			}
			if e == zero {
				if key := key(k); key != "" {
					e = idx.Get(key)
				}
			}
			look(k, e, st)
		}
	}
	if badErr != nil {
		return badErr
	}
	if h.misses > len(order)/8 {
		seen.reorder(met)
		reordered()
	}
	return nil
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
		if h.off() {
			return r.scanClaimsByAddress(claims, start, changed, newClaims)
		}
		chunk := claims[start:min(start+scanChunk, len(claims))]
		for j := range chunk {
			heads[j] = headOfClaim(&chunk[j])
		}
		for j := range chunk {
			hd := &heads[j]
			var ci *claimInfo
			var st *stamp[*claimInfo]
			if h.try(len(p.claimSeen)) {
				if s := &p.claimSeen[h.next]; s.v.uid() == hd.uid {
					ci, st = s.v, s // the entry of claims under uid
				}
				h.count(ci != nil)
			}
			if ci == nil && hd.uid != "" {
				ci = p.claims.Get(string(hd.uid))
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
	if c.Object == nil || hd.uid == "" || hd.want < 0 || hd.want > math.MaxInt32 {
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

// scanClaimsByAddress is scanPodsByAddress for the claims. It reads their
// objects in the order of their addresses, then takes them in the order
// of the addresses of their UIDs' bytes.
func (r *round) scanClaimsByAddress(claims []Claim, start int, changed []int, newClaims map[types.UID]struct{}) ([]int, error) {
	p := r.p
	n := len(claims) - start
	sc := getScratch(n)
	defer putScratch(sc)
	objs, addrs, wants := sc.objs[:n], sc.addrs[:n], sc.csorted[:n]
	for j := range n {
		c := &claims[start+j]
		objs[j], wants[j].want, wants[j].priority = c.Object, c.Want, c.Priority
		addrs[j] = objectAddr(c.Object)
	}
	// The objects read in the order of their addresses: byObject[k] is
	// claim first[k]'s head. Each loop reads one kind of thing, so that
	// its cache misses overlap.
	first, byObject, inOrder := byAddress(addrs, sc.order[:n], sc.tmp[:n], sc.keys[:n], &sc.count), sc.cheads[:n], sc.objs2[:n]
	for k, j := range first {
		byObject[k], inOrder[k] = wants[j], objs[j]
	}
	for k, o := range inOrder {
		byObject[k].uid, byObject[k].rv = idOf(o)
		addrs[k] = uintptr(unsafe.Pointer(unsafe.StringData(string(byObject[k].uid))))
	}
	// Then taken in the order of their UIDs.
	then, sorted, order := byAddress(addrs, sc.order2[:n], sc.tmp[:n], sc.keys[:n], &sc.count), sc.csorted[:n], sc.order3[:n]
	for m, k := range then {
		sorted[m], order[m] = byObject[k], first[k]
	}
	take := sc.take[:n]
	err := byAddressPass(order, &p.claimSeen, &p.claims, sc.cmet[:0],
		func(m int) string { return string(sorted[m].uid) },
		func(ci *claimInfo, m int) bool { return ci.uid() == sorted[m].uid },
		func(m int, ci *claimInfo, st *stamp[*claimInfo]) (err error) {
			j := int(order[m])
			take[j], err = r.scanClaim(start+j, &claims[start+j], &sorted[m], ci, st, &newClaims)
			return err
		},
		func() {})
	if err != nil {
		return nil, err
	}
	for j, t := range take {
		if t {
			changed = append(changed, start+j)
		}
	}
	return changed, nil
}

// objectAddr is the address of the object o points to, 0 for nil: the
// pointer an interface value holds, read without following it.
func objectAddr(o client.Object) uintptr {
	if o == nil {
		return 0
	}
	return (*[2]uintptr)(unsafe.Pointer(&o))[1]
}

// scanScratch is the memory of a scan out of order, kept between rounds
// in scratches (a sync.Pool: a collection frees it).
type scanScratch struct {
	pheads, psorted       []podHead
	cheads, csorted       []claimHead
	objs, objs2           []client.Object
	pmet                  []*podInfo
	cmet                  []*claimInfo
	addrs, keys           []uintptr
	count                 [1 << 16]int32
	take                  []bool
	order, order2, order3 []int32
	tmp                   []int32
}

var scratches sync.Pool

// getScratch returns a scratch with room for a listing of n.
func getScratch(n int) *scanScratch {
	if sc, _ := scratches.Get().(*scanScratch); sc != nil && len(sc.take) >= n {
		return sc
	}
	return &scanScratch{
		pheads: make([]podHead, n), psorted: make([]podHead, n),
		cheads: make([]claimHead, n), csorted: make([]claimHead, n),
		objs: make([]client.Object, n), objs2: make([]client.Object, n), pmet: make([]*podInfo, 0, n), cmet: make([]*claimInfo, 0, n),
		addrs: make([]uintptr, n), keys: make([]uintptr, n), take: make([]bool, n),
		order: make([]int32, n), order2: make([]int32, n), order3: make([]int32, n), tmp: make([]int32, n),
	}
}

// putScratch gives sc back, holding nothing of the listing or the pool.
func putScratch(sc *scanScratch) {
	clear(sc.pheads)
	clear(sc.psorted)
	clear(sc.cheads)
	clear(sc.csorted)
	clear(sc.objs)
	clear(sc.objs2)
	clear(sc.pmet[:cap(sc.pmet)])
	clear(sc.cmet[:cap(sc.cmet)])
	scratches.Put(sc)
}

// byAddress returns the indexes of addrs in the order of the addresses,
// zero ones first, equal ones in their order (a stable sort): a radix sort
// of the addresses less the least, sixteen bits a pass, a pass skipped
// where the addresses do not differ (the high bits of a heap's addresses
// seldom do). order, tmp and keys have len(addrs); count is the passes'
// room.
func byAddress(addrs []uintptr, order, tmp []int32, keys []uintptr, count *[1 << 16]int32) []int32 {
	lo, hi := uintptr(math.MaxUint), uintptr(0)
	for _, a := range addrs {
		if a != 0 {
			lo, hi = min(lo, a), max(hi, a)
		}
	}
	for i := range order {
		order[i] = int32(i)
	}
	if hi < lo {
		return order // all zero
	}
	for i, a := range addrs {
		keys[i] = 0
		if a != 0 {
			keys[i] = 1 + a - lo
		}
	}
	const bits = 16
	for shift := uint(0); (hi-lo+1)>>shift > 0; shift += bits {
		clear(count[:])
		for _, k := range keys {
			count[k>>shift&(1<<bits-1)]++
		}
		if count[keys[0]>>shift&(1<<bits-1)] == int32(len(keys)) {
			continue // one digit for all
		}
		sum := int32(0)
		for d := range count {
			count[d], sum = sum, sum+count[d]
		}
		for _, i := range order {
			d := keys[i] >> shift & (1<<bits - 1)
			tmp[count[d]] = i
			count[d]++
		}
		order, tmp = tmp, order
	}
	return order
}
