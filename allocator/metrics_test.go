package allocator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

// metricOf returns the metric name with exactly the labels want among
// those reg gathers, nil if there is none.
func metricOf(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(want) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

// value is the value of a counter or gauge, 0 when it has no series yet.
func value(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	m := metricOf(t, reg, name, labels)
	switch {
	case m == nil:
		return 0
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// histogram is the count and sum of a histogram.
func histogram(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	m := metricOf(t, reg, name, labels)
	if m == nil {
		return 0, 0
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

func withLabel(base map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for bk, bv := range base {
		out[bk] = bv
	}
	return out
}

// On the real API server: the values the metrics take as a claim is
// served, waits for a pod the pool does not have, is served again, and
// gives a pod back.
func TestMetricsReportWhatRoundsDo(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 3)
	c := f.claim("c", "p", 2)
	reg := prometheus.NewRegistry()
	// The allocator's clock stands 3 s after the claim's creation.
	clk := clocktesting.NewFakeClock(c.CreationTimestamp.Add(3 * time.Second))
	a := f.alloc(allocator.WithMetrics(reg), allocator.WithClock(clk))
	byPool := map[string]string{"namespace": pool.Namespace, "name": pool.Name}
	pods := func(state string) float64 { return value(t, reg, "poolalloc_pods", withLabel(byPool, "state", state)) }

	res := f.round(a, pool)
	require.Len(t, res.Allocated, 1)
	require.Equal(t, 2, res.Held)
	require.Equal(t, 2.0, value(t, reg, "poolalloc_allocated_pods_total", byPool))
	require.Equal(t, 2.0, pods("held"))
	require.Equal(t, 1.0, pods("idle"))
	require.Equal(t, 0.0, pods("recycling"))
	require.Equal(t, 0.0, value(t, reg, "poolalloc_shortfall", byPool))
	require.Equal(t, 0.0, value(t, reg, "poolalloc_pool_blocked", byPool))
	n, sum := histogram(t, reg, "poolalloc_time_to_serve_seconds", map[string]string{})
	require.Equal(t, uint64(1), n, "c was served once")
	require.InDelta(t, 3.0, sum, 1e-9, "c waited from its creation to the hand-out")
	n, _ = histogram(t, reg, "poolalloc_round_duration_seconds", map[string]string{"call": "Round"})
	require.Equal(t, uint64(1), n)

	// c wants 4: the pool has one more pod for it, then none.
	f.scale("c", 4)
	res = f.round(a, pool)
	require.Equal(t, 1, res.Shortfall)
	require.Equal(t, 3.0, value(t, reg, "poolalloc_allocated_pods_total", byPool))
	require.Equal(t, 3.0, pods("held"))
	require.Equal(t, 0.0, pods("idle"))
	require.Equal(t, 1.0, value(t, reg, "poolalloc_shortfall", byPool))
	n, _ = histogram(t, reg, "poolalloc_time_to_serve_seconds", map[string]string{})
	require.Equal(t, uint64(1), n, "c does not hold all it wants yet")

	// A pod is created for it 7 s later.
	f.podNamed("p", "p-3")
	clk.Step(7 * time.Second)
	res = f.round(a, pool)
	require.Equal(t, 0, res.Shortfall)
	n, sum = histogram(t, reg, "poolalloc_time_to_serve_seconds", map[string]string{})
	require.Equal(t, uint64(2), n)
	require.InDelta(t, 10.0, sum, 1e-9, "the second wait was 7 s, from the round that saw the want rise")
	require.Equal(t, 4.0, pods("held"))

	// The owner gives one pod back.
	held := f.held("c")
	f.release("c", held[0])
	f.scale("c", 3)
	for i := 0; i < 5 && value(t, reg, "poolalloc_released_pods_total", byPool) == 0; i++ {
		f.round(a, pool)
	}
	require.Equal(t, 1.0, value(t, reg, "poolalloc_released_pods_total", byPool))
	require.Equal(t, 1.0, value(t, reg, "poolalloc_recycled_pods_total", byPool))
	require.Equal(t, 3.0, pods("held"))
	require.Equal(t, 1.0, pods("idle"))
	n, _ = histogram(t, reg, "poolalloc_time_to_serve_seconds", map[string]string{})
	require.Equal(t, uint64(2), n, "giving a pod back serves no one")

	// A forgotten pool's gauges go.
	require.NoError(t, a.ForgetPool(pool))
	require.Nil(t, metricOf(t, reg, "poolalloc_pods", withLabel(byPool, "state", "held")))
	require.Nil(t, metricOf(t, reg, "poolalloc_shortfall", byPool))
}

// A conflicting record write counts as a conflict, a refused one as
// other; a record that cannot be trusted blocks the pool; one listing a
// pod its claim does not hold is repaired.
func TestMetricsCountFailuresBlocksAndRepairs(t *testing.T) {
	ctx := context.Background()
	var fail error
	c := newFakeClient(t, &interceptor.Funcs{Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if _, ok := obj.(*testenv.Claim); ok && fail != nil {
			return fail
		}
		return cl.Patch(ctx, obj, patch, opts...)
	}})
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	_, err := testenv.CreatePods(ctx, c, "ns", "p", 3, true)
	require.NoError(t, err)
	cl := testenv.NewClaim("ns", "c", "p", 1)
	cl.UID = "uid-c"
	require.NoError(t, c.Create(ctx, cl))
	reg := prometheus.NewRegistry()
	a, err := allocator.New(c, allocator.WithMetrics(reg))
	require.NoError(t, err)
	byPool := map[string]string{"namespace": pool.Namespace, "name": pool.Name}
	failures := func(kind string) float64 {
		return value(t, reg, "poolalloc_write_failures_total", withLabel(byPool, "kind", kind))
	}

	fail = apierrors.NewConflict(schema.GroupResource{Resource: "claims"}, "c", errors.New("modified"))
	_, err = world.Round(ctx, a, c, pool)
	require.ErrorIs(t, err, allocator.ErrWrite)
	require.Equal(t, 1.0, failures("conflict"))
	fail = apierrors.NewForbidden(schema.GroupResource{Resource: "claims"}, "c", errors.New("no"))
	_, err = world.Round(ctx, a, c, pool)
	require.ErrorIs(t, err, allocator.ErrWrite)
	require.Equal(t, 1.0, failures("other"))
	require.Equal(t, 1.0, failures("conflict"))
	fail = nil
	res, err := world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.Len(t, res.Allocated, 1)
	require.Equal(t, 0.0, value(t, reg, "poolalloc_pool_blocked", byPool))

	// A record the allocator cannot read blocks the pool.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	good := cl.Annotations[syncer.DefaultKeys().Allocated]
	cl.Annotations[syncer.DefaultKeys().Allocated] = `{"pods":["p-0","p-0"]}`
	require.NoError(t, c.Update(ctx, cl))
	_, err = world.Round(ctx, a, c, pool)
	require.ErrorIs(t, err, allocator.ErrPoolBlocked)
	require.Equal(t, 1.0, value(t, reg, "poolalloc_pool_blocked", byPool))

	// Put right, it lists a pod more than the claim holds: repaired.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
	held, err := syncer.DecodePods(good)
	require.NoError(t, err)
	other := "p-0"
	if held[0] == other {
		other = "p-1"
	}
	v, err := syncer.EncodePods(append(held, other))
	require.NoError(t, err)
	cl.Annotations[syncer.DefaultKeys().Allocated] = v
	require.NoError(t, c.Update(ctx, cl))
	res, err = world.Round(ctx, a, c, pool)
	require.NoError(t, err)
	require.NotEmpty(t, res.Warnings)
	require.Equal(t, 0.0, value(t, reg, "poolalloc_pool_blocked", byPool))
	require.Equal(t, 1.0, value(t, reg, "poolalloc_records_repaired_total", byPool))
	require.NoError(t, allocator.CheckInvariants(a))
}

// Without the pool label the gauges sum over the pools, and a forgotten
// pool's part goes.
func TestMetricsWithoutPoolLabelSumOverPools(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	p1 := types.NamespacedName{Namespace: "ns", Name: "p1"}
	p2 := types.NamespacedName{Namespace: "ns", Name: "p2"}
	for i, p := range []types.NamespacedName{p1, p2} {
		_, err := testenv.CreatePods(ctx, c, "ns", p.Name, 2+i, true)
		require.NoError(t, err)
		cl := testenv.NewClaim("ns", "c-"+p.Name, p.Name, 1)
		cl.UID = types.UID("uid-" + p.Name)
		require.NoError(t, c.Create(ctx, cl))
	}
	reg := prometheus.NewRegistry()
	a, err := allocator.New(c, allocator.WithMetrics(reg, allocator.WithoutPoolLabel()))
	require.NoError(t, err)
	for _, p := range []types.NamespacedName{p1, p2} {
		_, err := world.Round(ctx, a, c, p)
		require.NoError(t, err)
	}
	state := func(s string) map[string]string { return map[string]string{"state": s} }
	require.Equal(t, 2.0, value(t, reg, "poolalloc_pods", state("held")))
	require.Equal(t, 3.0, value(t, reg, "poolalloc_pods", state("idle")), "1 in p1 and 2 in p2")
	require.Equal(t, 2.0, value(t, reg, "poolalloc_allocated_pods_total", map[string]string{}))
	_, err = world.Round(ctx, a, c, p2) // again: the sum does not count p2 twice
	require.NoError(t, err)
	require.Equal(t, 3.0, value(t, reg, "poolalloc_pods", state("idle")))

	require.NoError(t, a.ForgetPool(p2))
	require.Equal(t, 1.0, value(t, reg, "poolalloc_pods", state("held")))
	require.Equal(t, 1.0, value(t, reg, "poolalloc_pods", state("idle")))
}

// WithMetrics refuses a nil registerer, and a registry the metrics are in
// already.
func TestWithMetricsRefusesWhatItCannotUse(t *testing.T) {
	c := newFakeClient(t, nil)
	_, err := allocator.New(c, allocator.WithMetrics(nil))
	require.ErrorIs(t, err, allocator.ErrInvalidOption)
	reg := prometheus.NewRegistry()
	_, err = allocator.New(c, allocator.WithMetrics(reg))
	require.NoError(t, err)
	_, err = allocator.New(c, allocator.WithMetrics(reg))
	require.ErrorIs(t, err, allocator.ErrInvalidOption, "a second allocator on the same registry")
	_, err = allocator.New(c, allocator.WithMetrics(prometheus.NewRegistry(), nil))
	require.ErrorIs(t, err, allocator.ErrInvalidOption)
}
