// Package follow runs a pool's allocator rounds from informer events, so
// that a reconcile costs what changed in the pool, not the pool's size.
//
// A Follower sits between an operator's informers and its allocator. The
// informers' events for pods and claims are handed to it (PodEvents and
// ClaimEvents are controller-runtime event handlers that do that and
// enqueue the pool; OnPod and OnClaim serve other event sources). It keeps,
// per pool, what changed since the last round, newest version per object.
// Sync, called by the pool's reconcile, turns that into allocator.Changes
// and calls Update. It calls Round on a complete listing (Config.List)
// instead when the pool is new to it, after Resync has passed since the
// last complete listing, after Invalidate, and after a round that may not
// have taken its input in (ErrInvalidInput, ErrPoolBlocked,
// ErrInconsistent): a complete listing is the repair for anything an event
// stream can lose.
//
// Event order does not matter to what the allocator decides: it compares
// resourceVersions and UIDs (docs/design.md I7), so a stale event, a
// duplicate, or a relist's replay of every object is no less safe than a
// full listing from a lagging cache. A missed event delays what it would
// have told until the next event of that object or the next resync; it
// never makes the allocator hand out a pod it would not have handed out
// from a lagging listing. See docs/design.md §11.
package follow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
)

// DefaultResync is how often, by default, Sync lists a pool whole and runs
// Round instead of Update.
const DefaultResync = 10 * time.Minute

// Config configures a Follower.
type Config struct {
	// Allocator runs the rounds. Required.
	Allocator allocator.Allocator
	// PodPool returns the pool a pod belongs to, or a zero name for none
	// (its events are ignored). Required.
	PodPool func(pod *corev1.Pod) types.NamespacedName
	// ClaimPool returns the pool a claim references, or a zero name for
	// none. Required.
	ClaimPool func(claim client.Object) types.NamespacedName
	// Claim reads what a claim asks for (Want, Priority, Placement). Sync
	// calls it for each changed claim when it builds a round's input, so
	// that Want may come from anywhere, as with Round. Object is set by
	// the Follower. Required.
	Claim func(claim client.Object) allocator.Claim
	// List lists a pool whole, for Round: every pod PodPool maps to it
	// and every claim ClaimPool maps to it, usually from the same cache
	// the events come from. Required.
	List func(ctx context.Context, pool types.NamespacedName) (allocator.Input, error)
	// Resync is how long Sync keeps using events before it lists the pool
	// whole again; default DefaultResync. Events carry everything as long
	// as none is lost; the resync bounds how long a lost one is missed.
	Resync time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Follower turns informer events into allocator rounds. It is safe for
// concurrent use: events may arrive while Sync runs, and Syncs of different
// pools run in parallel (those of one pool run one at a time).
type Follower struct {
	cfg Config

	mu sync.Mutex
	// pools holds the pools Sync has run a Round on and not forgotten.
	// Events of other pools are not kept: their first Sync lists them
	// whole. Guarded by mu.
	pools map[types.NamespacedName]*followed
}

// followed is what the Follower keeps of one pool.
type followed struct {
	// run serializes the pool's Syncs.
	run sync.Mutex
	// The rest is guarded by Follower.mu.
	changes changes
	// full is set when the next Sync must list the pool whole.
	full bool
	// listed is when the last complete listing was taken in.
	listed time.Time
}

// changes are a pool's changes since its last round: the newest version
// of each changed object, and what left.
type changes struct {
	pods      map[string]*corev1.Pod
	gonePods  map[string]bool
	claims    map[types.UID]client.Object
	goneClaim map[types.UID]bool
}

// setPod records pod as its name's newest version. A pod created under
// the name of one that left replaces the departure: the allocator tells
// the two apart by UID.
func (c *changes) setPod(pod *corev1.Pod) {
	if c.pods == nil {
		c.pods = map[string]*corev1.Pod{}
	}
	c.pods[pod.Name] = pod
	delete(c.gonePods, pod.Name)
}

func (c *changes) podGone(name string) {
	if c.gonePods == nil {
		c.gonePods = map[string]bool{}
	}
	delete(c.pods, name)
	c.gonePods[name] = true
}

func (c *changes) setClaim(obj client.Object) {
	if c.claims == nil {
		c.claims = map[types.UID]client.Object{}
	}
	c.claims[obj.GetUID()] = obj
}

func (c *changes) claimGone(uid types.UID) {
	if c.goneClaim == nil {
		c.goneClaim = map[types.UID]bool{}
	}
	delete(c.claims, uid)
	c.goneClaim[uid] = true
}

// under adds older's changes beneath c's: what c changed again since
// stays c's. It puts back changes a round did not take in.
func (c *changes) under(older changes) {
	for name, pod := range older.pods {
		if _, newer := c.pods[name]; !newer && !c.gonePods[name] {
			c.setPod(pod)
		}
	}
	for name := range older.gonePods {
		if _, newer := c.pods[name]; !newer {
			c.podGone(name)
		}
	}
	for uid, obj := range older.claims {
		if _, newer := c.claims[uid]; !newer && !c.goneClaim[uid] {
			c.setClaim(obj)
		}
	}
	for uid := range older.goneClaim {
		c.claimGone(uid)
	}
}

// New returns a Follower. It fails, naming the field, when a required
// field of cfg is missing.
func New(cfg Config) (*Follower, error) {
	for _, f := range []struct {
		name string
		nil  bool
	}{
		{"Allocator", cfg.Allocator == nil},
		{"PodPool", cfg.PodPool == nil},
		{"ClaimPool", cfg.ClaimPool == nil},
		{"Claim", cfg.Claim == nil},
		{"List", cfg.List == nil},
	} {
		if f.nil {
			return nil, fmt.Errorf("follow: Config.%s is required", f.name)
		}
	}
	if cfg.Resync < 0 {
		return nil, fmt.Errorf("follow: Config.Resync %v is negative", cfg.Resync)
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Follower{cfg: cfg, pools: map[types.NamespacedName]*followed{}}, nil
}

// OnPod takes in a pod event: old is nil for an add, pod is nil for a
// delete (old is then the pod's last known state, as a tombstone gives
// it). It returns the pools the event concerns (two when the pod moved
// between pools), for the caller to reconcile.
func (f *Follower) OnPod(old, pod *corev1.Pod) []types.NamespacedName {
	var from, to types.NamespacedName
	if old != nil {
		from = f.cfg.PodPool(old)
	}
	if pod != nil {
		to = f.cfg.PodPool(pod)
	}
	return f.move(from, to, func(c *changes) { c.podGone(old.Name) }, func(c *changes) { c.setPod(pod) })
}

// OnClaim takes in a claim event, as OnPod does a pod's.
func (f *Follower) OnClaim(old, claim client.Object) []types.NamespacedName {
	var from, to types.NamespacedName
	if old != nil {
		from = f.cfg.ClaimPool(old)
	}
	if claim != nil {
		to = f.cfg.ClaimPool(claim)
	}
	return f.move(from, to, func(c *changes) { c.claimGone(old.GetUID()) }, func(c *changes) { c.setClaim(claim) })
}

// move records an object's event that took it from pool from to pool to
// (either zero for none): gone from from's changes if it left it, set in
// to's. Pools not followed keep nothing. It returns the pools concerned.
func (f *Follower) move(from, to types.NamespacedName, gone, set func(*changes)) []types.NamespacedName {
	f.mu.Lock()
	defer f.mu.Unlock()
	if from.Name != "" && from != to {
		if p := f.pools[from]; p != nil {
			gone(&p.changes)
		}
	}
	if to.Name != "" {
		if p := f.pools[to]; p != nil {
			set(&p.changes)
		}
	}
	return pools(from, to)
}

// pools lists the named ones of from and to, once each.
func pools(from, to types.NamespacedName) []types.NamespacedName {
	switch {
	case from.Name == "" && to.Name == "":
		return nil
	case from.Name == "" || from == to:
		return []types.NamespacedName{to}
	case to.Name == "":
		return []types.NamespacedName{from}
	}
	return []types.NamespacedName{from, to}
}

// Invalidate makes the pool's next Sync list it whole.
func (f *Follower) Invalidate(pool types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.pools[pool]; p != nil {
		p.full = true
	}
}

// Forget drops what the Follower keeps of a pool (a deleted pool, or one
// another replica serves now): its events are ignored until the next Sync,
// which lists it whole. It does not touch the allocator (ForgetPool).
func (f *Follower) Forget(pool types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pools, pool)
}

// Sync runs one round for pool: Update with the changes the events told
// since the last round, or Round on a complete listing (see the package
// documentation for when). full says which; only a Round fills
// Result.Idle. res and err are the allocator's (or List's error, with res
// empty but for Pool). A Sync that ends with ctx before its round, or
// whose round failed before taking its changes in, keeps them for the
// next.
func (f *Follower) Sync(ctx context.Context, pool types.NamespacedName) (res allocator.Result, full bool, err error) {
	f.mu.Lock()
	p := f.pools[pool]
	if p == nil {
		// From now on the pool's events are kept: the listing below may
		// miss them, and the next Sync takes them.
		p = &followed{full: true}
		f.pools[pool] = p
	}
	f.mu.Unlock()

	p.run.Lock()
	defer p.run.Unlock()
	f.mu.Lock()
	if f.pools[pool] != p {
		// Forgotten meanwhile: start again as new.
		f.mu.Unlock()
		return f.Sync(ctx, pool)
	}
	now := f.cfg.Now()
	full = p.full || now.Sub(p.listed) >= f.cfg.Resync
	taken := p.changes
	p.changes = changes{}
	f.mu.Unlock()

	if full {
		res, err = f.round(ctx, pool)
		f.mu.Lock()
		// The listing was taken in unless the round says otherwise.
		p.full = err != nil && (lostInput(err) || !isRoundError(err))
		if !p.full {
			p.listed = now
		}
		f.mu.Unlock()
		return res, true, err
	}
	// Also with no changes a round runs: it acts on time (quarantines,
	// claims waiting for pods) and reports the pool.
	res, err = f.cfg.Allocator.Update(ctx, f.input(pool, taken))
	if err != nil {
		f.mu.Lock()
		switch {
		case lostInput(err):
			p.full = true
		case !isRoundError(err):
			// Ended before the round (ctx): the changes were not taken
			// in. Put them back; taking one in twice is harmless, as any
			// replayed event is.
			p.changes.under(taken)
		}
		f.mu.Unlock()
	}
	return res, false, err
}

// round lists the pool and runs Round on it.
func (f *Follower) round(ctx context.Context, pool types.NamespacedName) (allocator.Result, error) {
	in, err := f.cfg.List(ctx, pool)
	if err != nil {
		return allocator.Result{Pool: pool}, fmt.Errorf("pool %s: list: %w", pool, err)
	}
	in.Pool = pool
	return f.cfg.Allocator.Round(ctx, in)
}

// lostInput reports whether a round's error says it did not take its input
// in, or that the allocator wants a complete listing.
func lostInput(err error) bool {
	for _, sentinel := range []error{allocator.ErrInvalidInput, allocator.ErrPoolBlocked, allocator.ErrInconsistent} {
		if errors.Is(err, sentinel) {
			return true
		}
	}
	return false
}

// isRoundError reports whether err is one a round returns after it took
// its input in: a write, recycle, read, store or plan failure. Other
// errors (ctx ended before the round, a failed listing) mean it did not.
func isRoundError(err error) bool {
	for _, sentinel := range []error{allocator.ErrWrite, allocator.ErrRecycle, allocator.ErrRead, allocator.ErrStore, allocator.ErrPlan} {
		if errors.Is(err, sentinel) {
			return true
		}
	}
	return false
}

// input builds Update's input from a pool's changes.
func (f *Follower) input(pool types.NamespacedName, c changes) allocator.Changes {
	ch := allocator.Changes{Pool: pool}
	if len(c.pods) > 0 {
		ch.Pods = make([]corev1.Pod, 0, len(c.pods))
		for _, pod := range c.pods {
			ch.Pods = append(ch.Pods, *pod)
		}
	}
	for name := range c.gonePods {
		ch.DeletedPods = append(ch.DeletedPods, name)
	}
	for _, obj := range c.claims {
		cl := f.cfg.Claim(obj)
		cl.Object = obj
		ch.Claims = append(ch.Claims, cl)
	}
	for uid := range c.goneClaim {
		ch.DeletedClaims = append(ch.DeletedClaims, uid)
	}
	return ch
}
