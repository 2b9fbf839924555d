package sharding_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/allocator/sharding"
)

// The model of TestOwnsAtMostOneOwner: replicas of one group on one fake
// API server and one fake clock. Each running replica completes a Sync at
// least every RenewInterval (a tick that would make one late is not
// taken): the condition under which Owns promises one owner per pool.
// Replicas join, sync, crash (stop, lease kept), leave (Leave, and the
// process goes on running and is asked Owns), stall (stop syncing and
// serving for a while, for as long as they like, then go on), restart
// under the identity of one that crashed or left, and have their lease
// deleted under them, once every other replica has seen it (see Owns).
// The Sync of the fake client is instantaneous.
const (
	modelLease = 3 * time.Second
	modelRenew = time.Second
)

type replicaState int

const (
	running replicaState = iota
	stalled
	crashed
	left
)

type modelReplica struct {
	m        *sharding.Membership
	state    replicaState
	lastSync time.Time
}

type ownsModel struct {
	c     client.Client
	clk   *clocktesting.FakeClock
	byNS  bool
	pools []types.NamespacedName
	// reps is the process now holding each identity; ghosts the
	// processes that left and still run.
	reps   map[string]*modelReplica
	ghosts []*sharding.Membership
	next   int
}

func (w *ownsModel) in(state replicaState) []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(w.reps)) {
		if w.reps[id].state == state {
			out = append(out, id)
		}
	}
	return out
}

func (w *ownsModel) pick(t *rapid.T, state replicaState) string {
	ids := w.in(state)
	if len(ids) == 0 {
		t.Skip("no replica in that state")
	}
	return rapid.SampledFrom(ids).Draw(t, "replica")
}

func (w *ownsModel) sync(t *rapid.T, id string) {
	r := w.reps[id]
	if err := r.m.Sync(context.Background()); err != nil {
		t.Fatalf("sync %s: %v", id, err)
	}
	r.state, r.lastSync = running, w.clk.Now()
}

func (w *ownsModel) start(t *rapid.T, id string) {
	m, err := sharding.New(w.c, sharding.Options{Namespace: "leases", Group: "model", Identity: id,
		LeaseDuration: modelLease, RenewInterval: modelRenew, Clock: w.clk, ByNamespace: w.byNS})
	if err != nil {
		t.Fatalf("new %s: %v", id, err)
	}
	w.reps[id] = &modelReplica{m: m}
	w.sync(t, id)
}

// atMostOneOwner checks that no two of the processes that run and serve
// (running replicas and those that left) own one pool.
func (w *ownsModel) atMostOneOwner(t *rapid.T) {
	asked := slices.Clone(w.ghosts)
	for _, id := range w.in(running) {
		asked = append(asked, w.reps[id].m)
	}
	for _, p := range w.pools {
		var owners []string
		for _, m := range asked {
			if m.Owns(p) {
				owners = append(owners, fmt.Sprintf("%p", m))
			}
		}
		if len(owners) > 1 {
			t.Fatalf("at %s pool %s is owned by %d processes", w.clk.Now().Sub(epoch), p, len(owners))
		}
	}
}

func (w *ownsModel) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"join": func(t *rapid.T) {
			if len(w.in(running)) >= 3 {
				t.Skip("enough replicas")
			}
			w.next++
			w.start(t, fmt.Sprintf("r%d", w.next))
		},
		"restart": func(t *rapid.T) {
			ids := append(w.in(crashed), w.in(left)...)
			if len(ids) == 0 {
				t.Skip("none to restart")
			}
			slices.Sort(ids)
			w.start(t, rapid.SampledFrom(ids).Draw(t, "replica"))
		},
		"sync": func(t *rapid.T) { w.sync(t, w.pick(t, running)) },
		"syncAll": func(t *rapid.T) {
			for _, id := range w.in(running) {
				w.sync(t, id)
			}
		},
		"crash": func(t *rapid.T) { w.reps[w.pick(t, running)].state = crashed },
		"leave": func(t *rapid.T) {
			r := w.reps[w.pick(t, running)]
			if err := r.m.Leave(context.Background()); err != nil {
				t.Fatalf("leave: %v", err)
			}
			r.state = left
			w.ghosts = append(w.ghosts, r.m)
		},
		"stall":  func(t *rapid.T) { w.reps[w.pick(t, running)].state = stalled },
		"resume": func(t *rapid.T) { w.sync(t, w.pick(t, stalled)) },
		"deleteLease": func(t *rapid.T) {
			id := w.pick(t, running)
			for _, other := range append(w.in(running), w.in(stalled)...) {
				if !slices.Contains(w.reps[other].m.Members(), id) {
					// Another that never saw id (it joined since that one's
					// last Sync) would not see it leave either: it would
					// serve id's pools while id, not yet aware, still does.
					t.Skip("a replica has not seen it yet")
				}
			}
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "leases", Name: "poolalloc-model-" + id}}
			if err := w.c.Delete(context.Background(), l); client.IgnoreNotFound(err) != nil {
				t.Fatalf("delete lease of %s: %v", id, err)
			}
			// Another sees it at once, before id itself.
			if others := slices.DeleteFunc(w.in(running), func(o string) bool { return o == id }); len(others) > 0 {
				w.sync(t, rapid.SampledFrom(others).Draw(t, "sees it"))
			}
		},
		"tick": func(t *rapid.T) {
			limit := modelLease // no replica running: anything up to a lease
			for _, id := range w.in(running) {
				limit = min(limit, w.reps[id].lastSync.Add(modelRenew).Sub(w.clk.Now()))
			}
			steps := int64((limit - time.Nanosecond) / (50 * time.Millisecond))
			if steps < 1 {
				t.Skip("a running replica must sync first")
			}
			w.clk.Step(time.Duration(rapid.Int64Range(1, steps).Draw(t, "ticks")) * 50 * time.Millisecond)
		},
		"": w.atMostOneOwner,
	}
}

// settle stops the stalled replicas, then lets time pass with every
// running replica syncing until no lease is left to expire, and checks
// that each pool then has exactly one owner: the grace costs time, never
// a pool.
func (w *ownsModel) settle(t *rapid.T) {
	for _, id := range w.in(stalled) {
		w.reps[id].state = crashed
	}
	for end := w.clk.Now().Add(modelLease + 3*modelRenew); w.clk.Now().Before(end); {
		w.clk.Step(modelRenew / 2)
		for _, id := range w.in(running) {
			w.sync(t, id)
		}
		w.atMostOneOwner(t)
	}
	ids := w.in(running)
	if len(ids) == 0 {
		return
	}
	for _, id := range ids {
		if got := w.reps[id].m.Members(); !slices.Equal(got, ids) {
			t.Fatalf("%s sees members %v, want %v", id, got, ids)
		}
	}
	for _, p := range w.pools {
		n := 0
		for _, id := range ids {
			if w.reps[id].m.Owns(p) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("settled, pool %s has %d owners among %v", p, n, ids)
		}
	}
}

// At every instant no pool has two owners among the replicas that serve,
// as long as each running replica syncs at least every RenewInterval; and
// once the members settle every pool has exactly one.
func TestOwnsAtMostOneOwner(t *testing.T) {
	var pools []types.NamespacedName
	for i := range 12 {
		pools = append(pools, types.NamespacedName{Namespace: fmt.Sprintf("%c-ns", 'a'+i%6), Name: fmt.Sprintf("pool-%d", i)})
	}
	rapid.Check(t, func(t *rapid.T) {
		w := &ownsModel{c: fake.NewClientBuilder().Build(), clk: clocktesting.NewFakeClock(epoch),
			byNS: rapid.Bool().Draw(t, "byNamespace"), pools: pools, reps: map[string]*modelReplica{}}
		for range 2 { // about 60 actions a history: time for replicas to settle, and then be disturbed
			t.Repeat(w.actions())
		}
		w.settle(t)
	})
}
