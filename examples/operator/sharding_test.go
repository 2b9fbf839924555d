package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/allocator/sharding"
	poolv1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
	"github.com/poolalloc/poolalloc/examples/operator/fakekubelet"
	"github.com/poolalloc/poolalloc/syncer"
)

// shardReplica is one replica of a sharded operator: a membership driven
// by its own loop and a manager of its own (client, cache, identity).
type shardReplica struct {
	m                 *sharding.Membership
	stopSync, stopMgr context.CancelFunc
	syncDone, mgrDone chan error
}

// startReplica starts a replica serving the pools of namespaces.
func startReplica(t *testing.T, id, leaseNS string, namespaces []string) *shardReplica {
	t.Helper()
	m, err := sharding.New(env.Client, sharding.Options{Namespace: leaseNS, Group: "operator", Identity: id,
		LeaseDuration: 2 * time.Second, RenewInterval: 250 * time.Millisecond})
	require.NoError(t, err)
	scheme, err := NewScheme()
	require.NoError(t, err)
	cacheOpts, err := CacheOptions(namespaces...)
	require.NoError(t, err)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: scheme, Cache: cacheOpts, Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	require.NoError(t, Setup(mgr, Options{Metrics: prometheus.NewRegistry(), Shards: m, Resync: 2 * time.Second}))
	r := &shardReplica{m: m, syncDone: make(chan error, 1), mgrDone: make(chan error, 1)}
	var syncCtx, mgrCtx context.Context
	syncCtx, r.stopSync = context.WithCancel(context.Background())
	mgrCtx, r.stopMgr = context.WithCancel(context.Background())
	go func() {
		for syncCtx.Err() == nil {
			_ = m.Sync(syncCtx)
			select {
			case <-syncCtx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
		r.syncDone <- nil
	}()
	go func() { r.mgrDone <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() { r.crash(t) })
	return r
}

// crash stops the replica without releasing its lease.
func (r *shardReplica) crash(t *testing.T) {
	if r.stopSync == nil {
		return
	}
	r.stopSync()
	r.stopMgr()
	<-r.syncDone
	require.NoError(t, <-r.mgrDone)
	r.stopSync = nil
}

// On the real API server: three replicas of the operator share 30 pools in
// three namespaces, with claims scaled, released and deleted throughout.
// One crashes without releasing its lease, one joins, one leaves
// gracefully, the crashed one comes back, and the three are restarted one
// after the other; records sampled all along never list a pod in two
// claims, and every claim is served after each change.
func TestShardedOperatorFailoverAndRebalance(t *testing.T) {
	ctx := context.Background()
	leaseNS := env.namespace(ctx, t)
	var namespaces []string
	for range 3 {
		namespaces = append(namespaces, env.namespace(ctx, t))
	}
	type claimKey struct{ ns, name string }
	claims := map[claimKey]int32{}
	for i := range 30 {
		ns := namespaces[i%3]
		pool := fmt.Sprintf("pool-%d", i)
		require.NoError(t, env.Client.Create(ctx, poolv1.NewPool(ns, pool, 1)))
		for j := range 2 {
			name := fmt.Sprintf("%s-c%d", pool, j)
			require.NoError(t, env.Client.Create(ctx, poolv1.NewClaim(ns, name, pool, 1)))
			claims[claimKey{ns, name}] = 1
		}
	}
	for _, ns := range namespaces {
		kctx, cancel := context.WithCancel(context.Background())
		k := &fakekubelet.Kubelet{Client: env.Client, Namespace: ns, Interval: 100 * time.Millisecond, StartDelay: 200 * time.Millisecond}
		done := make(chan error, 1)
		go func() { done <- k.Run(kctx) }()
		t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	}

	// The sampler: no pod in two claims' records at any sample.
	var mu sync.Mutex
	var violations []string
	samples := 0
	sctx, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	records, err := syncer.NewAnnotationSyncer(env.Client, syncer.DefaultKeys())
	require.NoError(t, err)
	// last is what each claim (by UID) held at the sampler's previous
	// sample, and its spec's generation: a pod that leaves the record of a
	// claim whose spec did not change meanwhile, while it is live and still
	// marked for the claim, must show in its released list, unless the
	// claim is being deleted (no hand-out lost, docs/design.md I7; a pod whose mark
	// a lagging cache did not show yet may be recycled as of uncertain
	// use). A claim whose want fell may give any pod back, and the released
	// list drops it at the next write unless the owner listed it, so a
	// change of spec between two samples is not judged.
	type sample struct {
		held       []string
		generation int64
	}
	last := map[types.UID]sample{}
	read := func(sampling bool) (map[claimKey][]string, error) {
		held := map[claimKey][]string{}
		for _, ns := range namespaces {
			var list poolv1.ClaimList
			if err := env.Client.List(sctx, &list, client.InNamespace(ns)); err != nil {
				return nil, err
			}
			var pods corev1.PodList
			if sampling {
				if err := env.Client.List(sctx, &pods, client.InNamespace(ns)); err != nil {
					return nil, err
				}
			}
			// markedFor reports whether pod p is live and its mark names
			// the claim (name/uid): a pod the claim holds, by its mark.
			markedFor := func(p string, cl *poolv1.Claim) bool {
				for i := range pods.Items {
					if pd := &pods.Items[i]; pd.Name == p {
						return podLive(pd) && pd.Annotations[allocator.DefaultPodMarkKey] == cl.Name+"/"+string(cl.UID)
					}
				}
				return false
			}
			holder := map[string]string{}
			for i := range list.Items {
				rec, err := records.Read(&list.Items[i])
				if err != nil {
					return nil, err
				}
				for _, p := range rec.Held() {
					if other, ok := holder[p]; ok {
						mu.Lock()
						violations = append(violations, fmt.Sprintf("pod %s/%s in the records of %s and %s", ns, p, other, list.Items[i].Name))
						mu.Unlock()
					}
					holder[p] = list.Items[i].Name
				}
				held[claimKey{ns, list.Items[i].Name}] = rec.Held()
				if cl := &list.Items[i]; sampling {
					prev, ok := last[cl.UID]
					judged := ok && prev.generation == cl.Generation && cl.DeletionTimestamp == nil
					for _, p := range prev.held {
						if judged && !slices.Contains(rec.Held(), p) && !slices.Contains(rec.Released, p) && markedFor(p, cl) {
							mu.Lock()
							violations = append(violations, fmt.Sprintf("claim %s/%s lost pod %s: not held, not released", ns, cl.Name, p))
							mu.Unlock()
						}
					}
					last[cl.UID] = sample{held: rec.Held(), generation: cl.Generation}
				}
			}
		}
		return held, nil
	}
	go func() {
		defer close(sampled)
		for sctx.Err() == nil {
			if _, err := read(true); err == nil {
				mu.Lock()
				samples++
				mu.Unlock()
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	served := func(what string) {
		t.Helper()
		// On failure, what the last look found amiss is printed.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			held, err := read(false)
			if !assert.NoError(c, err) {
				return
			}
			for k, want := range claims {
				assert.Len(c, held[k], int(want), "claim %s/%s", k.ns, k.name)
			}
		}, 60*time.Second, 100*time.Millisecond, "every claim served: %s", what)
	}
	scale := func(n int32) {
		t.Helper()
		for k := range claims {
			if len(k.name)%2 == 0 || k.name[len(k.name)-1] == '0' { // about half of them
				var cl poolv1.Claim
				require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: k.name}, &cl))
				cl.Spec.Replicas = n
				require.NoError(t, env.Client.Update(ctx, &cl))
				claims[k] = n
			}
		}
	}

	rs := map[string]*shardReplica{}
	for _, id := range []string{"a", "b", "c"} {
		rs[id] = startReplica(t, id, leaseNS, namespaces)
	}
	served("three replicas")
	owned := map[string]int{}
	for i := range 30 {
		pool := client.ObjectKey{Namespace: namespaces[i%3], Name: fmt.Sprintf("pool-%d", i)}
		for id, r := range rs {
			if r.m.Owns(pool) {
				owned[id]++
			}
		}
	}
	require.Len(t, owned, 3, "every replica serves pools: %v", owned)
	require.Equal(t, 30, owned["a"]+owned["b"]+owned["c"], "each pool has one owner: %v", owned)
	t.Logf("pools per replica: %v", owned)

	// c crashes; claims change meanwhile.
	crashed := time.Now()
	rs["c"].crash(t)
	scale(2)
	served("after c crashed")
	t.Logf("served again %s after the crash", time.Since(crashed).Round(10*time.Millisecond))

	// d joins; claims change again: some give a pod back for good, some
	// swap one (give it back and keep their want), some are deleted.
	rs["d"] = startReplica(t, "d", leaseNS, namespaces)
	held, err := read(false)
	require.NoError(t, err)
	n, released, swapped, deleted := 0, 0, 0, 0
	for k, want := range claims {
		n++
		switch {
		case n%5 == 0:
			var cl poolv1.Claim
			require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: k.name}, &cl))
			require.NoError(t, env.Client.Delete(ctx, &cl))
			delete(claims, k)
			deleted++
		case n%5 == 2 && len(held[k]) == int(want) && want > 0:
			// A swap: the owner gives a pod back and keeps its want.
			var cl poolv1.Claim
			require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: k.name}, &cl))
			v, err := syncer.EncodePods(held[k][:1])
			require.NoError(t, err)
			if cl.Annotations == nil {
				cl.Annotations = map[string]string{}
			}
			cl.Annotations[syncer.DefaultKeys().Release] = v
			require.NoError(t, env.Client.Update(ctx, &cl))
			swapped++
		case n%5 == 1 && want == 2 && len(held[k]) == 2:
			var cl poolv1.Claim
			require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: k.name}, &cl))
			v, err := syncer.EncodePods(held[k][:1])
			require.NoError(t, err)
			if cl.Annotations == nil {
				cl.Annotations = map[string]string{}
			}
			cl.Annotations[syncer.DefaultKeys().Release] = v
			cl.Spec.Replicas = 1
			require.NoError(t, env.Client.Update(ctx, &cl))
			claims[k] = 1
			released++
		}
	}
	require.Positive(t, released)
	require.Positive(t, swapped)
	require.Positive(t, deleted)
	t.Logf("%d claims gave a pod back, %d swapped one, %d were deleted", released, swapped, deleted)
	served("after d joined, claims released and deleted")

	// d leaves gracefully.
	require.NoError(t, rs["d"].m.Leave(ctx))
	rs["d"].crash(t)
	scale(2)
	served("after d left")

	// c comes back, then a rolling restart of the three: each leaves, and
	// a new process of the same identity starts in its place.
	rs["c"] = startReplica(t, "c", leaseNS, namespaces)
	served("after c came back")
	for i, id := range []string{"a", "b", "c"} {
		require.NoError(t, rs[id].m.Leave(ctx))
		rs[id].crash(t)
		rs[id] = startReplica(t, id, leaseNS, namespaces)
		scale(int32(1 + i%2))
		served("after restarting " + id)
	}

	stopSampling()
	<-sampled
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d samples of every record", samples)
	require.Positive(t, samples)
	require.Empty(t, violations)
}
