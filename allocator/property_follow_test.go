package allocator_test

// The event-driven path in the single-allocator machine (issue 24): a
// follow.Follower on the machine's allocator, fed events made from the
// world as an informer would deliver them, and badly: current versions,
// versions older than ones already delivered (a lagging or replaying
// source), events missed altogether, departures, and relists that replay
// every object. Its Syncs run Update on what was delivered, or Round on a
// listing. The invariants checked after every step (records against the
// model, exclusivity, isolation, durability, freeing) hold through it as
// through full listings; a Sync that listed the pool is checked as a fresh
// round.

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/allocator/follow"
	"github.com/poolalloc/poolalloc/internal/model"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/store"
)

// newFollower gives the machine's allocator a Follower, as a restarted
// process would make anew. Its resync is the quarantine: advanceClock
// makes the next Sync of every pool list it.
func (m *machine) newFollower() {
	f, err := follow.New(follow.Config{
		Allocator: m.a,
		PodPool: func(pod *corev1.Pod) types.NamespacedName {
			if p := pod.Labels[testenv.PoolLabel]; p != "" {
				return types.NamespacedName{Namespace: pod.Namespace, Name: p}
			}
			return types.NamespacedName{}
		},
		ClaimPool: func(o client.Object) types.NamespacedName {
			if cl, ok := o.(*testenv.Claim); ok && cl.Spec.PoolRef != "" {
				return types.NamespacedName{Namespace: cl.Namespace, Name: cl.Spec.PoolRef}
			}
			return types.NamespacedName{}
		},
		Claim: func(o client.Object) allocator.Claim {
			cl := o.(*testenv.Claim)
			return allocator.Claim{Want: int(cl.Spec.Replicas), Priority: cl.Spec.Priority, Placement: cl.Spec.Placement()}
		},
		List: func(_ context.Context, pool types.NamespacedName) (allocator.Input, error) {
			in := m.list(pool)
			m.followListed = &in
			return in, nil
		},
		Resync: allocator.DefaultQuarantine,
		Now:    m.clock.Now,
	})
	m.must(err, "follow.New")
	m.f = f
	m.delivered = make(map[types.NamespacedName]*allocator.Input)
}

// followEvents delivers events of one pool: each current object's event
// is delivered or missed, some objects are delivered at a version an
// earlier listing showed (stale), objects gone since the last delivery
// are delivered as departures or missed, all in a drawn order.
func (m *machine) followEvents(t *rapid.T) {
	pool := m.pickPool(t)
	m.deliver(t, pool, false)
}

// followRelist delivers every object of a pool and every departure, as an
// informer's relist does (a delete whose final state was missed is a
// departure of the last state known).
func (m *machine) followRelist(t *rapid.T) {
	pool := m.pickPool(t)
	m.deliver(t, pool, true)
}

func (m *machine) deliver(t *rapid.T, pool types.NamespacedName, all bool) {
	cur, err := world.Input(m.ctx, m.b.raw, pool)
	m.must(err, "list pool")
	var older *allocator.Input // an earlier listing, for stale versions
	for i := len(m.replays) - 1; i >= 0; i-- {
		if m.replays[i].Pool == pool {
			older = &m.replays[i]
			break
		}
	}
	var evs []func()
	listed := make(map[string]bool, len(cur.Pods))
	for i := range cur.Pods {
		pod := &cur.Pods[i]
		listed[pod.Name] = true
		evs = append(evs, func() { m.f.OnPod(nil, pod) })
	}
	uids := make(map[types.UID]bool, len(cur.Claims))
	for _, c := range cur.Claims {
		uids[c.Object.GetUID()] = true
		evs = append(evs, func() { m.f.OnClaim(nil, c.Object); m.given(c.Object) })
	}
	if last := m.delivered[pool]; last != nil {
		for i := range last.Pods {
			if pod := &last.Pods[i]; !listed[pod.Name] {
				evs = append(evs, func() { m.f.OnPod(pod, nil) })
			}
		}
		for _, c := range last.Claims {
			if !uids[c.Object.GetUID()] {
				evs = append(evs, func() { m.f.OnClaim(c.Object, nil) })
			}
		}
	}
	if !all && older != nil {
		for i := range older.Pods {
			pod := &older.Pods[i]
			evs = append(evs, func() { m.f.OnPod(nil, pod) })
		}
		for _, c := range older.Claims {
			if _, typed := c.Object.(*testenv.Claim); typed {
				evs = append(evs, func() { m.f.OnClaim(nil, c.Object); m.given(c.Object) })
			}
		}
	}
	order := rapid.Permutation(indexes(len(evs))).Draw(t, "event order")
	n := 0
	for _, i := range order {
		if all || rapid.IntRange(0, 2).Draw(t, "deliver (0: missed)") > 0 {
			evs[i]()
			n++
		}
	}
	m.delivered[pool] = &cur
	t.Logf("delivered %d of %d events of %s (relist %t)", n, len(evs), pool, all)
}

// given notes that the allocator was given claim o (an event delivered to
// its Follower), as a listing does for the I7 check of afterRound: the
// newest version given, and what it wants.
func (m *machine) given(o client.Object) {
	cl, typed := o.(*testenv.Claim)
	if !typed {
		return // the Follower takes typed claims only
	}
	uid, rv := o.GetUID(), rvOf(o)
	if best, seen := m.bestRV[uid]; !seen || rv >= best {
		m.bestRV[uid], m.bestWant[uid] = rv, int(cl.Spec.Replicas)
	}
}

// deliverPods delivers the current version of every pod of pool, and the
// departure of every pod of the pool that no longer exists (whatever was
// delivered or missed of it before).
func (m *machine) deliverPods(pool types.NamespacedName) {
	cur, err := world.Input(m.ctx, m.b.raw, pool)
	m.must(err, "list pool")
	for i := range cur.Pods {
		m.f.OnPod(nil, &cur.Pods[i])
	}
	for key, pod := range m.m.Pods {
		if pod.Pool == pool && !pod.Exists {
			gone := &corev1.Pod{}
			gone.Namespace, gone.Name = key.Namespace, key.Name
			gone.Labels = map[string]string{testenv.PoolLabel: pool.Name}
			m.f.OnPod(gone, nil)
		}
	}
}

func indexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// followSync runs the Follower's Sync on a pool. A Sync that listed the
// pool is a fresh round and checked as one; an Update on delivered events
// is checked for what holds of any round.
func (m *machine) followSync(t *rapid.T) {
	pool := m.pickPool(t)
	if !m.marks {
		// Without pod marks nothing fences a pod that changed after the
		// allocator's view of it (a lagging listing alike): the README
		// promises I2 only for a current view of the pods then. Their
		// events are delivered up to now; claims' events may still lag.
		m.deliverPods(pool)
	}
	pre := m.preHolders()
	newest := m.newest()
	m.followListed = nil
	res, full, err := m.f.Sync(m.ctx, pool)
	m.stats.rounds.Add(1)
	errOut := m.drain()
	t.Logf("follow sync %s (full %t): allocated %v released %v recycling %v err %v", pool, full, res.Allocated, res.Released, res.Recycling, err)
	if full {
		if m.followListed == nil {
			m.fatalf("follow sync %s: a full Sync did not list the pool", pool)
		}
		m.afterRound(*m.followListed, res, err, true, false, pre, nil, errOut, newest)
		return
	}
	m.afterUpdate(pool, res, err, pre, errOut)
}

// afterUpdate checks an Update on events: no unexpected error, warnings
// as documented, and every pod handed out was a pod of the pool that no
// claim held, handed to a live claim of the pool, once.
func (m *machine) afterUpdate(pool types.NamespacedName, res allocator.Result, err error, pre map[model.Key]types.UID, errOut map[types.NamespacedName]bool) {
	m.t.Helper()
	for _, bad := range []error{allocator.ErrPoolBlocked, allocator.ErrPlan, allocator.ErrInvalidInput,
		store.ErrPodHeld, store.ErrNotHeld, store.ErrInvalidArgument} {
		if errors.Is(err, bad) {
			m.fatalf("update on %s: unexpected error: %v", pool, err)
		}
	}
	for _, w := range res.Warnings {
		if !errors.Is(w, allocator.ErrUntrustedRecord) && !errors.Is(w, allocator.ErrInvalidRelease) && !errors.Is(w, allocator.ErrWrite) {
			m.fatalf("update on %s: warning matching no sentinel: %v", pool, w)
		}
	}
	if errOut[pool] {
		m.pending[pool] = m.clock.Now()
	}
	var errs []error
	seen := make(map[string]bool)
	for _, g := range res.Allocated {
		c := m.m.Claims[g.UID]
		if c == nil || c.Pool != pool {
			errs = append(errs, fmt.Errorf("I2: pods %v handed to %s, not a claim of pool %s", g.Pods, g.Claim, pool))
		}
		for _, p := range g.Pods {
			key := model.Key{Namespace: pool.Namespace, Name: p}
			if seen[p] {
				errs = append(errs, fmt.Errorf("I1: pod %s handed out twice in one round", key))
			}
			seen[p] = true
			if pod := m.m.Pods[key]; pod == nil || pod.Pool != pool {
				errs = append(errs, fmt.Errorf("I2/I9: pod %s handed to %s is not a pod of pool %s", key, g.Claim, pool))
			}
			if h, held := pre[key]; held {
				errs = append(errs, fmt.Errorf("I2: pod %s handed to %s was held by uid %s before the round", key, g.Claim, h))
			}
		}
	}
	if e := errors.Join(errs...); e != nil {
		m.fatalf("after update on %s (err=%v): %v", pool, err, e)
	}
}
