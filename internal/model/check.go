package model

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/store"
)

// Stores are store snapshots keyed by pool, as Allocator.Store().Snapshot
// returns them.
type Stores map[types.NamespacedName]map[string]store.Holder

// CheckExclusive checks I1: no pod is held by two claims, in the records,
// in the store, or one claim in the store and another in the records. A pod
// the store holds for a claim that is gone (an orphan being recycled)
// counts for that claim.
func CheckExclusive(stores Stores, m *Model) error {
	var errs []error
	owner := make(map[Key]types.UID)
	for _, uid := range slices.Sorted(maps.Keys(m.Claims)) {
		c := m.Claims[uid]
		if c.Gone {
			continue
		}
		for _, p := range sortedKeys(c.Held) {
			key := Key{Namespace: c.Name.Namespace, Name: p}
			if other, dup := owner[key]; dup {
				errs = append(errs, fmt.Errorf("I1: pod %s is in the records of claims %s and %s", key, other, uid))
			}
			owner[key] = uid
		}
	}
	inStore := make(map[Key]types.NamespacedName)
	for _, pool := range sortedPools(stores) {
		for _, pod := range sortedKeys(stores[pool]) {
			h := stores[pool][pod]
			key := Key{Namespace: pool.Namespace, Name: pod}
			if other, dup := inStore[key]; dup {
				errs = append(errs, fmt.Errorf("I1: pod %s is in the store of pools %s and %s", key, other, pool))
			}
			inStore[key] = pool
			if o, ok := owner[key]; ok && o != h.UID {
				errs = append(errs, fmt.Errorf("I1: pod %s is held by %s in the store and by uid %s in the records", key, h, o))
			}
		}
	}
	return errors.Join(errs...)
}

// CheckDurable checks I4 for one pool: the store shows exactly the pods the
// records of the pool's existing claims hold. Pods the store holds for a
// claim that is gone (orphans being recycled) are not compared.
func CheckDurable(pool types.NamespacedName, snap map[string]store.Holder, m *Model) error {
	var errs []error
	for _, pod := range sortedKeys(snap) {
		h := snap[pod]
		c := m.Claims[h.UID]
		switch {
		case c == nil:
			errs = append(errs, fmt.Errorf("I4: pool %s: store holds pod %s for unknown claim %s", pool, pod, h))
		case c.Gone:
		case !c.Held[pod]:
			errs = append(errs, fmt.Errorf("I4: pool %s: store holds pod %s for %s, whose record does not (held %v)", pool, pod, h, sortedKeys(c.Held)))
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(m.Claims)) {
		c := m.Claims[uid]
		if c.Gone || c.Pool != pool {
			continue
		}
		for _, p := range sortedKeys(c.Held) {
			if h, ok := snap[p]; !ok || h.UID != uid {
				errs = append(errs, fmt.Errorf("I4: pool %s: record of claim %s (uid %s) holds pod %s, the store has %v (held=%t)", pool, c.Name, uid, p, h, ok))
			}
		}
	}
	return errors.Join(errs...)
}

// CheckFreed checks the second half of I4 and I6 for one pool between two
// snapshots of the same store: a pod that left the store is clean, that is
// recycled and then recorded released (or its claim is gone).
func CheckFreed(pool types.NamespacedName, before, after map[string]store.Holder, m *Model) error {
	var errs []error
	for _, pod := range sortedKeys(before) {
		h := before[pod]
		if now, ok := after[pod]; ok && now.UID == h.UID {
			continue
		}
		key := Key{Namespace: pool.Namespace, Name: pod}
		if d := m.Dirty[key]; d != nil && d.Claim == h.UID {
			errs = append(errs, fmt.Errorf("I4/I6: pool %s: store freed pod %s of %s before it was recycled (%t) and recorded released", pool, pod, h, d.Recycled))
		}
	}
	return errors.Join(errs...)
}

// CheckIsolated checks I9: a pool's store holds only pods of that pool, for
// claims of that pool, and every record holds only pods of its claim's
// pool.
func CheckIsolated(stores Stores, m *Model) error {
	var errs []error
	for _, pool := range sortedPools(stores) {
		for _, pod := range sortedKeys(stores[pool]) {
			h := stores[pool][pod]
			key := Key{Namespace: pool.Namespace, Name: pod}
			if p := m.Pods[key]; p == nil || p.Pool != pool {
				errs = append(errs, fmt.Errorf("I9: store of pool %s holds pod %s of another pool (%v)", pool, key, p))
			}
			if c := m.Claims[h.UID]; c == nil || c.Pool != pool || h.Claim != c.Name {
				errs = append(errs, fmt.Errorf("I9: store of pool %s holds pod %s for %s, not a claim of the pool", pool, pod, h))
			}
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(m.Claims)) {
		c := m.Claims[uid]
		if c.Gone {
			continue
		}
		for _, p := range sortedKeys(c.Held) {
			key := Key{Namespace: c.Name.Namespace, Name: p}
			if pod := m.Pods[key]; pod == nil || pod.Pool != c.Pool {
				errs = append(errs, fmt.Errorf("I9: record of claim %s (pool %s) holds pod %s of another pool", c.Name, c.Pool, key))
			}
		}
	}
	return errors.Join(errs...)
}

// CheckFinalizers checks I8 on the records: an existing claim whose record
// holds pods carries the allocation finalizer.
func CheckFinalizers(m *Model) error {
	var errs []error
	for _, uid := range slices.Sorted(maps.Keys(m.Claims)) {
		c := m.Claims[uid]
		if !c.Gone && len(c.Held) > 0 && !c.Finalizer {
			errs = append(errs, fmt.Errorf("I8: claim %s (uid %s) holds %v without the allocation finalizer", c.Name, uid, sortedKeys(c.Held)))
		}
	}
	return errors.Join(errs...)
}

// CheckAllocated checks I2 and I8 on one round's result: every pod handed
// out was in the round's pod listing, ready by allocator.PodReady, of the
// pool, and held by no claim before the round (pre; pods in freed were
// released by another round in between); and it went to a claim of the
// listing that was not terminating there.
func CheckAllocated(in allocator.Input, res allocator.Result, pre map[Key]types.UID, freed map[Key]bool, m *Model) error {
	var errs []error
	listed := make(map[string]int, len(in.Pods))
	for i := range in.Pods {
		listed[in.Pods[i].Name] = i
	}
	claims := make(map[types.UID]allocator.Claim, len(in.Claims))
	for _, c := range in.Claims {
		claims[c.Object.GetUID()] = c
	}
	seen := make(map[string]bool)
	for _, g := range res.Allocated {
		c, ok := claims[g.UID]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("I2: pods %v handed to claim %s (uid %s), which is not in the listing", g.Pods, g.Claim, g.UID))
		case c.Object.GetDeletionTimestamp() != nil:
			errs = append(errs, fmt.Errorf("I8: pods %v handed to claim %s, terminating in the listing", g.Pods, g.Claim))
		}
		for _, p := range g.Pods {
			key := Key{Namespace: in.Pool.Namespace, Name: p}
			if seen[p] {
				errs = append(errs, fmt.Errorf("I1: pod %s handed out twice in one round", key))
			}
			seen[p] = true
			i, ok := listed[p]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("I2: pod %s handed to %s is not in the pool's listing", key, g.Claim))
				continue
			case !allocator.PodReady(&in.Pods[i]):
				errs = append(errs, fmt.Errorf("I2: pod %s handed to %s is not ready in the listing", key, g.Claim))
			}
			if pod := m.Pods[key]; pod == nil || pod.Pool != in.Pool {
				errs = append(errs, fmt.Errorf("I2/I9: pod %s handed to %s is not a pod of pool %s", key, g.Claim, in.Pool))
			}
			if h, held := pre[key]; held && !freed[key] {
				errs = append(errs, fmt.Errorf("I2: pod %s handed to %s was held by uid %s before the round", key, g.Claim, h))
			}
		}
	}
	return errors.Join(errs...)
}

// unreleased returns how many pods snap holds for uid that are not in
// recycling.
func unreleased(snap map[string]store.Holder, uid types.UID, recycling map[string]bool) int {
	n := 0
	for pod, h := range snap {
		if h.UID == uid && !recycling[pod] {
			n++
		}
	}
	return n
}

// CheckBounded checks I3 after a round on a listing that was current: each
// live claim of the listing holds at most Want pods besides those being
// recycled (res.Recycling), in the store and in its record.
func CheckBounded(in allocator.Input, res allocator.Result, snap map[string]store.Holder, m *Model) error {
	var errs []error
	recycling := toSet(res.Recycling)
	for _, c := range in.Claims {
		uid := c.Object.GetUID()
		if c.Object.GetDeletionTimestamp() != nil {
			continue
		}
		if n := unreleased(snap, uid, recycling); n > c.Want {
			errs = append(errs, fmt.Errorf("I3: pool %s: claim %s holds %d unreleased pods in the store, wants %d",
				in.Pool, c.Object.GetName(), n, c.Want))
		}
		if mc := m.Claims[uid]; mc != nil && !mc.Gone {
			n := 0
			for p := range mc.Held {
				if !recycling[p] {
					n++
				}
			}
			if n > c.Want {
				errs = append(errs, fmt.Errorf("I3: pool %s: record of claim %s holds %d unreleased pods, wants %d",
					in.Pool, c.Object.GetName(), n, c.Want))
			}
		}
	}
	return errors.Join(errs...)
}

// UnmetDemand is the shortfall a round on in should report, given the
// store after it and the pods it left recycling: the sum over the live
// claims of the listing of Want minus the pods each holds that are not
// being recycled, where positive. It equals the allocator's Shortfall
// (the algorithm's unmet demand) whenever every write of the round
// succeeded.
func UnmetDemand(in allocator.Input, res allocator.Result, snap map[string]store.Holder) int {
	recycling := toSet(res.Recycling)
	total := 0
	for _, c := range in.Claims {
		if c.Object.GetDeletionTimestamp() != nil {
			continue
		}
		if n := unreleased(snap, c.Object.GetUID(), recycling); n < c.Want {
			total += c.Want - n
		}
	}
	return total
}

// CheckShortfall checks the second half of I3: res.Shortfall equals
// UnmetDemand. Call it only for rounds whose writes all succeeded.
func CheckShortfall(in allocator.Input, res allocator.Result, snap map[string]store.Holder) error {
	if want := UnmetDemand(in, res, snap); res.Shortfall != want {
		return fmt.Errorf("I3: pool %s: shortfall %d, unmet demand of live claims %d", in.Pool, res.Shortfall, want)
	}
	// And by class: the unmet demand of the claims of each class.
	recycling := toSet(res.Recycling)
	var byClass map[string]int
	for _, c := range in.Claims {
		if c.Object.GetDeletionTimestamp() != nil {
			continue
		}
		if n := unreleased(snap, c.Object.GetUID(), recycling); n < c.Want {
			if byClass == nil {
				byClass = make(map[string]int)
			}
			byClass[c.Placement.Class] += c.Want - n
		}
	}
	if !maps.Equal(res.ShortfallByClass, byClass) {
		return fmt.Errorf("I3: pool %s: shortfall by class %v, unmet demand of live claims by class %v", in.Pool, res.ShortfallByClass, byClass)
	}
	return nil
}

// CheckRecovered checks I5 for one pool: after a restart and the new
// allocator's first round, the store equals the store before the restart
// with that round's releases and allocations applied. Pods of either store
// for which skip (if not nil) is true are not compared.
func CheckRecovered(pool types.NamespacedName, before, after map[string]store.Holder, res allocator.Result, skip func(h store.Holder, pod string) bool) error {
	want := maps.Clone(before)
	after = maps.Clone(after)
	for _, m := range []map[string]store.Holder{want, after} {
		for pod, h := range m {
			if skip != nil && skip(h, pod) {
				delete(m, pod)
			}
		}
	}
	for _, g := range res.Released {
		for _, p := range g.Pods {
			if h, ok := want[p]; ok && h.UID == g.UID {
				delete(want, p)
			}
		}
	}
	for _, g := range res.Allocated {
		for _, p := range g.Pods {
			want[p] = store.Holder{UID: g.UID, Claim: g.Claim}
		}
	}
	var errs []error
	for _, p := range slices.Sorted(maps.Keys(want)) {
		if got, ok := after[p]; !ok || got != want[p] {
			errs = append(errs, fmt.Errorf("I5: pool %s: pod %s held by %s before the restart, after it %v (held=%t)", pool, p, want[p], got, ok))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(after)) {
		if _, ok := want[p]; !ok {
			errs = append(errs, fmt.Errorf("I5: pool %s: pod %s held by %s after the restart, by nobody before", pool, p, after[p]))
		}
	}
	return errors.Join(errs...)
}

func sortedPools(s Stores) []types.NamespacedName {
	return slices.SortedFunc(maps.Keys(s), func(a, b types.NamespacedName) int {
		if a.Namespace != b.Namespace {
			if a.Namespace < b.Namespace {
				return -1
			}
			return 1
		}
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
}
