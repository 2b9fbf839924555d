package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/poolalloc/poolalloc/allocator"
	poolv1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
	"github.com/poolalloc/poolalloc/examples/operator/fakekubelet"
	"github.com/poolalloc/poolalloc/syncer"
)

// Timeouts of the test's waits. They are generous: the machine may be
// shared; a passing run takes a fraction.
const (
	waitFor  = 30 * time.Second
	pollEach = 100 * time.Millisecond
)

// TestOperator runs the operator (a manager with Setup) and the fake
// kubelet on the real API server: claims are served, a released pod is
// deleted and replaced, a deleted claim lets its pods go, and after the
// operator is killed mid-way a new one recovers: no pod in two records,
// every record's pods exist and are marked for their claim, every claim
// holds what it wants. After every poll, no pod is in two claims' records.
func TestOperator(t *testing.T) {
	h := newHarness(t)
	ctx, ns := h.ctx, h.ns
	k := h.startKubelet()
	stop := h.startOperator()

	// A pool of 6 and claims wanting 2+1+2: all served, one pod idle.
	require.NoError(t, h.c.Create(ctx, poolv1.NewPool(ns, h.pool, 6)))
	for name, want := range map[string]int32{"a": 2, "b": 1, "c": 2} {
		require.NoError(t, h.c.Create(ctx, poolv1.NewClaim(ns, name, h.pool, want)))
	}
	s := h.eventually("claims served, pool of 6", func(s snap) bool { return s.served() && s.live() == 6 })
	before := s.podUIDs()

	// a gives back one pod for good: it is deleted, and the pool, down to
	// 5 pods, creates a new one.
	gave := s.held["a"][0]
	gaveUID := s.pods[gave].UID
	h.release("a", gave, 1)
	s = h.eventually("released pod deleted and replaced", func(s snap) bool {
		p, ok := s.pods[gave]
		return (!ok || p.UID != gaveUID) && s.served() && slices.Contains(s.released["a"], gave) &&
			s.live() == 6 && len(s.newPods(before)) > 0
	})
	require.NotContains(t, s.held["a"], gave)
	h.clearRelease("a")

	// c is deleted: its pods are recycled (deleted), its finalizer goes and
	// so does c.
	cPods := map[string]types.UID{}
	for _, p := range s.held["c"] {
		cPods[p] = s.pods[p].UID
	}
	cl := s.claims["c"]
	require.NoError(t, h.c.Delete(ctx, &cl))
	h.eventually("deleted claim gone, its pods recycled", func(s snap) bool {
		if _, ok := s.claims["c"]; ok {
			return false
		}
		for name, uid := range cPods {
			if p, ok := s.pods[name]; ok && p.UID == uid && strings.HasPrefix(p.Annotations[allocator.DefaultPodMarkKey], "c/") {
				return false // still marked for c
			}
		}
		return s.served() && s.live() == 6
	})

	// d wants more than the pool has idle: new pods are created for it.
	// The operator is killed while it serves d, and while it is down b
	// scales up and a swaps its pod (release, same want).
	d := poolv1.NewClaim(ns, "d", h.pool, 6)
	d.Spec.Priority = 5
	require.NoError(t, h.c.Create(ctx, d))
	h.eventually("d served in part", func(s snap) bool { return len(s.held["d"]) > 0 })
	stop()
	s = h.read(t)
	t.Logf("killed with d holding %d of 6 pods", len(s.held["d"]))
	h.edit("b", func(cl *poolv1.Claim) { cl.Spec.Replicas = 2 })
	h.release("a", s.held["a"][0], 1)

	h.startOperator()
	s = h.eventually("all served after the restart", func(s snap) bool { return s.served() })
	h.clearRelease("a")
	s = h.eventually("release cleared", func(s snap) bool { return s.served() && len(s.release["a"]) == 0 })

	// Pod for pod: every record's pods exist, are live and marked for
	// their claim, and no pod is in two records; each claim holds exactly
	// what it wants.
	holder, wanted := map[string]string{}, 0
	for name, cl := range s.claims {
		wanted += int(cl.Spec.Replicas)
		require.Len(t, s.held[name], int(cl.Spec.Replicas), "claim %s", name)
		for _, p := range s.held[name] {
			require.Empty(t, holder[p], "pod %s in the records of %s and %s", p, holder[p], name)
			holder[p] = name
			pod, ok := s.pods[p]
			require.True(t, ok, "pod %s of claim %s exists", p, name)
			require.True(t, podLive(&pod), "pod %s of claim %s is live", p, name)
			require.Equal(t, name+"/"+string(cl.UID), pod.Annotations[allocator.DefaultPodMarkKey], "mark of pod %s", p)
			require.Equal(t, name, pod.Labels[ClaimLabel], "claim label of pod %s (the mark hook)", p)
		}
	}
	// A pod no claim holds carries no claim label: the unmark took it off.
	for p, pod := range s.pods {
		if holder[p] == "" {
			require.NotContains(t, pod.Labels, ClaimLabel, "idle pod %s", p)
		}
	}
	require.Len(t, holder, wanted)
	require.Equal(t, 1+2+6, wanted)
	h.noViolations()
	require.Zero(t, k.Finished(), "the operator's pods (no node, no finalizer) are deleted at once: the fake kubelet had nothing to finish")
}

// harness drives one test's operator and reads what it did.
type harness struct {
	t    *testing.T
	ctx  context.Context
	c    client.Client
	ns   string
	pool string
	logs syncBuffer

	mu         sync.Mutex
	violations []string // guarded by mu
}

// newHarness returns a harness for pool "p" in a namespace of its own,
// whose operator logs are printed if t fails (or OPERATOR_TEST_LOGS is
// set).
func newHarness(t *testing.T) *harness {
	ctx := t.Context()
	h := &harness{t: t, ctx: ctx, c: env.Client, ns: env.namespace(ctx, t), pool: "p"}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("OPERATOR_TEST_LOGS") != "" {
			t.Logf("operator logs:\n%s", h.logs.String())
		}
	})
	return h
}

// startKubelet runs the fake kubelet on the test's namespace until the
// test ends.
func (h *harness) startKubelet() *fakekubelet.Kubelet {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	k := &fakekubelet.Kubelet{Client: h.c, Namespace: h.ns, Interval: 100 * time.Millisecond, StartDelay: 500 * time.Millisecond}
	go func() { done <- k.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		require.NoError(h.t, <-done)
	})
	return k
}

// startOperator starts a manager of its own (own cache and client, leader
// election and metrics off) with Setup, and returns a func that stops it
// and waits; the test's end stops it too.
func (h *harness) startOperator() (stop func()) {
	t := h.t
	scheme, err := NewScheme()
	require.NoError(t, err)
	cacheOpts, err := CacheOptions(h.ns)
	require.NoError(t, err)
	log := newLogger(&h.logs, 1)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  cacheOpts,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		Logger:                 log,
		// A restarted operator registers the "pool" controller again in
		// this process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	// A short quarantine and resync: the operator may be killed between
	// a pod's mark and its claim's record, and the restarted one settles
	// that pod only once the quarantine has passed, at a reconcile.
	require.NoError(t, Setup(mgr, Options{Metrics: prometheus.NewRegistry(), Quarantine: 2 * time.Second, Resync: time.Second}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err, "manager")
			case <-time.After(waitFor):
				require.Fail(t, "the manager did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// snap is the test namespace as the API server shows it: claims, their
// records, and the pool's pods, by name.
type snap struct {
	claims                  map[string]poolv1.Claim
	held, release, released map[string][]string
	pods                    map[string]corev1.Pod
}

// read reads a snap; claims are listed in one request, so their records
// are one consistent state.
func (h *harness) read(t require.TestingT) snap {
	s, err := h.tryRead()
	require.NoError(t, err)
	return s
}

func (h *harness) tryRead() (snap, error) {
	s := snap{claims: map[string]poolv1.Claim{}, held: map[string][]string{}, release: map[string][]string{},
		released: map[string][]string{}, pods: map[string]corev1.Pod{}}
	var claims poolv1.ClaimList
	if err := h.c.List(h.ctx, &claims, client.InNamespace(h.ns)); err != nil {
		return s, err
	}
	records, err := syncer.NewAnnotationSyncer(h.c, syncer.DefaultKeys())
	if err != nil {
		return s, err
	}
	for _, cl := range claims.Items {
		rec, err := records.Read(&cl)
		if err != nil {
			return s, fmt.Errorf("claim %s: %w", cl.Name, err)
		}
		s.claims[cl.Name] = cl
		s.held[cl.Name], s.release[cl.Name], s.released[cl.Name] = rec.Held(), rec.Release, rec.Released
	}
	var pods corev1.PodList
	if err := h.c.List(h.ctx, &pods, client.InNamespace(h.ns), client.MatchingLabels{PoolLabel: h.pool}); err != nil {
		return s, err
	}
	for _, p := range pods.Items {
		s.pods[p.Name] = p
	}
	return s, nil
}

// exclusive returns a violation of I1 in the records, "" if none.
func (s snap) exclusive() string {
	holder := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(s.held)) {
		for _, p := range s.held[name] {
			if other := holder[p]; other != "" {
				return fmt.Sprintf("pod %s in the records of %s and %s", p, other, name)
			}
			holder[p] = name
		}
	}
	return ""
}

// served reports whether every claim holds what it wants, with no pod
// given back still pending, and none is being deleted.
func (s snap) served() bool {
	for name, cl := range s.claims {
		if cl.DeletionTimestamp != nil || len(s.held[name]) != int(cl.Spec.Replicas) {
			return false
		}
		for _, p := range s.release[name] {
			if !slices.Contains(s.released[name], p) {
				return false
			}
		}
	}
	return true
}

// live counts the pool's pods that are live (not deleted, not finished).
func (s snap) live() int {
	n := 0
	for _, p := range s.pods {
		if podLive(&p) {
			n++
		}
	}
	return n
}

func (s snap) podUIDs() map[types.UID]bool {
	out := map[types.UID]bool{}
	for _, p := range s.pods {
		out[p.UID] = true
	}
	return out
}

// newPods lists the pods not in before.
func (s snap) newPods(before map[types.UID]bool) []string {
	var out []string
	for name, p := range s.pods {
		if !before[p.UID] {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func (s snap) String() string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(s.claims)) {
		cl := s.claims[name]
		fmt.Fprintf(&b, "claim %s want %d deleting %t held %v release %v released %v; ", name, cl.Spec.Replicas,
			cl.DeletionTimestamp != nil, s.held[name], s.release[name], s.released[name])
	}
	fmt.Fprintf(&b, "%d pods, %d live", len(s.pods), s.live())
	return b.String()
}

// eventually polls the API server until cond holds, checking after every
// read that no pod is in two records (a violation ends the test).
func (h *harness) eventually(what string, cond func(snap) bool) snap {
	h.t.Helper()
	var mu sync.Mutex
	var last snap
	var lastErr error
	violated := false
	ok := assert.Eventually(h.t, func() bool {
		s, err := h.tryRead()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			lastErr = err
			return false
		}
		last = s
		if v := s.exclusive(); v != "" {
			h.mu.Lock()
			h.violations = append(h.violations, what+": "+v)
			h.mu.Unlock()
			violated = true
			return true
		}
		return cond(s)
	}, waitFor, pollEach)
	mu.Lock()
	defer mu.Unlock()
	if !ok || violated {
		h.noViolations()
		require.FailNowf(h.t, "not reached", "%s: last seen: %v (last read error: %v)", what, last, lastErr)
	}
	return last
}

func (h *harness) noViolations() {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Empty(h.t, h.violations, "exclusivity (I1) broken in the records")
}

// edit changes a claim with a merge patch, as its owner would.
func (h *harness) edit(name string, change func(*poolv1.Claim)) {
	h.t.Helper()
	var cl poolv1.Claim
	require.NoError(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, &cl))
	orig := cl.DeepCopy()
	change(&cl)
	require.NoError(h.t, h.c.Patch(h.ctx, &cl, client.MergeFrom(orig)), "claim %s", name)
}

// release gives pod back for claim name, which then wants replicas.
func (h *harness) release(name, pod string, replicas int32) {
	h.t.Helper()
	value, err := syncer.EncodePods([]string{pod})
	require.NoError(h.t, err)
	h.edit(name, func(cl *poolv1.Claim) {
		if cl.Annotations == nil {
			cl.Annotations = map[string]string{}
		}
		cl.Annotations[syncer.DefaultKeys().Release] = value
		cl.Spec.Replicas = replicas
	})
}

// clearRelease clears the release annotation once its pods are released,
// as the owner's protocol asks.
func (h *harness) clearRelease(name string) {
	h.t.Helper()
	h.edit(name, func(cl *poolv1.Claim) { delete(cl.Annotations, syncer.DefaultKeys().Release) })
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestPoolDeletedAndRecreated deletes a pool whose claim holds pods: the
// pods are taken back and deleted (there is no garbage collector here),
// and the allocator forgets the pool; created again, the pool serves the
// claim with new pods. A claim's unreadable release request is reported as
// a Warning event on the claim.
func TestPoolDeletedAndRecreated(t *testing.T) {
	h := newHarness(t)
	ctx, ns := h.ctx, h.ns
	h.startKubelet()
	h.startOperator()

	require.NoError(t, h.c.Create(ctx, poolv1.NewPool(ns, h.pool, 3)))
	require.NoError(t, h.c.Create(ctx, poolv1.NewClaim(ns, "a", h.pool, 2)))
	s := h.eventually("claim served", func(s snap) bool { return s.served() && s.live() == 3 })
	before := s.podUIDs()

	h.edit("a", func(cl *poolv1.Claim) {
		if cl.Annotations == nil {
			cl.Annotations = map[string]string{}
		}
		cl.Annotations[syncer.DefaultKeys().Release] = "not a record"
	})
	require.Eventually(t, func() bool {
		var events eventsv1.EventList
		if err := h.c.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return false
		}
		return slices.ContainsFunc(events.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Name == "a" && e.Type == corev1.EventTypeWarning && e.Reason == allocator.EventInvalidRelease
		})
	}, waitFor, pollEach, "a Warning event on claim a")
	h.clearRelease("a")

	require.NoError(t, h.c.Delete(ctx, poolv1.NewPool(ns, h.pool, 0)))
	h.eventually("pool's pods taken back and deleted", func(s snap) bool {
		return len(s.pods) == 0 && len(s.held["a"]) == 0
	})

	require.NoError(t, h.c.Create(ctx, poolv1.NewPool(ns, h.pool, 2)))
	s = h.eventually("claim served by the new pool", func(s snap) bool { return s.served() && s.live() == 2 })
	for _, p := range s.held["a"] {
		require.False(t, before[s.pods[p].UID], "pod %s is new", p)
	}
	h.noViolations()
}

// TestOperatorRestartAfterMarkWithoutRecord starts the operator on what a
// process killed between a pod's mark and its claim's record leaves: an
// idle pod marked for a claim whose record does not list it. The pod is
// reserved for the claim for a quarantine (the hand-out may still be in
// flight), then settled, and the claim is served. Meanwhile the pool is
// not grown for the claim: the reserved pod is not in the Shortfall.
// Before, the operator created a pod on every reconcile until the
// quarantine ended (TestFork, once: 185 pods in 30 s).
func TestOperatorRestartAfterMarkWithoutRecord(t *testing.T) {
	h := newHarness(t)
	ctx, ns := h.ctx, h.ns
	h.startKubelet()
	stop := h.startOperator()
	require.NoError(t, h.c.Create(ctx, poolv1.NewPool(ns, h.pool, 4)))
	s := h.eventually("pool of 4 ready", func(s snap) bool {
		ready := 0
		for _, p := range s.pods {
			if podLive(&p) && fakekubelet.IsPodReady(&p) {
				ready++
			}
		}
		return ready == 4
	})
	stop()

	// The killed process marked an idle pod for d and wrote nothing else.
	d := poolv1.NewClaim(ns, "d", h.pool, 1)
	require.NoError(t, h.c.Create(ctx, d))
	marked := slices.Sorted(maps.Keys(s.pods))[0]
	pod := s.pods[marked]
	patch := client.MergeFromWithOptions(pod.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[allocator.DefaultPodMarkKey] = d.Name + "/" + string(d.UID)
	require.NoError(t, h.c.Patch(ctx, &pod, patch))

	start := time.Now()
	h.startOperator()
	most := 0
	s = h.eventually("d served", func(s snap) bool {
		most = max(most, len(s.pods))
		return s.served()
	})
	t.Logf("d served %s after the restart; at most %d pods", time.Since(start).Round(100*time.Millisecond), most)
	// The pool's 4 pods, and at most one more: the marked pod, settled,
	// is deleted and replaced.
	require.LessOrEqual(t, most, 5, "pods of the pool at most")
	require.Len(t, s.held["d"], 1)
	h.noViolations()
}
