package sharding_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/poolalloc/poolalloc/allocator/sharding"
	"github.com/poolalloc/poolalloc/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// replica drives one Membership's Sync every interval until stopped,
// without leaving: stop is a crash.
type replica struct {
	m      *sharding.Membership
	cancel context.CancelFunc
	done   sync.WaitGroup
}

const (
	leaseDuration = 2 * time.Second
	renew         = 250 * time.Millisecond
)

func start(t *testing.T, ns, id string) *replica {
	t.Helper()
	m, err := sharding.New(env.Client, sharding.Options{Namespace: ns, Group: "test", Identity: id,
		LeaseDuration: leaseDuration, RenewInterval: renew})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{m: m, cancel: cancel}
	r.done.Add(1)
	go func() {
		defer r.done.Done()
		for ctx.Err() == nil {
			_ = m.Sync(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(renew):
			}
		}
	}()
	t.Cleanup(r.crash)
	return r
}

func (r *replica) crash() { r.cancel(); r.done.Wait() }

func poolsOf(n int) []types.NamespacedName {
	out := make([]types.NamespacedName, n)
	for i := range out {
		out[i] = types.NamespacedName{Namespace: fmt.Sprintf("team-%d", i%5), Name: fmt.Sprintf("pool-%d", i)}
	}
	return out
}

// ownersOf returns, per pool, the replicas that own it (Owns) now.
func ownersOf(rs map[string]*replica, pools []types.NamespacedName) map[types.NamespacedName][]string {
	out := map[types.NamespacedName][]string{}
	for id, r := range rs {
		for _, p := range pools {
			if r.m.Owns(p) {
				out[p] = append(out[p], id)
			}
		}
	}
	return out
}

// settled reports whether every pool has exactly one owner among rs, each
// replica sees exactly the members in rs, and returns the owners.
func settled(rs map[string]*replica, pools []types.NamespacedName) (map[types.NamespacedName]string, bool) {
	for _, r := range rs {
		if len(r.m.Members()) != len(rs) {
			return nil, false
		}
		for _, id := range r.m.Members() {
			if rs[id] == nil {
				return nil, false
			}
		}
	}
	owners := map[types.NamespacedName]string{}
	for p, ids := range ownersOf(rs, pools) {
		if len(ids) != 1 {
			return nil, false
		}
		owners[p] = ids[0]
	}
	return owners, len(owners) == len(pools)
}

func waitSettled(t *testing.T, rs map[string]*replica, pools []types.NamespacedName) map[types.NamespacedName]string {
	t.Helper()
	var owners map[types.NamespacedName]string
	require.Eventually(t, func() bool {
		var ok bool
		owners, ok = settled(rs, pools)
		return ok
	}, 30*time.Second, 50*time.Millisecond)
	return owners
}

// On the real API server: three replicas share 30 pools of five
// namespaces, one owner each; one crashes without releasing its lease and
// its pools (only its) go to the others once the lease expired; one joins
// and takes pools only for itself; one leaves and its pools move at once.
func TestMembershipFailoverAndRebalance(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(ctx, t)
	pools := poolsOf(30)
	rs := map[string]*replica{}
	for _, id := range []string{"a", "b", "c"} {
		rs[id] = start(t, ns, id)
	}
	owners := waitSettled(t, rs, pools)
	count := map[string]int{}
	for _, id := range owners {
		count[id]++
	}
	require.Len(t, count, 3, "every replica owns pools: %v", count)

	// c crashes: its lease stays.
	killed := time.Now()
	rs["c"].crash()
	delete(rs, "c")
	after := waitSettled(t, rs, pools)
	took := time.Since(killed)
	for p, was := range owners {
		if was != "c" {
			require.Equal(t, was, after[p], "pool %s of a live replica moved", p)
		}
	}
	require.Less(t, took, leaseDuration+10*renew, "failover took %s", took)
	t.Logf("failover after a crash: %s (lease %s, renew %s)", took, leaseDuration, renew)

	// d joins: pools move only to it.
	rs["d"] = start(t, ns, "d")
	joined := waitSettled(t, rs, pools)
	moved := 0
	for p, was := range after {
		if joined[p] != was {
			require.Equal(t, "d", joined[p], "pool %s moved to another than the joiner", p)
			moved++
		}
	}
	require.Positive(t, moved)
	t.Logf("d joined: %d of %d pools moved", moved, len(pools))

	// d leaves gracefully: its pools go back as before, without waiting for
	// its lease to expire.
	left := time.Now()
	rs["d"].crash()
	require.NoError(t, rs["d"].m.Leave(ctx))
	delete(rs, "d")
	back := waitSettled(t, rs, pools)
	require.Less(t, time.Since(left), leaseDuration, "a graceful leave does not wait for the lease")
	require.Equal(t, after, back)
}

// New refuses options it cannot use, naming them.
func TestNewRefusesBadOptions(t *testing.T) {
	for _, o := range []sharding.Options{
		{Group: "g", Identity: "a"},
		{Namespace: "ns", Identity: "a"},
		{Namespace: "ns", Group: "g"},
		{Namespace: "ns", Group: "g", Identity: "Not_A_Name"},
		{Namespace: "ns", Group: "g", Identity: "a", LeaseDuration: time.Second, RenewInterval: 2 * time.Second},
		{Namespace: "ns", Group: "g", Identity: "a", LeaseDuration: 500 * time.Millisecond, RenewInterval: 100 * time.Millisecond},
		// A Lease holds 1s of 1.5s: the others count it dead before the
		// renewal 1.2s on.
		{Namespace: "ns", Group: "g", Identity: "a", LeaseDuration: 1500 * time.Millisecond, RenewInterval: 1200 * time.Millisecond},
	} {
		_, err := sharding.New(env.Client, o)
		require.ErrorIs(t, err, sharding.ErrInvalidOptions, "%+v", o)
	}
	_, err := sharding.New(nil, sharding.Options{Namespace: "ns", Group: "g", Identity: "a"})
	require.ErrorIs(t, err, sharding.ErrInvalidOptions)
}

// The source queues the pools when the members change: a replica that
// joins has them reconciled, and again once they became its own.
func TestSourceQueuesPoolsOnChange(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := env.Namespace(ctx, t)
	pools := poolsOf(6)
	a := start(t, ns, "a")
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	src := a.m.Source(func(context.Context) ([]types.NamespacedName, error) { return pools, nil })
	require.NoError(t, src.Start(ctx, q))
	// a's first Sync is a change (no members before): every pool is queued.
	require.Eventually(t, func() bool { return q.Len() == len(pools) }, 10*time.Second, 20*time.Millisecond)
	for range pools {
		r, _ := q.Get()
		q.Done(r)
		q.Forget(r)
	}
	start(t, ns, "b")
	require.Eventually(t, func() bool { return q.Len() == len(pools) }, 10*time.Second, 20*time.Millisecond)
}

// With ByNamespace, on an API server with ShardedListAndWatch on: each
// member's shard selector lists exactly the pods of the namespaces it
// owns, and an informer made by NewInformer holds those, and follows when
// a member joins.
func TestShardedListAndWatchByNamespace(t *testing.T) {
	if !env.ShardedListAndWatch {
		t.Skipf("the kube-apiserver in %s predates the ShardedListAndWatch feature gate (v1.36)", env.AssetsDir)
	}
	ctx := context.Background()
	leases := env.Namespace(ctx, t)
	// Namespaces until one of a's moves to d when d joins and one stays.
	var namespaces []string
	moves, stays := false, false
	for len(namespaces) < 6 || !moves || !stays {
		require.Less(t, len(namespaces), 60, "no namespace of a's moves to d")
		ns := env.Namespace(ctx, t)
		_, err := testenv.CreatePods(ctx, env.Client, ns, "p", 2, false)
		require.NoError(t, err)
		namespaces = append(namespaces, ns)
		if sharding.NamespaceOwner([]string{"a", "b", "c"}, ns) == "a" {
			after := sharding.NamespaceOwner([]string{"a", "b", "c", "d"}, ns)
			moves, stays = moves || after == "d", stays || after == "a"
		}
	}
	startNS := func(id string) *replica {
		m, err := sharding.New(env.Client, sharding.Options{Namespace: leases, Group: "ns", Identity: id,
			LeaseDuration: leaseDuration, RenewInterval: renew, ByNamespace: true})
		require.NoError(t, err)
		sctx, cancel := context.WithCancel(context.Background())
		r := &replica{m: m, cancel: cancel}
		r.done.Add(1)
		go func() {
			defer r.done.Done()
			for sctx.Err() == nil {
				_ = m.Sync(sctx)
				select {
				case <-sctx.Done():
				case <-time.After(renew):
				}
			}
		}()
		t.Cleanup(r.crash)
		return r
	}
	rs := map[string]*replica{"a": startNS("a"), "b": startNS("b"), "c": startNS("c")}
	require.Eventually(t, func() bool {
		for _, r := range rs {
			if len(r.m.Members()) != len(rs) {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond)
	// mine is what id should see of the test's namespaces.
	mine := func(r *replica, id string) map[string]bool {
		out := map[string]bool{}
		for _, ns := range namespaces {
			if r.m.Owner(types.NamespacedName{Namespace: ns, Name: "p"}) == id {
				out[ns] = true
			}
		}
		return out
	}
	seen := func(list *corev1.PodList) map[string]bool {
		out := map[string]bool{}
		for _, p := range list.Items {
			if slices.Contains(namespaces, p.Namespace) {
				out[p.Namespace] = true
			}
		}
		return out
	}
	total := 0
	for id, r := range rs {
		var list corev1.PodList
		require.NoError(t, env.Client.List(ctx, &list, &client.ListOptions{Raw: &metav1.ListOptions{ShardSelector: r.m.ShardSelector()}}))
		require.NotNil(t, list.ShardInfo, "the API server applied the selector")
		require.Equal(t, mine(r, id), seen(&list), "replica %s", id)
		total += len(seen(&list))
	}
	require.Equal(t, len(namespaces), total, "each namespace is listed by one replica")

	// An informer of a's through NewInformer.
	a := rs["a"]
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, NewInformer: a.m.NewInformer(&corev1.Pod{})})
	require.NoError(t, err)
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = c.Start(cctx) }()
	require.True(t, c.WaitForCacheSync(cctx))
	cached := func() map[string]bool {
		var list corev1.PodList
		if err := c.List(ctx, &list); err != nil {
			return nil
		}
		return seen(&list)
	}
	require.Eventually(t, func() bool { return maps.Equal(cached(), mine(a, "a")) }, 30*time.Second, 50*time.Millisecond)

	// d joins: a's informer lists again, for its new namespaces (one of
	// them went to d).
	before := cached()
	rs["d"] = startNS("d")
	require.Eventually(t, func() bool { return len(a.m.Members()) == 4 }, 30*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return maps.Equal(cached(), mine(a, "a")) }, 30*time.Second, 50*time.Millisecond,
		"a's cache follows its namespaces: %v, want %v", cached(), mine(a, "a"))
	require.Less(t, len(cached()), len(before), "a namespace left a's cache")
}
