package follow_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/allocator/follow"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
)

// calls records what a Follower asked of its allocator and its lister.
type calls struct {
	allocator.Allocator // the real one, on the fake client

	mu      sync.Mutex
	lists   int
	rounds  int
	updates []allocator.Changes
}

func (c *calls) Round(ctx context.Context, in allocator.Input) (allocator.Result, error) {
	c.mu.Lock()
	c.rounds++
	c.mu.Unlock()
	return c.Allocator.Round(ctx, in)
}

func (c *calls) Update(ctx context.Context, ch allocator.Changes) (allocator.Result, error) {
	c.mu.Lock()
	c.updates = append(c.updates, ch)
	c.mu.Unlock()
	return c.Allocator.Update(ctx, ch)
}

func (c *calls) lastUpdate(t *testing.T) allocator.Changes {
	t.Helper()
	require.NotEmpty(t, c.updates, "no Update")
	return c.updates[len(c.updates)-1]
}

// setup is a fake API server with pool ns/p of n ready pods, an allocator
// (without pod marks: the fake server's pods are not patched by the
// tests' events) and a Follower on it whose clock the test moves.
type setup struct {
	c    client.Client
	a    *calls
	f    *follow.Follower
	pool types.NamespacedName
	now  time.Time
}

func newSetup(t *testing.T, n int) *setup {
	t.Helper()
	scheme, err := testenv.NewScheme()
	require.NoError(t, err)
	c := fake.NewClientBuilder().WithGlobalResourceVersionCounter().WithScheme(scheme).
		WithStatusSubresource(&corev1.Pod{}, &testenv.Claim{}).Build()
	_, err = testenv.CreatePods(t.Context(), c, "ns", "p", n, true)
	require.NoError(t, err)
	a, err := allocator.New(c, allocator.WithPodMarks(false))
	require.NoError(t, err)
	s := &setup{c: c, a: &calls{Allocator: a}, pool: types.NamespacedName{Namespace: "ns", Name: "p"}, now: time.Unix(1000, 0)}
	s.f, err = follow.New(follow.Config{
		Allocator: s.a,
		PodPool:   podPool,
		ClaimPool: claimPool,
		Claim: func(o client.Object) allocator.Claim {
			cl := o.(*testenv.Claim)
			return allocator.Claim{Want: int(cl.Spec.Replicas), Priority: cl.Spec.Priority}
		},
		List: func(ctx context.Context, pool types.NamespacedName) (allocator.Input, error) {
			s.a.mu.Lock()
			s.a.lists++
			s.a.mu.Unlock()
			return world.Input(ctx, c, pool)
		},
		Resync: time.Minute,
		Now:    func() time.Time { return s.now },
	})
	require.NoError(t, err)
	return s
}

func podPool(pod *corev1.Pod) types.NamespacedName {
	if p := pod.Labels[testenv.PoolLabel]; p != "" {
		return types.NamespacedName{Namespace: pod.Namespace, Name: p}
	}
	return types.NamespacedName{}
}

func claimPool(o client.Object) types.NamespacedName {
	if cl, ok := o.(*testenv.Claim); ok && cl.Spec.PoolRef != "" {
		return types.NamespacedName{Namespace: cl.Namespace, Name: cl.Spec.PoolRef}
	}
	return types.NamespacedName{}
}

// claim creates a claim of pool p and returns it as the API server has it.
func (s *setup) claim(t *testing.T, name string, want int32) *testenv.Claim {
	t.Helper()
	cl := testenv.NewClaim("ns", name, "p", want)
	cl.UID = types.UID("uid-" + name)
	require.NoError(t, s.c.Create(t.Context(), cl))
	return cl
}

// get reads obj back from the API server.
func (s *setup) get(t *testing.T, obj client.Object) {
	t.Helper()
	require.NoError(t, s.c.Get(t.Context(), client.ObjectKeyFromObject(obj), obj))
}

func (s *setup) pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{}
	require.NoError(t, s.c.Get(t.Context(), types.NamespacedName{Namespace: "ns", Name: name}, pod))
	return pod
}

func (s *setup) sync(t *testing.T) (allocator.Result, bool) {
	t.Helper()
	res, full, err := s.f.Sync(t.Context(), s.pool)
	require.NoError(t, err)
	return res, full
}

func TestNewNamesMissingField(t *testing.T) {
	_, err := follow.New(follow.Config{PodPool: podPool})
	require.ErrorContains(t, err, "Config.Allocator is required")
	s := newSetup(t, 0)
	_, err = follow.New(follow.Config{Allocator: s.a, PodPool: podPool, ClaimPool: claimPool,
		Claim: func(client.Object) allocator.Claim { return allocator.Claim{} }})
	require.ErrorContains(t, err, "Config.List is required")
}

func TestFirstSyncListsThenEventsUpdate(t *testing.T) {
	s := newSetup(t, 3)
	a := s.claim(t, "a", 1)
	// An event of a pool never synced is not kept: the first Sync lists.
	require.Equal(t, []types.NamespacedName{s.pool}, s.f.OnClaim(nil, a))
	res, full := s.sync(t)
	require.True(t, full)
	require.Len(t, res.Allocated, 1)
	require.Len(t, res.Idle, 2, "a Round fills Idle")
	require.Equal(t, 1, s.a.lists)

	// Later changes arrive as events and cost an Update of just them.
	b := s.claim(t, "b", 2)
	s.f.OnClaim(nil, b)
	res, full = s.sync(t)
	require.False(t, full)
	require.Equal(t, 1, s.a.lists, "no listing after the first")
	require.Len(t, res.Allocated, 1)
	require.ElementsMatch(t, []string{"p-1", "p-2"}, res.Allocated[0].Pods)
	require.Nil(t, res.Idle, "Update leaves Idle nil")
	require.Zero(t, res.IdleCount)
	up := s.a.lastUpdate(t)
	require.Len(t, up.Claims, 1)
	require.Equal(t, 2, up.Claims[0].Want, "Want comes from Config.Claim")
	require.Same(t, b, up.Claims[0].Object)
	require.Empty(t, up.Pods)
}

func TestEventsCoalescePerObject(t *testing.T) {
	s := newSetup(t, 2)
	s.sync(t)
	p0 := s.pod(t, "p-0")
	older := p0.DeepCopy()
	older.ResourceVersion = "1"
	s.f.OnPod(nil, older)
	s.f.OnPod(older, p0)
	// Deleted, then created again under the same name: the new pod stands.
	p1 := s.pod(t, "p-1")
	s.f.OnPod(p1, nil)
	again := p1.DeepCopy()
	again.UID = "new"
	s.f.OnPod(nil, again)
	// Created, then deleted: only the deletion stands.
	extra := p1.DeepCopy()
	extra.Name = "p-9"
	s.f.OnPod(nil, extra)
	s.f.OnPod(extra, nil)
	// A claim changed twice, then one deleted.
	a := s.claim(t, "a", 1)
	s.f.OnClaim(nil, a)
	a2 := a.DeepCopy()
	a2.Spec.Replicas = 0
	s.f.OnClaim(a, a2)
	c := s.claim(t, "c", 1)
	s.f.OnClaim(nil, c)
	s.f.OnClaim(c, nil)

	_, full := s.sync(t)
	require.False(t, full)
	up := s.a.lastUpdate(t)
	names := make([]string, 0, len(up.Pods))
	for _, p := range up.Pods {
		names = append(names, p.Name)
		if p.Name == "p-0" {
			require.Equal(t, p0.ResourceVersion, p.ResourceVersion, "the newest version of p-0")
		}
		if p.Name == "p-1" {
			require.Equal(t, types.UID("new"), p.UID)
		}
	}
	slices.Sort(names)
	require.Equal(t, []string{"p-0", "p-1"}, names)
	require.Equal(t, []string{"p-9"}, up.DeletedPods)
	require.Len(t, up.Claims, 1)
	require.Same(t, a2, up.Claims[0].Object)
	require.Equal(t, []types.UID{c.UID}, up.DeletedClaims)

	// Nothing new: the next Update is empty, but still runs.
	before := len(s.a.updates)
	s.sync(t)
	require.Len(t, s.a.updates, before+1)
	require.Empty(t, s.a.lastUpdate(t).Claims)
}

func TestClaimMovedBetweenPools(t *testing.T) {
	s := newSetup(t, 2)
	other := types.NamespacedName{Namespace: "ns", Name: "q"}
	a := s.claim(t, "a", 1)
	s.sync(t)
	_, _, err := s.f.Sync(t.Context(), other)
	require.NoError(t, err)

	moved := a.DeepCopy()
	moved.Spec.PoolRef = "q"
	require.ElementsMatch(t, []types.NamespacedName{s.pool, other}, s.f.OnClaim(a, moved))
	s.sync(t)
	require.Equal(t, []types.UID{a.UID}, s.a.lastUpdate(t).DeletedClaims)
	_, _, err = s.f.Sync(t.Context(), other)
	require.NoError(t, err)
	up := s.a.lastUpdate(t)
	require.Equal(t, other, up.Pool)
	require.Len(t, up.Claims, 1)
	require.Empty(t, up.DeletedClaims)
}

func TestResyncInvalidateAndForgetListWhole(t *testing.T) {
	s := newSetup(t, 2)
	s.sync(t)
	_, full := s.sync(t)
	require.False(t, full)

	s.now = s.now.Add(time.Minute) // Resync
	_, full = s.sync(t)
	require.True(t, full, "a resync after Config.Resync")
	_, full = s.sync(t)
	require.False(t, full)

	s.f.Invalidate(s.pool)
	_, full = s.sync(t)
	require.True(t, full, "after Invalidate")

	s.f.Forget(s.pool)
	a := s.claim(t, "a", 1)
	s.f.OnClaim(nil, a) // not kept: the pool is not followed
	res, full := s.sync(t)
	require.True(t, full, "after Forget")
	require.Len(t, res.Allocated, 1, "the listing has the claim")
	require.Equal(t, 4, s.a.lists)
}

// A pool the allocator forgot (or failed closed) refuses Update with
// ErrInvalidInput: the next Sync lists it whole, and nothing is lost.
func TestUpdateRefusedListsWholeNext(t *testing.T) {
	s := newSetup(t, 2)
	s.sync(t)
	require.NoError(t, s.a.ForgetPool(s.pool))
	a := s.claim(t, "a", 1)
	s.f.OnClaim(nil, a)
	_, full, err := s.f.Sync(t.Context(), s.pool)
	require.False(t, full)
	require.ErrorIs(t, err, allocator.ErrInvalidInput)
	res, full := s.sync(t)
	require.True(t, full)
	require.Len(t, res.Allocated, 1)
}

// A Sync whose ctx ended before its round keeps the changes for the next.
func TestEndedContextKeepsChanges(t *testing.T) {
	s := newSetup(t, 2)
	s.sync(t)
	a := s.claim(t, "a", 1)
	s.f.OnClaim(nil, a)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, _, err := s.f.Sync(ctx, s.pool)
	require.ErrorIs(t, err, context.Canceled)
	// A newer version arriving meanwhile wins over the one put back.
	a2 := a.DeepCopy()
	a2.Labels = map[string]string{"changed": "yes"}
	require.NoError(t, s.c.Update(t.Context(), a2))
	s.f.OnClaim(a, a2)
	b := s.claim(t, "b", 1)
	s.f.OnClaim(nil, b)
	res, full := s.sync(t)
	require.False(t, full)
	require.Len(t, res.Allocated, 2, "a's change was kept")
	up := s.a.lastUpdate(t)
	require.Len(t, up.Claims, 2)
	for _, c := range up.Claims {
		if c.Object.GetUID() == a.UID {
			require.Same(t, a2, c.Object, "the newer version of a")
		}
	}
}

// A failed listing leaves the pool to be listed again.
func TestFailedListingListsAgain(t *testing.T) {
	s := newSetup(t, 1)
	failed := false
	f, err := follow.New(follow.Config{
		Allocator: s.a, PodPool: podPool, ClaimPool: claimPool,
		Claim: func(client.Object) allocator.Claim { return allocator.Claim{Want: 1} },
		List: func(ctx context.Context, pool types.NamespacedName) (allocator.Input, error) {
			if !failed {
				failed = true
				return allocator.Input{}, context.DeadlineExceeded
			}
			return world.Input(ctx, s.c, pool)
		},
	})
	require.NoError(t, err)
	_, full, err := f.Sync(t.Context(), s.pool)
	require.True(t, full)
	require.ErrorContains(t, err, "pool ns/p: list")
	_, full, err = f.Sync(t.Context(), s.pool)
	require.NoError(t, err)
	require.True(t, full)
	require.Equal(t, 1, s.a.rounds)
}

// A stale event (an older version of a pod than the allocator knows) and
// a replay of every object change nothing the allocator decided.
func TestStaleAndReplayedEventsAreHarmless(t *testing.T) {
	s := newSetup(t, 2)
	a := s.claim(t, "a", 1)
	res, _ := s.sync(t)
	require.Len(t, res.Allocated, 1)
	held := res.Allocated[0].Pods[0]
	pod := s.pod(t, held)
	stale := pod.DeepCopy()
	stale.ResourceVersion = "1"
	stale.Status.Conditions = nil // unready in an old version
	s.f.OnPod(pod, stale)
	s.get(t, a)
	s.f.OnClaim(nil, a)
	for _, name := range []string{"p-0", "p-1"} {
		s.f.OnPod(nil, s.pod(t, name))
	}
	res, _ = s.sync(t)
	require.Empty(t, res.Allocated)
	require.Empty(t, res.Released)
	require.Empty(t, res.Lost, "a stale version does not make a held pod unready")
	h, ok, err := s.a.Store().HolderOf(s.pool, held)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, a.UID, h.UID)
}

// recorder is a workqueue that records what is added.
type recorder struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
	added []reconcile.Request
}

func (r *recorder) Add(req reconcile.Request) { r.added = append(r.added, req) }

func TestEventHandlersKeepThenEnqueue(t *testing.T) {
	s := newSetup(t, 2)
	s.sync(t)
	q := &recorder{}
	pods, claims := s.f.PodEvents(), s.f.ClaimEvents()
	ctx := t.Context()
	p0 := s.pod(t, "p-0")
	pods.Update(ctx, event.UpdateEvent{ObjectOld: p0, ObjectNew: p0}, q)
	// A delete whose final state was missed counts as a delete.
	p1 := s.pod(t, "p-1")
	pods.Delete(ctx, event.DeleteEvent{Object: p1, DeleteStateUnknown: true}, q)
	// A pod of no pool is not enqueued.
	stray := p0.DeepCopy()
	stray.Name, stray.Labels = "stray", nil
	pods.Create(ctx, event.CreateEvent{Object: stray}, q)
	a := s.claim(t, "a", 1)
	claims.Create(ctx, event.CreateEvent{Object: a}, q)
	require.Equal(t, []reconcile.Request{{NamespacedName: s.pool}, {NamespacedName: s.pool}, {NamespacedName: s.pool}}, q.added)

	s.sync(t)
	up := s.a.lastUpdate(t)
	require.Len(t, up.Pods, 1)
	require.Equal(t, "p-0", up.Pods[0].Name)
	require.Equal(t, []string{"p-1"}, up.DeletedPods)
	require.Len(t, up.Claims, 1)
}
