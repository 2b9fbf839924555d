package store

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// Sorted is an AllocationStore that keeps each pool as one slice of (pod,
// holder) rows sorted by pod name, found by binary search, plus a tally of
// pods per claim. It is an implementation independent of InMemory, written
// to be simple to check: a second store for the conformance suite to run
// against, usable for small pools.
//
// HolderOf costs O(log n) for a pool of n held pods, Count O(1). Allocate
// and Free sort the call's pods and merge them into, or out of, the pool's
// rows in one pass: O(n + k log k) for k pods, so a call on a large pool
// costs a copy of its rows. Held and Snapshot scan the pool's rows;
// Holders scans its claims. With 50,000 pods held, an Allocate and a Free
// of 4 pods take a few hundred microseconds together, against about one
// for InMemory (BenchmarkAllocateFree): prefer InMemory for large pools.
//
// Locking: the pool table's read lock is held for the whole of every call
// that concerns one pool, and each pool has a lock of its own, so calls on
// different pools run in parallel. The table's write lock is taken only to
// add a pool (its first successful Allocate) and to remove one
// (DeletePool); it therefore waits for the calls in flight on every pool,
// and no call ever sees a pool that DeletePool removed.
//
// Beyond the AllocationStore contract, Sorted behaves as InMemory does: it
// checks every argument before looking at the pool, so ErrInvalidArgument
// wins over ErrPodHeld and ErrNotHeld; it refuses with ErrInvalidArgument
// an Allocate whose h.UID already holds pods in the pool under a different
// h.Claim; when several pods of a call are at fault, the error names the
// first in the order given; and a call with no pods (with a non-empty UID)
// changes nothing and succeeds.
//
// The zero value is an empty store ready to use. A Sorted must not be
// copied after first use.
type Sorted struct {
	// mu guards the pools map itself. Every method that concerns one pool
	// holds mu's read lock while it uses that pool's sortedPool, so a
	// sortedPool in the map is never removed under a call using it. The
	// write lock is held to add or remove an entry, and then the holder
	// may use the sortedPool without its lock. Lock order: mu before a
	// sortedPool's mu.
	mu sync.RWMutex

	// pools is guarded by mu. An entry is added by a pool's first
	// successful Allocate and removed only by DeletePool.
	pools map[types.NamespacedName]*sortedPool
}

var _ AllocationStore = (*Sorted)(nil)

// NewSorted returns an empty Sorted store.
func NewSorted() *Sorted {
	return &Sorted{pools: make(map[types.NamespacedName]*sortedPool)}
}

// sortedPool is one pool of a Sorted store. Its fields are guarded by mu,
// or by the store's write lock alone.
type sortedPool struct {
	mu sync.RWMutex

	// rows are the held pods, sorted by pod name, no name twice.
	rows []row

	// tally: claim UID → its Holder and how many rows name it. An entry
	// exists exactly while that count is above zero.
	tally map[types.UID]tallied
}

// row records that holder holds pod.
type row struct {
	pod    string
	holder Holder
}

// tallied is one claim's entry in sortedPool.tally.
type tallied struct {
	holder Holder
	pods   int
}

// find returns the index of pod's row, or where it would go, and whether
// pod is held.
func (p *sortedPool) find(pod string) (int, bool) {
	return slices.BinarySearchFunc(p.rows, pod, func(r row, pod string) int {
		return strings.Compare(r.pod, pod)
	})
}

// sortedArgs checks a Writer call's pod names and returns them sorted, in
// a new slice: the caller's is neither sorted in place nor kept.
func sortedArgs(pool types.NamespacedName, pods []string) ([]string, error) {
	if i := slices.Index(pods, ""); i >= 0 {
		return nil, fmt.Errorf("pool %s: pod at index %d: %w: the pod name is empty", pool, i, ErrInvalidArgument)
	}
	byName := slices.Clone(pods)
	slices.Sort(byName)
	for i := 1; i < len(byName); i++ {
		if byName[i] == byName[i-1] {
			// Name the repeat that comes first in the caller's order.
			return nil, fmt.Errorf("pool %s: pod %s: %w: the pod is listed twice", pool, firstRepeat(pods), ErrInvalidArgument)
		}
	}
	return byName, nil
}

// firstRepeat returns the first name in pods that an earlier one repeats;
// the caller knows there is one.
func firstRepeat(pods []string) string {
	seen := make(map[string]bool, len(pods))
	for _, pod := range pods {
		if seen[pod] {
			return pod
		}
		seen[pod] = true
	}
	return ""
}

// Allocate records that h holds pods in pool, all or nothing. See
// Writer.Allocate and the Sorted type documentation.
func (s *Sorted) Allocate(pool types.NamespacedName, h Holder, pods []string) error {
	if h.UID == "" {
		return fmt.Errorf("pool %s: claim %s: %w: the claim UID is empty", pool, h.Claim, ErrInvalidArgument)
	}
	byName, err := sortedArgs(pool, pods)
	if err != nil || len(byName) == 0 {
		return err
	}
	s.mu.RLock()
	if p := s.pools[pool]; p != nil {
		p.mu.Lock()
		err := p.allocate(pool, h, pods, byName)
		p.mu.Unlock()
		s.mu.RUnlock()
		return err
	}
	s.mu.RUnlock()

	// The pool is new, or was until another call added it: decide under
	// the write lock, which excludes every other call.
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pools[pool]; p != nil {
		return p.allocate(pool, h, pods, byName)
	}
	p := &sortedPool{tally: make(map[types.UID]tallied)}
	if err := p.allocate(pool, h, pods, byName); err != nil {
		return err
	}
	if s.pools == nil {
		s.pools = make(map[types.NamespacedName]*sortedPool)
	}
	s.pools[pool] = p
	return nil
}

// allocate does Allocate's work on p, whose lock the caller holds (or the
// store's write lock). pods is the caller's argument, byName the same
// names sorted, checked for empty names and repeats.
func (p *sortedPool) allocate(pool types.NamespacedName, h Holder, pods, byName []string) error {
	t, known := p.tally[h.UID]
	if known && t.holder != h {
		return fmt.Errorf("pool %s: claim %s: %w: its UID %s holds pods in this pool as claim %s",
			pool, h.Claim, ErrInvalidArgument, h.UID, t.holder.Claim)
	}
	for _, pod := range pods {
		if i, held := p.find(pod); held {
			return &HeldError{Pool: pool, Pod: pod, Holder: p.rows[i].holder}
		}
	}

	// Merge from the back: grow rows by len(byName), then fill the new
	// end with whichever of the old rows and the new pods sorts last.
	old := len(p.rows)
	p.rows = slices.Grow(p.rows, len(byName))[:old+len(byName)]
	i, j := old-1, len(byName)-1
	for w := len(p.rows) - 1; j >= 0; w-- {
		if i >= 0 && p.rows[i].pod > byName[j] {
			p.rows[w] = p.rows[i]
			i--
		} else {
			p.rows[w] = row{pod: byName[j], holder: h}
			j--
		}
	}
	p.tally[h.UID] = tallied{holder: h, pods: t.pods + len(byName)}
	return nil
}

// Free records that the claim with uid no longer holds pods in pool, all
// or nothing. See Writer.Free and the Sorted type documentation.
func (s *Sorted) Free(pool types.NamespacedName, uid types.UID, pods []string) error {
	if uid == "" {
		return fmt.Errorf("pool %s: %w: the claim UID is empty", pool, ErrInvalidArgument)
	}
	byName, err := sortedArgs(pool, pods)
	if err != nil || len(byName) == 0 {
		return err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	p := s.pools[pool]
	if p == nil {
		return errFreeNotHeld(pool, uid, pods[0], Holder{}, false)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.free(pool, uid, pods, byName)
}

// free does Free's work on p, whose lock the caller holds. pods and
// byName are as for allocate.
func (p *sortedPool) free(pool types.NamespacedName, uid types.UID, pods, byName []string) error {
	for _, pod := range pods {
		i, held := p.find(pod)
		if !held {
			return errFreeNotHeld(pool, uid, pod, Holder{}, false)
		}
		if h := p.rows[i].holder; h.UID != uid {
			return errFreeNotHeld(pool, uid, pod, h, true)
		}
	}

	// Every pod of byName has a row: drop those rows in one pass, from
	// the first of them on.
	w, _ := p.find(byName[0])
	next := 0
	for _, r := range p.rows[w:] {
		if next < len(byName) && r.pod == byName[next] {
			next++
			continue
		}
		p.rows[w] = r
		w++
	}
	clear(p.rows[w:]) // let the names go
	p.rows = p.rows[:w]
	if cap(p.rows) > 64 && len(p.rows) < cap(p.rows)/4 {
		p.rows = slices.Clone(p.rows)
	}

	t := p.tally[uid]
	if t.pods -= len(byName); t.pods == 0 {
		delete(p.tally, uid)
	} else {
		p.tally[uid] = t
	}
	return nil
}

func errFreeNotHeld(pool types.NamespacedName, uid types.UID, pod string, h Holder, held bool) error {
	if held {
		return fmt.Errorf("pool %s: pod %s: %w with UID %s: claim %s holds it", pool, pod, ErrNotHeld, uid, h)
	}
	return fmt.Errorf("pool %s: pod %s: %w with UID %s: no claim holds it", pool, pod, ErrNotHeld, uid)
}

// DeletePool forgets pool. See Writer.DeletePool. It never fails.
func (s *Sorted) DeletePool(pool types.NamespacedName) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pools, pool)
	return nil
}

// read runs fn on pool's rows under the pool's read lock, or returns false
// when the store does not know pool.
func (s *Sorted) read(pool types.NamespacedName, fn func(p *sortedPool)) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p := s.pools[pool]
	if p == nil {
		return false
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	fn(p)
	return true
}

// HolderOf returns the claim holding pod in pool. See Reader.HolderOf. It
// never fails.
func (s *Sorted) HolderOf(pool types.NamespacedName, pod string) (h Holder, ok bool, err error) {
	s.read(pool, func(p *sortedPool) {
		var i int
		if i, ok = p.find(pod); ok {
			h = p.rows[i].holder
		}
	})
	return h, ok, nil
}

// Held returns the pods the claim with uid holds in pool, sorted. See
// Reader.Held. It never fails; it returns nil when the claim holds
// nothing.
func (s *Sorted) Held(pool types.NamespacedName, uid types.UID) (pods []string, err error) {
	s.read(pool, func(p *sortedPool) {
		n := p.tally[uid].pods
		if n == 0 {
			return
		}
		pods = make([]string, 0, n)
		for _, r := range p.rows {
			if r.holder.UID == uid {
				if pods = append(pods, r.pod); len(pods) == n {
					return
				}
			}
		}
	})
	return pods, nil
}

// Count returns how many pods the claim with uid holds in pool. See
// Reader.Count. It never fails and does not allocate.
func (s *Sorted) Count(pool types.NamespacedName, uid types.UID) (n int, err error) {
	s.read(pool, func(p *sortedPool) { n = p.tally[uid].pods })
	return n, nil
}

// Holders returns the claims holding pods in pool, sorted by namespace,
// name, then UID. See Reader.Holders. It never fails; it returns nil when
// no claim holds a pod there.
func (s *Sorted) Holders(pool types.NamespacedName) (hs []Holder, err error) {
	s.read(pool, func(p *sortedPool) {
		for _, t := range p.tally {
			hs = append(hs, t.holder)
		}
	})
	slices.SortFunc(hs, func(a, b Holder) int {
		return cmp.Or(
			strings.Compare(a.Claim.Namespace, b.Claim.Namespace),
			strings.Compare(a.Claim.Name, b.Claim.Name),
			strings.Compare(string(a.UID), string(b.UID)))
	})
	return hs, nil
}

// Snapshot returns a copy of pool's index. See Reader.Snapshot. It never
// fails; the map is never nil.
func (s *Sorted) Snapshot(pool types.NamespacedName) (map[string]Holder, error) {
	var out map[string]Holder
	s.read(pool, func(p *sortedPool) {
		out = make(map[string]Holder, len(p.rows))
		for _, r := range p.rows {
			out[r.pod] = r.holder
		}
	})
	if out == nil {
		out = map[string]Holder{}
	}
	return out, nil
}

// Pools returns the pools with at least one held pod, sorted by namespace,
// then name. See Reader.Pools. It never fails; it returns nil when no pod
// is held anywhere.
func (s *Sorted) Pools() ([]types.NamespacedName, error) {
	var out []types.NamespacedName
	s.mu.RLock()
	for name, p := range s.pools {
		p.mu.RLock()
		if len(p.rows) > 0 {
			out = append(out, name)
		}
		p.mu.RUnlock()
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b types.NamespacedName) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out, nil
}
