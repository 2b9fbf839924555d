package allocator

import (
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolalloc/poolalloc/syncer"
)

// MetricsOption configures WithMetrics.
type MetricsOption interface{ applyMetrics(*metricsConfig) }

type metricsOptionFunc func(*metricsConfig)

func (f metricsOptionFunc) applyMetrics(c *metricsConfig) { f(c) }

type metricsConfig struct{ noPoolLabel bool }

// WithoutPoolLabel leaves the pool's namespace and name labels off the
// gauges and counters, for operators with so many pools that a series per
// pool costs too much: the gauges then sum over the pools, the counters
// count them all. The histograms never carry them.
func WithoutPoolLabel() MetricsOption {
	return metricsOptionFunc(func(c *metricsConfig) { c.noPoolLabel = true })
}

// WithMetrics registers the allocator's metrics with reg (controller-
// runtime's metrics.Registry, say); nothing is registered without it. It
// fails New (ErrInvalidOption) if reg is nil or refuses a metric, as it
// does when another allocator registered them there already. The gauges
// and counters are labelled by the pool's namespace and name (labels
// namespace and name) unless WithoutPoolLabel; the histograms, as
// controller-runtime's, only by what has few values:
//
//   - poolalloc_round_duration_seconds, a histogram by call (Round or
//     Update), over all pools: how long a call took, writes included.
//   - poolalloc_pods, a gauge by state: the pool's pods after the latest
//     call, idle (ready and free), held (by claims, recycling and lost
//     ones included), recycling, lost (held and missing or unready), and
//     starting (Result.Starting).
//   - poolalloc_shortfall, a gauge: Result.Shortfall.
//   - poolalloc_allocated_pods_total, poolalloc_released_pods_total and
//     poolalloc_recycled_pods_total, counters: pods handed out, released
//     (free again), and given back to be recycled (each pod once per
//     time it is given back).
//   - poolalloc_write_failures_total, a counter by kind: record and pod
//     mark writes that failed, as conflict (another writer was first),
//     unknown (the outcome is not known: a timeout, say), too_large (the
//     record would not fit the annotations' limit) or other.
//   - poolalloc_pool_blocked, a gauge: 1 while the latest call found the
//     pool blocked (ErrPoolBlocked), else 0.
//   - poolalloc_records_repaired_total, a counter: records found to
//     differ from what their claim holds (ErrUntrustedRecord), each
//     rewritten.
//   - poolalloc_time_to_serve_seconds, a histogram over all pools: from a
//     claim's creation, or the round that saw its want rise, to the
//     hand-out after which it holds all it wants (pods being recycled not
//     counted). The number users of a warm pool care about.
//
// The gauges follow the latest call on the pool to finish among those
// that looked at it: a call refused before it did (invalid input, an
// ended context) leaves them as they were. ForgetPool deletes them, and
// no call that raced it sets them again. The counters and histograms are
// this process's: after a restart, or a pool's move to another replica,
// they start again.
//
// What to alert on: poolalloc_pool_blocked above 0; a shortfall that stays
// above 0 (the pool is not growing); time to serve rising; write failures
// of kind unknown or other.
func WithMetrics(reg prometheus.Registerer, opts ...MetricsOption) Option {
	return optionFunc(func(c *config) {
		c.checkNil("WithMetrics", reg)
		mc := metricsConfig{}
		for _, o := range opts {
			if o == nil {
				c.nilSet = append(c.nilSet, "WithMetrics option")
				continue
			}
			o.applyMetrics(&mc)
		}
		c.metricsReg, c.metricsCfg = reg, mc
	})
}

// metrics are the allocator's collectors (WithMetrics).
type metrics struct {
	poolLabel bool

	duration    *prometheus.HistogramVec
	pods        *prometheus.GaugeVec
	shortfall   *prometheus.GaugeVec
	allocated   *prometheus.CounterVec
	released    *prometheus.CounterVec
	recycled    *prometheus.CounterVec
	writeFailed *prometheus.CounterVec
	blocked     *prometheus.GaugeVec
	repaired    *prometheus.CounterVec
	timeToServe prometheus.Histogram

	// last holds each pool's gauges as last set, for the sums kept
	// without the pool label; mu guards it.
	mu   sync.Mutex
	last map[types.NamespacedName]poolGauges
}

// poolGauges are a pool's gauges as last set, for the sums kept without
// the pool label.
type poolGauges struct {
	idle, held, recycling, lost, starting, shortfall, blocked float64
}

// podStates are the values of poolalloc_pods's state label.
var podStates = [...]string{"idle", "held", "recycling", "lost", "starting"}

// The labels naming a pool on the gauges and counters.
const (
	labelNamespace = "namespace"
	labelName      = "name"
)

func newMetrics(reg prometheus.Registerer, cfg metricsConfig) (*metrics, error) {
	var pool []string
	if !cfg.noPoolLabel {
		pool = []string{labelNamespace, labelName}
	}
	with := func(labels ...string) []string { return append(append([]string{}, pool...), labels...) }
	m := &metrics{
		poolLabel: !cfg.noPoolLabel,
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "poolalloc_round_duration_seconds", Help: "How long a Round or Update call took, writes included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"call"}),
		pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "poolalloc_pods", Help: "The pool's pods by state after the latest call: idle, held, recycling, lost, starting.",
		}, with("state")),
		shortfall: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "poolalloc_shortfall", Help: "How many more pods the pool must create to meet its claims' demand.",
		}, with()),
		allocated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolalloc_allocated_pods_total", Help: "Pods handed out to claims.",
		}, with()),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolalloc_released_pods_total", Help: "Pods released by claims and free again after recycling.",
		}, with()),
		recycled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolalloc_recycled_pods_total", Help: "Pods given back to be recycled.",
		}, with()),
		writeFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolalloc_write_failures_total", Help: "Record and pod mark writes that failed, by kind: conflict, unknown, too_large, other.",
		}, with("kind")),
		blocked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "poolalloc_pool_blocked", Help: "1 while the latest call found the pool blocked by a record it cannot trust.",
		}, with()),
		repaired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolalloc_records_repaired_total", Help: "Records found to differ from what their claim holds, rewritten.",
		}, with()),
		timeToServe: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "poolalloc_time_to_serve_seconds", Help: "From a claim's creation or want rising to holding all it wants.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
		}),
		last: make(map[types.NamespacedName]poolGauges),
	}
	for _, c := range []prometheus.Collector{m.duration, m.pods, m.shortfall, m.allocated, m.released,
		m.recycled, m.writeFailed, m.blocked, m.repaired, m.timeToServe} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("%w: WithMetrics: %w", ErrInvalidOption, err)
		}
	}
	return m, nil
}

// labels returns the label values for pool followed by more.
func (m *metrics) labels(pool types.NamespacedName, more ...string) []string {
	if !m.poolLabel {
		return more
	}
	return append([]string{pool.Namespace, pool.Name}, more...)
}

// observe counts what a Round or Update call on pool did; publish sets
// the pool's gauges.
func (m *metrics) observe(call string, pool types.NamespacedName, res Result, err error, took time.Duration) {
	m.duration.WithLabelValues(call).Observe(took.Seconds())
	m.allocated.WithLabelValues(m.labels(pool)...).Add(float64(grantPods(res.Allocated)))
	m.released.WithLabelValues(m.labels(pool)...).Add(float64(grantPods(res.Released)))
	repaired := 0
	for _, w := range res.Warnings {
		if errors.Is(w, ErrUntrustedRecord) {
			repaired++
		}
	}
	m.repaired.WithLabelValues(m.labels(pool)...).Add(float64(repaired))
	for _, e := range leaves(err) {
		if errors.Is(e, ErrWrite) {
			m.writeFailed.WithLabelValues(m.labels(pool, writeFailureKind(e))...).Inc()
		}
	}
}

// publish sets p's gauges from what a call on it returned; m may be nil
// (no WithMetrics). The call runs it with p.mu held, so that the gauges
// follow the latest call to finish, and a pool that ForgetPool dropped
// (p.dead) gets no series again from a call that waited for p.mu.
func (m *metrics) publish(p *pool, res Result, err error) {
	if m == nil || p.dead || !res.reported {
		return // no metrics, a forgotten pool, or a call that stopped before it looked at the pool
	}
	g := poolGauges{
		idle: float64(res.IdleCount), held: float64(res.Held), recycling: float64(len(res.Recycling)),
		lost: float64(len(res.Lost)), starting: float64(res.Starting), shortfall: float64(res.Shortfall),
	}
	if errors.Is(err, ErrPoolBlocked) {
		g.blocked = 1
	}
	if !m.poolLabel {
		// The gauges sum over the pools: move them by what changed.
		m.mu.Lock()
		old := m.last[p.name]
		m.last[p.name] = g
		m.mu.Unlock()
		m.setPool(p.name, g.minus(old), prometheus.Gauge.Add)
		return
	}
	m.setPool(p.name, g, prometheus.Gauge.Set)
}

func (g poolGauges) minus(o poolGauges) poolGauges {
	return poolGauges{g.idle - o.idle, g.held - o.held, g.recycling - o.recycling, g.lost - o.lost,
		g.starting - o.starting, g.shortfall - o.shortfall, g.blocked - o.blocked}
}

// setPool applies set (Set, or Add for the sums) to the pool's gauges.
func (m *metrics) setPool(pool types.NamespacedName, g poolGauges, set func(prometheus.Gauge, float64)) {
	for i, v := range [...]float64{g.idle, g.held, g.recycling, g.lost, g.starting} {
		set(m.pods.WithLabelValues(m.labels(pool, podStates[i])...), v)
	}
	set(m.shortfall.WithLabelValues(m.labels(pool)...), g.shortfall)
	set(m.blocked.WithLabelValues(m.labels(pool)...), g.blocked)
}

// recycledPods counts n pods of pool given back to be recycled.
func (m *metrics) recycledPods(pool types.NamespacedName, n int) {
	m.recycled.WithLabelValues(m.labels(pool)...).Add(float64(n))
}

// served records that a claim waited d to hold all it wants. The
// histogram has no pool label (cardinality): the pool is not used.
func (m *metrics) served(_ types.NamespacedName, d time.Duration) {
	m.timeToServe.Observe(max(0, d.Seconds()))
}

// forget drops a forgotten pool's gauges (or its part of the sums). It
// runs with the pool's mu held, if the allocator has the pool.
func (m *metrics) forget(pool types.NamespacedName) {
	if !m.poolLabel {
		m.mu.Lock()
		old, ok := m.last[pool]
		delete(m.last, pool)
		m.mu.Unlock()
		if ok {
			m.setPool(pool, poolGauges{}.minus(old), prometheus.Gauge.Add)
		}
		return
	}
	l := prometheus.Labels{labelNamespace: pool.Namespace, labelName: pool.Name}
	m.pods.DeletePartialMatch(l)
	m.shortfall.DeletePartialMatch(l)
	m.blocked.DeletePartialMatch(l)
}

// writeFailureKind classifies a failed write for poolalloc_write_failures_total.
func writeFailureKind(err error) string {
	switch {
	case apierrors.IsConflict(err):
		return "conflict"
	case errors.Is(err, syncer.ErrRecordTooLarge):
		return "too_large"
	case !definite(err):
		return "unknown"
	}
	return "other"
}

// leaves returns the errors err joins (errors.Join, recursively), or err.
func leaves(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leaves(e)...)
		}
		return out
	}
	return []error{err}
}
