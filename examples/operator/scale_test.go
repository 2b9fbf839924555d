package main

import (
	"context"
	"errors"
	"math"
	"net/http"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"k8s.io/utils/ptr"

	poolv1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
	"github.com/poolalloc/poolalloc/examples/operator/fakekubelet"
)

// burstClaims is the size of BenchmarkOperatorBurst's burst.
const burstClaims = 1000

// BenchmarkOperatorBurst runs the operator end to end on the real API
// server: a pool of Ready pods (1,000 or 10,000, made before the operator
// starts, as an operator meets a pool after a restart), the operator's
// first reconcile, then, measured, a burst of 1,000 single-pod claims
// created at once, until every claim is served. It reports the time to
// serve a claim (p50 and p99, from poolalloc_time_to_serve_seconds), the
// operator process's CPU time per hand-out (the test process: the
// operator, and the client that creates the claims, the same at every
// size), its API writes per hand-out by kind, and the peak heap of the
// process over the run (the informer caches included). Run it with
//
//	go test ./examples/operator -run '^$' -bench BenchmarkOperatorBurst -benchtime 1x -count 3
//
// POOLALLOC_BURST_PODS replaces the pool sizes, comma-separated (say
// "50000": the API server then holds 50,000 pods, about 1.5 GiB more).
func BenchmarkOperatorBurst(b *testing.B) {
	sizes := []int{1000, 10000}
	if v := os.Getenv("POOLALLOC_BURST_PODS"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < burstClaims {
				b.Fatalf("POOLALLOC_BURST_PODS=%q: %q is not a pool size of at least %d", v, f, burstClaims)
			}
			sizes = append(sizes, n)
		}
	}
	for _, pods := range sizes {
		b.Run("pods="+strconv.Itoa(pods), func(b *testing.B) {
			for range b.N {
				burst(b, pods)
			}
		})
	}
}

// writeCounter counts the API requests that write, by verb and resource.
type writeCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (w *writeCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.Method != http.MethodGet {
			parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
			kind := ""
			// .../namespaces/<ns>/<resource>[/<name>[/<sub>]]
			for i := 0; i+2 < len(parts); i++ {
				if parts[i] == "namespaces" {
					kind = strings.Join(parts[i+2:min(len(parts), i+3)], "/")
					if len(parts) > i+4 {
						kind += "/" + parts[i+4]
					}
					break
				}
			}
			w.mu.Lock()
			w.counts[req.Method+" "+kind]++
			w.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

func (w *writeCounter) take() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.counts
	w.counts = map[string]int{}
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// heapPeak samples the heap's live objects every 20 ms until stopped.
type heapPeak struct {
	peak atomic.Uint64
	stop chan struct{}
	done chan struct{}
}

func startHeapPeak() *heapPeak {
	h := &heapPeak{stop: make(chan struct{}), done: make(chan struct{})}
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	go func() {
		defer close(h.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(sample)
			if v := sample[0].Value.Uint64(); v > h.peak.Load() {
				h.peak.Store(v)
			}
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heapPeak) end() uint64 {
	close(h.stop)
	<-h.done
	return h.peak.Load()
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func burst(b *testing.B, pods int) {
	b.StopTimer()
	ctx := b.Context()
	ns := env.namespace(ctx, b)
	const pool = "p"
	runtime.GC()
	heap := startHeapPeak()
	// The pool's pods, Ready, made with the admin client.
	require := func(err error, what string) {
		if err != nil {
			b.Fatalf("%s: %v", what, err)
		}
	}
	err := inParallel(ctx, pods, 32, func(ctx context.Context, i int) error {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pool + "-" + strconv.Itoa(i),
				Labels: map[string]string{PoolLabel: pool, ManagedByLabel: ManagedBy}},
			Spec: corev1.PodSpec{NodeName: "node-" + strconv.Itoa(i%50), Containers: []corev1.Container{{Name: "sandbox", Image: DefaultPodImage}}},
		}
		if err := env.Client.Create(ctx, pod); err != nil {
			return err
		}
		return fakekubelet.SetPodReady(ctx, env.Client, pod, true)
	})
	require(err, "create pods")
	require(env.Client.Create(ctx, poolv1.NewPool(ns, pool, int64(pods))), "create pool")

	// The operator, its writes counted.
	writes := &writeCounter{counts: map[string]int{}}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(writes.wrap)
	scheme, err := NewScheme()
	require(err, "scheme")
	cacheOpts, err := CacheOptions(ns)
	require(err, "cache options")
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme, Cache: cacheOpts,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require(err, "manager")
	reg := prometheus.NewRegistry()
	require(Setup(mgr, Options{Metrics: reg}), "setup")
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() {
		cancel()
		<-done
	}()
	// The first reconcile lists the pool: wait for its status.
	waitUntil(b, 5*time.Minute, "pool status shows every pod ready", func() bool {
		u := newPoolObject()
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pool}, u); err != nil {
			return false
		}
		st, _ := u.Object["status"].(map[string]any)
		ready, _ := st["ready"].(int64)
		return ready == int64(pods)
	})
	writes.take()

	// The burst.
	cpu0 := cpuTime()
	start := time.Now()
	b.StartTimer()
	err = inParallel(ctx, burstClaims, 16, func(ctx context.Context, i int) error {
		return env.Client.Create(ctx, poolv1.NewClaim(ns, "c-"+strconv.Itoa(i), pool, 1))
	})
	require(err, "create claims")
	waitUntil(b, 5*time.Minute, "every claim served", func() bool {
		n, _, _ := serveTimes(reg)
		return n >= burstClaims
	})
	b.StopTimer()
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	peak := heap.end()
	n, p50, p99 := serveTimes(reg)
	w := writes.take()
	total := 0
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range w {
			if !yield(k) {
				return
			}
		}
	}) {
		total += w[k]
		b.ReportMetric(float64(w[k])/burstClaims, "writes("+strings.ReplaceAll(k, " ", ":")+")/handout")
	}
	b.ReportMetric(float64(total)/burstClaims, "writes/handout")
	b.ReportMetric(elapsed.Seconds(), "s/burst")
	b.ReportMetric(p50, "p50-serve-s")
	b.ReportMetric(p99, "p99-serve-s")
	b.ReportMetric(float64(cpu.Microseconds())/1000/burstClaims, "cpu-ms/handout")
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
	if n < burstClaims {
		b.Fatalf("served %d of %d claims", n, burstClaims)
	}
}

// serveTimes returns how many claims poolalloc_time_to_serve_seconds
// counted, and its p50 and p99 (linear within a bucket, as PromQL's
// histogram_quantile).
func serveTimes(reg *prometheus.Registry) (n uint64, p50, p99 float64) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "poolalloc_time_to_serve_seconds" {
			continue
		}
		var buckets []*dto.Bucket
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			n += h.GetSampleCount()
			if buckets == nil {
				buckets = h.GetBucket()
			} // one series: the histogram is over all pools
		}
		return n, quantile(0.5, n, buckets), quantile(0.99, n, buckets)
	}
	return 0, 0, 0
}

func quantile(q float64, n uint64, buckets []*dto.Bucket) float64 {
	if n == 0 {
		return math.NaN()
	}
	rank := q * float64(n)
	lower, below := 0.0, uint64(0)
	for _, bk := range buckets {
		if float64(bk.GetCumulativeCount()) >= rank {
			in := bk.GetCumulativeCount() - below
			if in == 0 {
				return bk.GetUpperBound()
			}
			return lower + (bk.GetUpperBound()-lower)*(rank-float64(below))/float64(in)
		}
		lower, below = bk.GetUpperBound(), bk.GetCumulativeCount()
	}
	return lower
}

func waitUntil(b *testing.B, limit time.Duration, what string, cond func() bool) {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// inParallel calls f for 0..n-1 on width goroutines and returns the
// errors joined.
func inParallel(ctx context.Context, n, width int, f func(context.Context, int) error) error {
	next := make(chan int)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for range width {
		wg.Go(func() {
			for i := range next {
				errs[i] = f(ctx, i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}
