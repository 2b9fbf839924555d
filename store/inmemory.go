package store

import (
	"cmp"
	"fmt"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolalloc/poolalloc/internal/blocks"
	"github.com/poolalloc/poolalloc/internal/index"
)

// InMemory is an AllocationStore that keeps its index in memory.
//
// Each pool has its own lock, so calls on different pools do not wait for
// each other; the pool table has a lock of its own that is held only long
// enough to look a pool up (or, on a pool's first Allocate, to add it).
//
// Allocate and HolderOf cost time proportional to the pods in the call,
// not to the pool (AllocateAll, for a BulkWriter, makes its allocations
// under one lock, the pool's index sized for them first), and Free to the pods in the call and those its claim
// holds (a few pods are each found by a scan of the claim's pods, more in
// one pass over them); Count costs constant time and
// allocates nothing; Held sorts only the claim's pods. Snapshot, Holders
// and Pools copy what they return and cost time proportional to the pool
// (Pools: to the number of pools).
//
// A pool's index records each claim's Holder once, and per held pod only a
// pointer to it and the pod's name in the claim's list: about 150 bytes of
// heap per held pod with 50,000 pods held by 40,000 claims, names not
// counted (BenchmarkHeapPerPod).
//
// Beyond the AllocationStore contract, InMemory also refuses with
// ErrInvalidArgument an Allocate whose h.UID already holds pods in the pool
// under a different h.Claim: one UID is one claim. When several pods of an
// Allocate are already held, the *HeldError names the first in the order
// given. Allocating or freeing no pods (with a non-empty UID) changes
// nothing and succeeds.
//
// A pool's index lives from its first Allocate until DeletePool, also while
// it holds no pods; call DeletePool when a pool goes away.
//
// The zero value is an empty store ready to use. An InMemory must not be
// copied after first use.
type InMemory struct {
	// mu guards the pools map itself (lookups, inserts, deletes), not the
	// indexes it points to: each poolIndex has its own lock. Lock order:
	// mu before a poolIndex's mu. No method acquires mu while it holds a
	// poolIndex's mu.
	mu sync.RWMutex

	// pools is guarded by mu. An entry is added by a pool's first Allocate
	// and removed only by DeletePool. Nil until the first Allocate.
	pools map[types.NamespacedName]*poolIndex
}

var (
	_ AllocationStore = (*InMemory)(nil)
	_ BulkWriter      = (*InMemory)(nil)
)

// testHookLookedUp, when not nil, runs in Allocate and Free between looking
// a pool's index up and locking it, so that tests can run DeletePool in
// that window. Set only by tests, never concurrently with a call.
var testHookLookedUp func()

// NewInMemory returns an empty in-memory store.
func NewInMemory() *InMemory {
	return &InMemory{pools: make(map[types.NamespacedName]*poolIndex)}
}

// poolIndex is the index of one pool. All its fields are guarded by mu.
type poolIndex struct {
	mu sync.RWMutex

	// dead is guarded by mu. DeletePool sets it after it removed the index
	// from InMemory.pools. A caller that looked the index up before that
	// reads it as empty; Allocate looks the pool up again instead of
	// writing to a dead index.
	dead bool

	// pods is guarded by mu: pod name → the claim holding it, a pointer
	// to its one Holder, shared by all its pods, instead of a Holder per
	// pod (three string headers, 48 bytes). A pod that no claim holds has
	// no entry. For every entry c of pod, pod is in c.pods and c is
	// claims[c.uid].
	pods map[string]*claimPods

	// claims is guarded by mu: claim UID → what the claim holds. An entry
	// exists exactly while the claim holds at least one pod, and its pods
	// are exactly the pods whose entry points to it.
	claims index.Index[*claimPods]

	// ns is the pool's namespace.
	ns string
}

// claimPods is what one claim holds in one pool. It is guarded by the mu
// of the poolIndex whose claims map holds it.
type claimPods struct {
	// uid, ns and name are the Holder every pod of the claim is recorded
	// with (see holder); ns points to the pool's namespace when the
	// claim's is the same, as it is for the allocator's claims, so that
	// the claim costs no string header for it.
	uid  types.UID
	ns   *string
	name string
	// pods are the names of the pods the claim holds, in no order; never
	// empty while the claim is in its pool's claims. A claim that comes
	// with one pod keeps it in one, which costs no allocation of its own.
	pods []string
	one  [1]string
}

// claimUID is the key of claimPods in poolIndex.claims.
func claimUID(c *claimPods) string { return string(c.uid) }

// holder is the Holder the claim's pods are recorded with.
func (c *claimPods) holder() Holder {
	return Holder{UID: c.uid, Claim: types.NamespacedName{Namespace: *c.ns, Name: c.name}}
}

func newPoolIndex(pool types.NamespacedName) *poolIndex {
	return &poolIndex{
		ns:     pool.Namespace,
		pods:   make(map[string]*claimPods),
		claims: index.New(claimUID, 0),
	}
}

// add records that c holds pod, which no claim holds.
func (p *poolIndex) add(c *claimPods, pod string) {
	p.pods[pod] = c
	c.pods = append(c.pods, pod)
}

// smallFree is the most pods free removes one by one, each found by a scan
// of its claim's pods; more are removed in one pass over them.
const smallFree = 8

// removeAll forgets that c holds pods, each of which it holds, listed once.
// It costs O(len(c.pods)) per pod for a few pods and O(len(c.pods)) in all
// for more, and shrinks the claim's slice when it has become mostly empty.
func (p *poolIndex) removeAll(c *claimPods, pods []string) {
	for _, pod := range pods {
		delete(p.pods, pod)
	}
	if len(pods) <= smallFree {
		for _, pod := range pods {
			i := slices.Index(c.pods, pod)
			last := len(c.pods) - 1
			c.pods[i] = c.pods[last]
			c.pods[last] = "" // let the name go
			c.pods = c.pods[:last]
		}
	} else {
		gone := make(map[string]struct{}, len(pods))
		for _, pod := range pods {
			gone[pod] = struct{}{}
		}
		kept := slices.DeleteFunc(c.pods, func(pod string) bool {
			_, ok := gone[pod]
			return ok
		})
		c.pods = kept // DeleteFunc cleared the tail
	}
	if cap(c.pods) > 16 && len(c.pods) < cap(c.pods)/4 {
		c.pods = slices.Clone(c.pods)
	}
}

// lookup returns pool's index, or nil when the pool has none.
func (s *InMemory) lookup(pool types.NamespacedName) *poolIndex {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pools[pool]
}

// lookupOrCreate returns pool's index, adding an empty one if there is none.
func (s *InMemory) lookupOrCreate(pool types.NamespacedName) *poolIndex {
	if p := s.lookup(pool); p != nil {
		return p
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pools[pool]; p != nil {
		return p
	}
	if s.pools == nil {
		s.pools = make(map[types.NamespacedName]*poolIndex)
	}
	p := newPoolIndex(pool)
	s.pools[pool] = p
	return p
}

// Allocate records that h holds pods in pool, all or nothing. See
// Writer.Allocate and the InMemory type documentation.
func (s *InMemory) Allocate(pool types.NamespacedName, h Holder, pods []string) error {
	if err := checkAllocate(pool, h, pods); err != nil {
		return err
	}
	if len(pods) == 0 {
		return nil
	}
	var err error
	s.write(pool, func(p *poolIndex) { err = p.allocate(pool, h, pods, nil) })
	return err
}

// write runs f on pool's live index, made if the store has none, under
// the index's lock.
func (s *InMemory) write(pool types.NamespacedName, f func(p *poolIndex)) {
	for {
		p := s.lookupOrCreate(pool)
		if testHookLookedUp != nil {
			testHookLookedUp()
		}
		p.mu.Lock()
		if p.dead {
			// DeletePool removed this index after we looked it up; a
			// write here would be lost. Look the pool up again.
			p.mu.Unlock()
			continue
		}
		f(p)
		p.mu.Unlock()
		return
	}
}

// AllocateAll makes allocs in order under one lock, the pool's index
// sized for them first. See BulkWriter.AllocateAll.
func (s *InMemory) AllocateAll(pool types.NamespacedName, allocs []Allocation) (int, error) {
	pods := 0
	for _, a := range allocs {
		pods += len(a.Pods)
	}
	if pods == 0 {
		// As many Allocates of no pods: only the arguments are checked.
		for k, a := range allocs {
			if err := checkAllocate(pool, a.Holder, a.Pods); err != nil {
				return k, err
			}
		}
		return len(allocs), nil
	}
	var (
		k   int
		err error
	)
	s.write(pool, func(p *poolIndex) { k, err = p.allocateAll(pool, allocs, pods) })
	return k, err
}

// allocateAll does AllocateAll's work on a live index, whose lock the
// caller holds; pods is how many pods allocs hold in all.
func (p *poolIndex) allocateAll(pool types.NamespacedName, allocs []Allocation, pods int) (int, error) {
	if len(p.pods) == 0 {
		p.pods = make(map[string]*claimPods, pods)
	}
	p.claims.Grow(p.claims.Len() + len(allocs))
	// The claims' entries come from blocks (a recovery writes thousands).
	var made blocks.Blocks[claimPods]
	for k, a := range allocs {
		if err := checkAllocate(pool, a.Holder, a.Pods); err != nil {
			return k, err
		}
		if len(a.Pods) == 0 {
			continue
		}
		if err := p.allocate(pool, a.Holder, a.Pods, func() *claimPods { return made.Next(len(allocs) - k) }); err != nil {
			return k, err
		}
	}
	return len(allocs), nil
}

// allocate does Allocate's work on a live index. The caller holds p.mu and
// has checked h.UID and the pod names for emptiness. A new claim's entry
// comes from fresh (nil: new), which must return a zeroed entry.
//
// It inserts the pods one by one and, at the first pod already present,
// removes what it inserted, so that the common (successful) path does one
// lookup and two inserts per pod and allocates nothing for the duplicate
// check. A pod listed twice is found present at its second occurrence, so
// every call with a duplicate takes the error path, where the duplicate
// check runs before the conflict is reported: an invalid argument wins
// over a held pod, as if the arguments had been checked first.
func (p *poolIndex) allocate(pool types.NamespacedName, h Holder, pods []string, fresh func() *claimPods) error {
	c := p.claims.Get(string(h.UID))
	known := c != nil
	if known && c.holder() != h {
		return fmt.Errorf("pool %s: claim %s: %w: UID %s already holds pods in this pool as claim %s",
			pool, h.Claim, ErrInvalidArgument, h.UID, c.holder().Claim)
	}
	if !known {
		if fresh != nil {
			c = fresh()
		} else {
			c = new(claimPods)
		}
		c.uid, c.ns, c.name = h.UID, &p.ns, h.Claim.Name
		if len(pods) == 1 {
			c.pods = c.one[:0]
		} else {
			c.pods = make([]string, 0, len(pods))
		}
		if h.Claim.Namespace != p.ns {
			ns := h.Claim.Namespace
			c.ns = &ns
		}
	}
	for i, pod := range pods {
		if e, held := p.pods[pod]; held {
			// pods[:i] were appended to c.pods, in order, by this call
			// (a repeat among them would have stopped us there).
			for _, done := range pods[:i] {
				delete(p.pods, done)
			}
			kept := len(c.pods) - i
			clear(c.pods[kept:])
			c.pods = c.pods[:kept]
			if dup, ok := firstDuplicate(pods); ok {
				return errListedTwice(pool, dup)
			}
			return &HeldError{Pool: pool, Pod: pod, Holder: e.holder()}
		}
		p.add(c, pod)
	}
	if !known {
		p.claims.Set(c)
	}
	return nil
}

// Free records that the claim with uid no longer holds pods in pool, all
// or nothing. See Writer.Free.
func (s *InMemory) Free(pool types.NamespacedName, uid types.UID, pods []string) error {
	if uid == "" {
		return fmt.Errorf("pool %s: %w: empty claim UID", pool, ErrInvalidArgument)
	}
	if err := checkNames(pool, pods); err != nil {
		return err
	}
	if len(pods) == 0 {
		return nil
	}
	p := s.lookup(pool)
	if p == nil {
		return errNotHeldOrDuplicate(pool, uid, pods, pods[0], Holder{}, false)
	}
	if testHookLookedUp != nil {
		testHookLookedUp()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead {
		// DeletePool ran after the lookup: the pool is empty.
		return errNotHeldOrDuplicate(pool, uid, pods, pods[0], Holder{}, false)
	}
	return p.free(pool, uid, pods)
}

// free does Free's work on a live index. The caller holds p.mu and has
// checked uid and the pod names for emptiness. It checks every pod before
// it changes anything.
func (p *poolIndex) free(pool types.NamespacedName, uid types.UID, pods []string) error {
	c := p.claims.Get(string(uid))
	known := c != nil
	for _, pod := range pods {
		e, held := p.pods[pod]
		if !known || !held || e != c {
			var holder Holder
			if held {
				holder = e.holder()
			}
			return errNotHeldOrDuplicate(pool, uid, pods, pod, holder, held)
		}
	}
	if dup, ok := firstDuplicate(pods); ok {
		return errListedTwice(pool, dup)
	}
	p.removeAll(c, pods)
	if len(c.pods) == 0 {
		p.claims.Del(string(uid))
	}
	return nil
}

// HolderOf returns the claim holding pod in pool. See
// Reader.HolderOf. It never fails.
func (s *InMemory) HolderOf(pool types.NamespacedName, pod string) (Holder, bool, error) {
	p := s.lookup(pool)
	if p == nil {
		return Holder{}, false, nil
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	e, ok := p.pods[pod] // a dead index has no pods
	if !ok {
		return Holder{}, false, nil
	}
	return e.holder(), true, nil
}

// Held returns the pods the claim with uid holds in pool, sorted. See
// Reader.Held. It never fails; it returns nil when the claim
// holds nothing.
func (s *InMemory) Held(pool types.NamespacedName, uid types.UID) ([]string, error) {
	p := s.lookup(pool)
	if p == nil {
		return nil, nil
	}
	p.mu.RLock()
	c := p.claims.Get(string(uid))
	ok := c != nil
	if !ok {
		p.mu.RUnlock()
		return nil, nil
	}
	out := slices.Clone(c.pods)
	p.mu.RUnlock()
	slices.Sort(out)
	return out, nil
}

// Count returns how many pods the claim with uid holds in pool. See
// Reader.Count. It never fails and does not allocate.
func (s *InMemory) Count(pool types.NamespacedName, uid types.UID) (int, error) {
	p := s.lookup(pool)
	if p == nil {
		return 0, nil
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	c := p.claims.Get(string(uid)) // a dead index has no claims
	ok := c != nil
	if !ok {
		return 0, nil
	}
	return len(c.pods), nil
}

// Holders returns the claims holding pods in pool, sorted by namespace,
// name, then UID. See Reader.Holders. It never fails; it returns
// nil when no claim holds a pod there.
func (s *InMemory) Holders(pool types.NamespacedName) ([]Holder, error) {
	p := s.lookup(pool)
	if p == nil {
		return nil, nil
	}
	p.mu.RLock()
	if p.claims.Len() == 0 {
		p.mu.RUnlock()
		return nil, nil
	}
	out := make([]Holder, 0, p.claims.Len())
	for c := range p.claims.All() {
		out = append(out, c.holder())
	}
	p.mu.RUnlock()
	slices.SortFunc(out, compareHolders)
	return out, nil
}

// Snapshot returns a copy of pool's index. See Reader.Snapshot.
// It never fails; the map is never nil.
func (s *InMemory) Snapshot(pool types.NamespacedName) (map[string]Holder, error) {
	p := s.lookup(pool)
	if p == nil {
		return map[string]Holder{}, nil
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make(map[string]Holder, len(p.pods)) // a dead index has no pods
	for pod, e := range p.pods {
		out[pod] = e.holder()
	}
	return out, nil
}

// DeletePool forgets pool. See Writer.DeletePool. It never fails.
func (s *InMemory) DeletePool(pool types.NamespacedName) error {
	s.mu.Lock()
	p := s.pools[pool]
	delete(s.pools, pool)
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	// Callers that looked p up before the delete may still lock it. Mark it
	// dead and empty it so that they read nothing and write nothing.
	p.mu.Lock()
	p.dead = true
	p.pods = nil
	p.claims = index.Index[*claimPods]{}
	p.mu.Unlock()
	return nil
}

// Pools returns the pools with at least one held pod, sorted by namespace,
// then name. See Reader.Pools. It never fails; it returns nil when
// no pod is held anywhere.
func (s *InMemory) Pools() ([]types.NamespacedName, error) {
	s.mu.RLock()
	var out []types.NamespacedName
	for name, p := range s.pools {
		p.mu.RLock()
		if len(p.pods) > 0 {
			out = append(out, name)
		}
		p.mu.RUnlock()
	}
	s.mu.RUnlock()
	slices.SortFunc(out, comparePools)
	return out, nil
}

func compareHolders(a, b Holder) int {
	if c := comparePools(a.Claim, b.Claim); c != 0 {
		return c
	}
	return cmp.Compare(a.UID, b.UID)
}

func comparePools(a, b types.NamespacedName) int {
	if c := cmp.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return cmp.Compare(a.Name, b.Name)
}

// checkAllocate checks Allocate's arguments: a UID, and no empty name.
func checkAllocate(pool types.NamespacedName, h Holder, pods []string) error {
	if h.UID == "" {
		return fmt.Errorf("pool %s: claim %s: %w: empty claim UID", pool, h.Claim, ErrInvalidArgument)
	}
	return checkNames(pool, pods)
}

// checkNames reports the first empty pod name in pods.
func checkNames(pool types.NamespacedName, pods []string) error {
	for i, pod := range pods {
		if pod == "" {
			return fmt.Errorf("pool %s: pod at index %d: %w: empty pod name", pool, i, ErrInvalidArgument)
		}
	}
	return nil
}

// errNotHeldOrDuplicate builds Free's error for pod, which the claim with
// uid does not hold (holder and held tell who does). A pod listed twice in
// pods takes precedence, as an invalid argument.
func errNotHeldOrDuplicate(pool types.NamespacedName, uid types.UID, pods []string, pod string, holder Holder, held bool) error {
	if dup, ok := firstDuplicate(pods); ok {
		return errListedTwice(pool, dup)
	}
	if !held {
		return fmt.Errorf("pool %s: pod %s: %w with UID %s: it is held by no claim", pool, pod, ErrNotHeld, uid)
	}
	return fmt.Errorf("pool %s: pod %s: %w with UID %s: it is held by claim %s", pool, pod, ErrNotHeld, uid, holder)
}

func errListedTwice(pool types.NamespacedName, pod string) error {
	return fmt.Errorf("pool %s: pod %s: %w: pod listed twice", pool, pod, ErrInvalidArgument)
}

// smallDuplicateScan is the length up to which firstDuplicate compares
// pairs instead of building a set: no allocation, and fast at this size.
const smallDuplicateScan = 32

// firstDuplicate returns the first name in pods that repeats an earlier
// one. It runs only on error paths.
func firstDuplicate(pods []string) (string, bool) {
	if len(pods) <= smallDuplicateScan {
		for i := 1; i < len(pods); i++ {
			if slices.Contains(pods[:i], pods[i]) {
				return pods[i], true
			}
		}
		return "", false
	}
	seen := make(map[string]struct{}, len(pods))
	for _, pod := range pods {
		if _, ok := seen[pod]; ok {
			return pod, true
		}
		seen[pod] = struct{}{}
	}
	return "", false
}
