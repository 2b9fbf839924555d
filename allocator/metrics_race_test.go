package allocator_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/store"
)

// holdingClock is a fake clock whose first Since call once armed waits
// until release is closed. Round and Update call Since when they are done
// with the pool, to time the call: the hold lets a test run other calls
// between a call's end and its return. Rounds that serve a claim call
// Since inside too: tests that arm it run calls that serve no one.
type holdingClock struct {
	*clocktesting.FakeClock
	mu      sync.Mutex
	armed   bool
	held    chan struct{} // closed once a Since call waits
	release chan struct{}
}

func newHoldingClock() *holdingClock {
	return &holdingClock{FakeClock: clocktesting.NewFakeClock(time.Now())}
}

func (c *holdingClock) arm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed, c.held, c.release = true, make(chan struct{}), make(chan struct{})
}

func (c *holdingClock) Since(t time.Time) time.Duration {
	c.mu.Lock()
	hold, held, release := c.armed, c.held, c.release
	c.armed = false
	c.mu.Unlock()
	if hold {
		close(held)
		<-release
	}
	return c.FakeClock.Since(t)
}

// within runs f and fails the test if it does not return in a while (it
// waits for a lock the test holds, say).
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return", what)
	}
}

// call runs f in a goroutine; the returned function waits for it.
func call(f func()) (wait func()) {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	return func() { <-done }
}

func gaugeLabels(pool types.NamespacedName, state string) map[string]string {
	return map[string]string{"namespace": pool.Namespace, "name": pool.Name, "state": state}
}

// Two calls on one pool, the first returning after the second: the gauges
// show the pool after the second, the latest to finish with the pool.
func TestMetricsGaugesFollowTheLatestCall(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	pods, err := testenv.CreatePods(ctx, c, "ns", "p", 3, true)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	clk := newHoldingClock()
	a, err := allocator.New(c, allocator.WithMetrics(reg), allocator.WithClock(clk))
	require.NoError(t, err)

	clk.arm()
	var first allocator.Result
	var firstErr error
	wait := call(func() { first, firstErr = a.Round(ctx, allocator.Input{Pool: pool, Pods: pods}) })
	<-clk.held // the first call is done with the pool, not returned
	within(t, "the second Round", func() {
		res, err := a.Round(ctx, allocator.Input{Pool: pool, Pods: pods[:2]})
		require.NoError(t, err)
		require.Equal(t, 2, res.IdleCount)
	})
	close(clk.release)
	wait()
	require.NoError(t, firstErr)
	require.Equal(t, 3, first.IdleCount)
	require.Equal(t, 2.0, value(t, reg, "poolalloc_pods", gaugeLabels(pool, "idle")),
		"the gauges show the latest call to finish with the pool, not the latest to return")
}

// A call that finished with the pool before ForgetPool, and returns after
// it, does not set the gauges ForgetPool deleted again.
func TestMetricsForgetPoolRacingARound(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	pods, err := testenv.CreatePods(ctx, c, "ns", "p", 3, true)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	clk := newHoldingClock()
	a, err := allocator.New(c, allocator.WithMetrics(reg), allocator.WithClock(clk))
	require.NoError(t, err)
	_, err = a.Round(ctx, allocator.Input{Pool: pool, Pods: pods})
	require.NoError(t, err)
	require.Equal(t, 3.0, value(t, reg, "poolalloc_pods", gaugeLabels(pool, "idle")))

	clk.arm()
	var roundErr error
	wait := call(func() { _, roundErr = a.Round(ctx, allocator.Input{Pool: pool, Pods: pods}) })
	<-clk.held
	within(t, "ForgetPool", func() { require.NoError(t, a.ForgetPool(pool)) })
	close(clk.release)
	wait()
	require.NoError(t, roundErr)
	requireNoGauges(t, reg, pool)
}

// blockingStore holds DeletePool (recovery calls it too), and so
// ForgetPool with the pool's lock held, until release is closed, once
// the channels are set.
type blockingStore struct {
	store.AllocationStore
	deleting, release chan struct{}
}

func (s *blockingStore) DeletePool(pool types.NamespacedName) error {
	if s.deleting != nil {
		close(s.deleting)
		<-s.release
	}
	return s.AllocationStore.DeletePool(pool)
}

// A call that waited for the pool while ForgetPool held it does not set
// the gauges ForgetPool deleted again.
func TestMetricsForgetPoolWhileAnUpdateWaits(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	pods, err := testenv.CreatePods(ctx, c, "ns", "p", 3, true)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	st := &blockingStore{AllocationStore: store.NewInMemory()}
	a, err := allocator.New(c, allocator.WithMetrics(reg), allocator.WithStore(st))
	require.NoError(t, err)
	_, err = a.Round(ctx, allocator.Input{Pool: pool, Pods: pods})
	require.NoError(t, err)

	var forgetErr error
	st.deleting, st.release = make(chan struct{}), make(chan struct{})
	forgotten := call(func() { forgetErr = a.ForgetPool(pool) })
	<-st.deleting // ForgetPool holds the pool's lock
	// An Update, not a Round: should the call look the pool up again once
	// it is forgotten, it finds none it may update and reports nothing.
	updated := call(func() { _, _ = a.Update(ctx, allocator.Changes{Pool: pool, Pods: pods[:1]}) })
	waitForLock(t, "(*defaultAllocator).doUpdate")
	close(st.release)
	forgotten()
	updated()
	require.NoError(t, forgetErr)
	requireNoGauges(t, reg, pool)
}

// waitForLock waits until a goroutine running fn waits for a mutex.
func waitForLock(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "[sync.Mutex.Lock") && strings.Contains(g, fn) {
				return
			}
		}
	}
	t.Fatalf("no goroutine in %s waits for a lock", fn)
}

func requireNoGauges(t *testing.T, reg prometheus.Gatherer, pool types.NamespacedName) {
	t.Helper()
	byPool := map[string]string{"namespace": pool.Namespace, "name": pool.Name}
	for _, s := range []string{"idle", "held", "recycling", "lost", "starting"} {
		require.Nil(t, metricOf(t, reg, "poolalloc_pods", gaugeLabels(pool, s)), "state %s", s)
	}
	require.Nil(t, metricOf(t, reg, "poolalloc_shortfall", byPool))
	require.Nil(t, metricOf(t, reg, "poolalloc_pool_blocked", byPool))
}

// The histograms have as many series for three pools as for one; the
// gauges name each pool by namespace and name.
func TestMetricsHistogramsDoNotGrowWithPools(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	reg := prometheus.NewRegistry()
	a, err := allocator.New(c, allocator.WithMetrics(reg))
	require.NoError(t, err)
	serve := func(name string) {
		pool := types.NamespacedName{Namespace: "ns", Name: name}
		_, err := testenv.CreatePods(ctx, c, "ns", name, 2, true)
		require.NoError(t, err)
		cl := testenv.NewClaim("ns", "c-"+name, name, 1)
		cl.UID = types.UID("uid-" + name)
		require.NoError(t, c.Create(ctx, cl))
		res, err := world.Round(ctx, a, c, pool)
		require.NoError(t, err)
		require.Len(t, res.Allocated, 1)
		_, err = a.Update(ctx, allocator.Changes{Pool: pool})
		require.NoError(t, err)
		require.Equal(t, 1.0, value(t, reg, "poolalloc_pods", gaugeLabels(pool, "held")))
	}
	series := func() map[string]int {
		families, err := reg.Gather()
		require.NoError(t, err)
		n := map[string]int{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				if m.GetHistogram() != nil {
					n[f.GetName()]++
				}
			}
		}
		return n
	}

	serve("p1")
	one := series()
	require.Equal(t, map[string]int{"poolalloc_round_duration_seconds": 2, "poolalloc_time_to_serve_seconds": 1}, one,
		"round duration by call (Round, Update), time to serve unlabelled")
	serve("p2")
	serve("p3")
	require.Equal(t, one, series())
}
