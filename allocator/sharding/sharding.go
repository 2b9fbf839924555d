// Package sharding spreads pools over the replicas of an operator with
// Kubernetes Leases: each replica holds a Lease of its own in a namespace
// the caller names and renews it; the live members are those whose leases
// were renewed within their duration; and each pool has one owner among
// them, by rendezvous hashing, so that a member joining or leaving moves
// only the pools it takes or had (about 1/N of them).
//
// A replica serves a pool that came to it only one RenewInterval after it
// saw the change, and a new replica serves nothing for one RenewInterval:
// time for the previous owner to see the change at its next Sync (Owns
// says exactly what holds, and when).
//
// Sharding is for throughput and fast failover, never for safety: two
// replicas that both believe they own a pool for a moment (a lease renewed
// late, a slow Sync, a partition) are kept from handing one pod to two
// claims by pod marks and the API server's compare-and-swap, as any two
// allocators are.
//
// A Membership is a controller-runtime manager.Runnable; add it to the
// manager and ask Owns in the reconciler:
//
//	m, err := sharding.New(mgr.GetClient(), sharding.Options{Namespace: "poolalloc-system", Group: "pools", Identity: podName})
//	if err != nil {
//		return err
//	}
//	if err := mgr.Add(m); err != nil {
//		return err
//	}
//	// in Reconcile, before the pool's Round:
//	if !m.Owns(req.NamespacedName) {
//		return ctrl.Result{}, r.Alloc.ForgetPool(req.NamespacedName)
//	}
//
// and requeue every pool when ownership may have changed: add m.Source(...)
// to the controller (builder.WatchesRawSource), or read Changes.
//
// Liveness is judged on the observing replica's own clock: a lease is
// expired once its renewTime has not changed for its duration, as this
// replica saw it, so clocks that disagree between nodes do not matter.
package sharding

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// GroupLabel is the label on the members' leases whose value is the group.
const GroupLabel = "poolalloc.io/shard-group"

// Defaults for Options.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewInterval = 5 * time.Second
)

// ErrInvalidOptions is returned by New for options it cannot use.
var ErrInvalidOptions = errors.New("invalid sharding options")

// Options configure a Membership.
type Options struct {
	// Namespace holds the members' leases. Required.
	Namespace string
	// Group names the set of replicas that share pools: members of other
	// groups in the namespace are not counted. Required; a label value.
	Group string
	// Identity is this replica's name in the group, unique among its
	// members (the pod's name, say). Required.
	Identity string
	// LeaseDuration is how long a lease lives without renewal
	// (DefaultLeaseDuration if 0; at least a second, and rounded down to
	// whole seconds, which is what a Lease holds): a replica that dies
	// without releasing its lease loses its pools this long after its
	// last renewal.
	LeaseDuration time.Duration
	// RenewInterval is how often the lease is renewed and the members
	// listed (DefaultRenewInterval if 0), and the grace a pool waits
	// before a replica it came to serves it (Owns). It must be shorter than
	// LeaseDuration; a third of it is usual.
	RenewInterval time.Duration
	// Clock is the clock (the real one if nil).
	Clock clock.Clock
	// ByNamespace gives each member the pools of whole namespaces: those
	// whose namespace's 64-bit FNV-1a hash falls in its ranges of a ring
	// (a few ranges per member, so that a member joining or leaving moves
	// about 1/N of them). Then each replica's informers can ask the API
	// server for its namespaces only (ShardSelector, NewInformer): the
	// server's sharded list and watch (alpha in Kubernetes v1.36, feature
	// gate ShardedListAndWatch), so that replicas do not each receive
	// every pod's events. Without it pools are spread one by one.
	ByNamespace bool
}

// Membership keeps this replica's lease and the group's live members, and
// says which pools this replica owns.
type Membership struct {
	c    client.Client
	opts Options

	mu sync.Mutex
	// cur is the view of the members this replica holds now; past the
	// views it replaced less than one grace (RenewInterval) ago, at most
	// maxPast, oldest first, each with the time it was replaced. Only
	// replace changes them (forget drops past ones). Before the first
	// Sync cur is a gap.
	cur  view
	past []view
	// renewed is when this replica's lease was last written.
	renewed time.Time
	// changedCh is closed, and replaced, at each change of the members.
	changedCh chan struct{}
	// seen is, per lease, the renewTime last read and when this replica
	// first read it (its own clock).
	seen map[string]observed
	// ready is closed once the members were listed once.
	ready     chan struct{}
	readyOnce sync.Once
	// changes gets a value at each new view (at most one pending).
	changes chan struct{}
}

// maxPast bounds the past views kept. Syncs every RenewInterval leave one
// or two within a grace; more come only from Syncs called more often, and
// then the oldest merge into a gap (see forget), which owns less, never more.
const maxPast = 8

// view is the members as this replica listed them, current from one
// change to the next. A gap stands for a time when this replica may have
// been out of the group in the others' eyes, so that another may have
// served its pools: before its first Sync, before renewing a lease that
// had lapsed or that it had to create anew, after Leave. It keeps the
// members last listed (Owner, Members, ShardSelector read them), but this
// replica owns nothing in it.
type view struct {
	gap     bool
	members []string // live members, sorted
	ring    []point  // the members' ring (ByNamespace), built once per view
	// until is when the next view replaced this one (past views only).
	until time.Time
}

// owner is the member that owns pool in v, in the mode byNamespace.
func (v *view) owner(byNamespace bool, pool types.NamespacedName) string {
	if byNamespace {
		return pointOwner(v.ring, fnv1a(pool.Namespace))
	}
	return owner(v.members, pool)
}

type observed struct {
	renew string
	at    time.Time
}

// New returns the membership of opts.Identity in opts.Group. It does
// nothing until started (Start).
func New(c client.Client, opts Options) (*Membership, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOptions)
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = DefaultLeaseDuration
	}
	if opts.RenewInterval == 0 {
		opts.RenewInterval = DefaultRenewInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	var problems []string
	if opts.Namespace == "" {
		problems = append(problems, "no namespace")
	}
	if errs := validation.IsValidLabelValue(opts.Group); opts.Group == "" || len(errs) > 0 {
		problems = append(problems, fmt.Sprintf("group %q is not a label value %v", opts.Group, errs))
	}
	if opts.Identity == "" || len(leaseName(opts.Group, opts.Identity)) > validation.DNS1123SubdomainMaxLength ||
		len(validation.IsDNS1123Subdomain(leaseName(opts.Group, opts.Identity))) > 0 {
		problems = append(problems, fmt.Sprintf("identity %q does not make a lease name (%s)", opts.Identity, leaseName(opts.Group, opts.Identity)))
	}
	if opts.LeaseDuration < time.Second {
		problems = append(problems, fmt.Sprintf("lease duration %s is under a second (a Lease holds whole seconds)", opts.LeaseDuration))
	} else if d := opts.LeaseDuration.Truncate(time.Second); opts.RenewInterval >= d || opts.RenewInterval < 0 {
		problems = append(problems, fmt.Sprintf("renew interval %s is not shorter than the lease duration %s (whole seconds)", opts.RenewInterval, d))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrInvalidOptions, strings.Join(problems, "; "))
	}
	return &Membership{c: c, opts: opts, cur: view{gap: true}, seen: map[string]observed{}, ready: make(chan struct{}),
		changes: make(chan struct{}, 1), changedCh: make(chan struct{})}, nil
}

func leaseName(group, identity string) string { return "poolalloc-" + group + "-" + identity }

// NeedLeaderElection reports false: every replica is a member, with leader
// election on or off (manager.LeaderElectionRunnable).
func (m *Membership) NeedLeaderElection() bool { return false }

// Start keeps the lease and the members until ctx ends, then deletes the
// lease so that the others take its pools at once (Leave) and returns what
// that returned. A failed renewal or listing is logged through ctx's
// logger and retried at the next interval; while this replica's lease
// is not renewed it owns nothing (Owns).
func (m *Membership) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx)
	for {
		if err := m.Sync(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "sharding: sync failed; retried", "group", m.opts.Group, "identity", m.opts.Identity)
		}
		select {
		case <-ctx.Done():
			return m.Leave(context.WithoutCancel(ctx))
		case <-m.opts.Clock.After(m.opts.RenewInterval):
		}
	}
}

// Sync renews this replica's lease and reads the members once. Start calls
// it every RenewInterval; a test may call it directly.
func (m *Membership) Sync(ctx context.Context) error {
	if err := m.renew(ctx); err != nil {
		return err
	}
	var leases coordinationv1.LeaseList
	if err := m.c.List(ctx, &leases, client.InNamespace(m.opts.Namespace), client.MatchingLabels{GroupLabel: m.opts.Group}); err != nil {
		return fmt.Errorf("sharding: list leases of group %s: %w", m.opts.Group, err)
	}
	now := m.opts.Clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var live []string
	names := map[string]bool{}
	for _, l := range leases.Items {
		id := ptr.Deref(l.Spec.HolderIdentity, "")
		if id == "" || l.DeletionTimestamp != nil {
			continue
		}
		names[l.Name] = true
		renew := ""
		if l.Spec.RenewTime != nil {
			renew = l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
		}
		o, ok := m.seen[l.Name]
		if !ok || o.renew != renew {
			o = observed{renew: renew, at: now}
			m.seen[l.Name] = o
		}
		d := time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, int32(m.opts.LeaseDuration/time.Second))) * time.Second
		if id == m.opts.Identity || now.Sub(o.at) < d {
			live = append(live, id)
		}
	}
	for name := range m.seen {
		if !names[name] {
			delete(m.seen, name)
		}
	}
	slices.Sort(live)
	live = slices.Compact(live)
	m.forget(now)
	if m.cur.gap || !slices.Equal(live, m.cur.members) {
		next := view{members: live, ring: m.cur.ring}
		if m.opts.ByNamespace && !slices.Equal(live, m.cur.members) {
			next.ring = ring(live)
		}
		m.replace(next, now)
	}
	m.readyOnce.Do(func() { close(m.ready) })
	return nil
}

// renew creates or renews this replica's lease.
func (m *Membership) renew(ctx context.Context) error {
	now := metav1.NewMicroTime(m.opts.Clock.Now())
	key := types.NamespacedName{Namespace: m.opts.Namespace, Name: leaseName(m.opts.Group, m.opts.Identity)}
	var l coordinationv1.Lease
	err := m.c.Get(ctx, key, &l)
	if apierrors.IsNotFound(err) {
		l = coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{GroupLabel: m.opts.Group}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(m.opts.Identity),
				LeaseDurationSeconds: ptr.To(int32(m.opts.LeaseDuration / time.Second)), AcquireTime: &now, RenewTime: &now},
		}
		if err := m.c.Create(ctx, &l); err != nil {
			return fmt.Errorf("sharding: create lease %s: %w", key, err)
		}
		m.renewedAt(now.Time, true)
		return nil
	}
	if err != nil {
		return fmt.Errorf("sharding: read lease %s: %w", key, err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != m.opts.Identity {
		return fmt.Errorf("sharding: lease %s is held by %q, not %q: two replicas with one identity?", key, h, m.opts.Identity)
	}
	l.Spec.RenewTime = &now
	l.Spec.LeaseDurationSeconds = ptr.To(int32(m.opts.LeaseDuration / time.Second))
	if err := m.c.Update(ctx, &l); err != nil {
		return fmt.Errorf("sharding: renew lease %s: %w", key, err)
	}
	m.renewedAt(now.Time, false)
	return nil
}

// renewedAt records that this replica's lease was written at now, created
// if created. A lease created anew (deleted under this replica) or renewed
// after it had lapsed starts a gap: the others may have counted this
// replica out and given its pools to another, who serves them until its
// next Sync.
func (m *Membership) renewedAt(now time.Time, created bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	lapsed := !m.renewed.IsZero() && now.Sub(m.renewed) >= m.leaseDuration()
	m.renewed = now
	if (created || lapsed) && !m.cur.gap {
		m.replace(view{gap: true, members: m.cur.members, ring: m.cur.ring}, now)
	}
}

// leaseDuration is LeaseDuration as the lease holds it, in whole seconds:
// the others count this replica dead after that long.
func (m *Membership) leaseDuration() time.Duration {
	return m.opts.LeaseDuration.Truncate(time.Second)
}

// replace makes next the current view at now, keeps the one it replaces
// among the past views, and tells Changes (and, if the members changed,
// the sharded informers). The caller holds mu.
func (m *Membership) replace(next view, now time.Time) {
	old := m.cur
	old.until = now
	m.past = append(m.past, old)
	m.cur = next
	m.forget(now)
	if !slices.Equal(old.members, next.members) {
		close(m.changedCh)
		m.changedCh = make(chan struct{})
	}
	select {
	case m.changes <- struct{}{}:
	default:
	}
}

// forget drops the past views replaced one grace ago or more, which Owns
// no longer reads, and merges the oldest into a gap while more than
// maxPast remain. The caller holds mu.
func (m *Membership) forget(now time.Time) {
	m.past = slices.DeleteFunc(m.past, func(v view) bool { return now.Sub(v.until) >= m.opts.RenewInterval })
	for len(m.past) > maxPast {
		merged := view{gap: true, until: m.past[0].until}
		if m.past[1].until.After(merged.until) {
			merged.until = m.past[1].until
		}
		m.past[1] = merged
		m.past = slices.Delete(m.past, 0, 1)
	}
}

// Leave deletes this replica's lease: the others take its pools at their
// next Sync (and serve them one RenewInterval later, see Owns) instead of
// after the lease's duration. From the call on this replica owns nothing;
// a Sync after it joins again, as a new replica does.
func (m *Membership) Leave(ctx context.Context) error {
	m.mu.Lock()
	if !m.cur.gap {
		m.replace(view{gap: true, members: m.cur.members, ring: m.cur.ring}, m.opts.Clock.Now())
	}
	m.mu.Unlock()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: m.opts.Namespace, Name: leaseName(m.opts.Group, m.opts.Identity)}}
	if err := client.IgnoreNotFound(m.c.Delete(ctx, l)); err != nil {
		return fmt.Errorf("sharding: delete lease %s/%s: %w", l.Namespace, l.Name, err)
	}
	return nil
}

// Members returns the live members, sorted.
func (m *Membership) Members() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.cur.members)
}

// Owner returns the member that owns pool among the live members, empty
// before the first Sync. It is the owner by hashing only: that member
// may not serve the pool yet (Owns).
func (m *Membership) Owner(pool types.NamespacedName) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur.owner(m.opts.ByNamespace, pool)
}

// Owns reports whether this replica owns pool now: it is the pool's owner
// among the live members (Owner), and it was so in every view of the
// members it held within the last RenewInterval, the grace. So a pool that
// came to it with a change of members is owned once RenewInterval has
// passed since the change, however many changes followed it: time for the
// previous owner, if alive, to see the change at its next Sync and stop.
// A pool that stayed its own through every change is owned without a
// pause.
//
// A replica that cannot know whether another served its pools owns
// nothing for one grace: after its first Sync (a new replica, which may
// take pools from owners that have not seen it yet; it waits even when
// none served them, which it cannot tell), after renewing a
// lease that had lapsed or had to be created anew (the others may have
// counted it out), and from Leave on. It owns nothing before the first
// Sync, nor once its lease went unrenewed for LeaseDuration (the others
// count it dead then).
//
// This keeps two replicas from owning one pool at once provided every
// live replica completes a Sync at least every RenewInterval while its
// lease lives, nobody but its holder deletes a lease before every replica
// saw it, and the replicas' clocks run at one rate. Start syncs every
// RenewInterval plus the time a Sync takes, and a slow API server, a
// lagging cache behind the client or a stalled process makes the gap
// longer: two replicas may then both own a pool for that long, which pod
// marks keep safe.
func (m *Membership) Owns(pool types.NamespacedName) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	me, now, byNS := m.opts.Identity, m.opts.Clock.Now(), m.opts.ByNamespace
	if now.Sub(m.renewed) >= m.leaseDuration() || m.cur.gap || m.cur.owner(byNS, pool) != me {
		return false
	}
	for i := range m.past {
		v := &m.past[i]
		if now.Sub(v.until) < m.opts.RenewInterval && (v.gap || v.owner(byNS, pool) != me) {
			return false
		}
	}
	return true
}

// Ready is closed once the members were read once.
func (m *Membership) Ready() <-chan struct{} { return m.ready }

// Changes delivers a value after each new view of the members (at most one
// is pending): the live members changed, or a gap began or ended (see
// Owns). The reconciler should then requeue its pools, and again one
// RenewInterval later, when the pools that came to this replica become its
// own (Owns).
func (m *Membership) Changes() <-chan struct{} { return m.changes }

// owner is the member with the highest weight for pool (rendezvous
// hashing): a member that joins takes only the pools it now weighs most
// for, and one that leaves gives up only its own.
func owner(members []string, pool types.NamespacedName) string {
	best, bestW := "", uint64(0)
	for _, id := range members {
		h := fnv.New64a()
		_, _ = h.Write([]byte(pool.Namespace))
		_, _ = h.Write([]byte{'/'})
		_, _ = h.Write([]byte(pool.Name))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(id))
		w := mix(h.Sum64())
		if best == "" || w > bestW || w == bestW && id < best {
			best, bestW = id, w
		}
	}
	return best
}

// mix spreads the bits of an FNV hash (splitmix64's finalizer), whose low
// bits alone weigh members unevenly.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Source returns a controller-runtime source for the reconciler of pools:
// after each new view of the members (Changes), and again RenewInterval later
// (when the pools that came to this replica become its own, see Owns), it
// queues every pool that pools returns, so that each replica starts or
// stops serving the pools whose owner changed. It reads Changes: use one
// or the other. An error from pools is logged through the controller's
// logger and the pools are listed again at the next change.
func (m *Membership) Source(pools func(context.Context) ([]types.NamespacedName, error)) source.Source {
	return source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-m.changes:
				}
				for range 2 {
					ps, err := pools(ctx)
					if err != nil {
						logr.FromContextOrDiscard(ctx).Error(err, "sharding: list pools to requeue", "group", m.opts.Group)
					}
					for _, p := range ps {
						q.Add(reconcile.Request{NamespacedName: p})
					}
					select {
					case <-ctx.Done():
						return
					case <-m.opts.Clock.After(m.opts.RenewInterval):
					}
				}
			}
		}()
		return nil
	})
}
