// Command loadtest measures how fast the allocator serves a burst of claims
// on a real API server, run the way an operator runs it: pods and claims
// listed from an informer cache, one Round after another, woken by the
// cache's events.
//
//	go run ./examples/loadtest -claims 1000 -pods 1200
//
// Setup is not timed: it starts an embedded kube-apiserver and etcd (or uses
// the cluster of KUBECONFIG, installing the test CRDs if missing), creates a
// namespace and a pool of ready pods, starts the cache and runs one round on
// the empty pool. Then, timed, it creates the claims concurrently, each
// wanting one pod, while the round loop hands out pods, until every claim
// holds its pod or -timeout passes. It reports the time from the first
// create to the last allocation, claims/s, per-claim latency (and where it
// was spent), rounds, writes to claims per allocated claim, CPU time and
// peak memory, checks the records on the API server (each claim one pod, no
// pod twice), then removes the namespace (also on Ctrl-C). It fails when a
// claim is not served within -timeout or a record check fails.
//
// Flags: -claims, -pods, -concurrency (claims created at once), -timeout,
// -write-concurrency (allocator.WithWriteConcurrency) and -cpuprofile. A
// progress bar is drawn on stderr when it is a terminal.
//
// With -write-cost N it runs no burst: it makes N writes of each kind the
// allocator and an operator make per hand-out and release (claim create,
// record write, event, pod mark, fence, unmark, with and without labels
// and owner references), -write-concurrency at once, and reports the
// embedded control plane's CPU per write, the median of -write-cost-reps
// repetitions (writecost.go):
//
//	go run ./examples/loadtest -write-cost 1000 -pods 1000 -claims 1
//
// Wall-clock figures depend on what else the machine runs: the report
// gives the load average, the CPU time of this process and of the embedded
// control plane, and where each claim's latency went, so that a slow run
// can be told apart from a slow allocator.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/cluster"
	"github.com/poolalloc/poolalloc/internal/parallel"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

// target is the goal of the issue: 1,000 single-pod claims on a 1,200-pod
// pool fully allocated within it.
const target = 5 * time.Second

type flags struct {
	claims, pods, concurrency, writers int
	timeout                            time.Duration
	cpuProfile                         string
	marks                              bool
	// writeCost and costReps are the write-cost mode's (writecost.go);
	// 0 runs the burst.
	writeCost, costReps int
	// qps and burst are the client-side rate limits of the allocator's
	// client (rest.Config.QPS and Burst); qps 0 keeps the connection's.
	qps   float64
	burst int
}

func main() {
	var f flags
	flag.IntVar(&f.claims, "claims", 1000, "claims to create, each wanting one pod")
	flag.IntVar(&f.pods, "pods", 1200, "ready pods in the pool")
	flag.IntVar(&f.concurrency, "concurrency", 32, "claims created at once")
	flag.IntVar(&f.writers, "write-concurrency", 16, "claims the allocator writes at once (allocator.WithWriteConcurrency)")
	flag.DurationVar(&f.timeout, "timeout", time.Minute, "give up when not all claims are allocated after this long")
	flag.BoolVar(&f.marks, "marks", true, "mark pods with their claim (the default; -marks=false is allocator.WithPodMarks(false)): one more write per pod")
	flag.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the timed phase to this file (go tool pprof)")
	flag.Float64Var(&f.qps, "qps", 0, "client-side rate limit of the allocator's client in requests per second, per resource type as controller-runtime's client applies it (rest.Config.QPS; -1: none; 0: the connection's, 1000 for the embedded API server)")
	flag.IntVar(&f.burst, "burst", 0, "burst of the allocator's client (rest.Config.Burst; 0: the connection's, with -qps set: client-go's default, 10)")
	flag.IntVar(&f.writeCost, "write-cost", 0, "instead of the burst, make this many writes of each kind the allocator and its caller make per hand-out and report the control plane's CPU per write (needs -pods at least as many)")
	flag.IntVar(&f.costReps, "write-cost-reps", 3, "-write-cost: repetitions of each kind (the median is reported)")
	flag.Parse()
	if f.claims < 1 || f.pods < f.claims || f.concurrency < 1 || f.writers < 1 || f.timeout <= 0 || f.burst < 0 ||
		f.writeCost < 0 || f.writeCost > f.pods || f.costReps < 1 {
		fmt.Fprintln(os.Stderr, "loadtest: want -claims ≥ 1, -pods ≥ -claims, -concurrency ≥ 1, -write-concurrency ≥ 1, -timeout > 0, -burst ≥ 0, 0 ≤ -write-cost ≤ -pods and -write-cost-reps ≥ 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, f)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, f flags) (err error) {
	ctrllog.SetLogger(logr.Discard()) // envtest and the cache log through it
	conn, err := cluster.Connect(ctx)
	if err != nil {
		return err
	}
	// Cleanup runs after an error or Ctrl-C too, on a context of its own.
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	defer func() { err = errors.Join(err, conn.Close(cleanupCtx)) }()
	c := conn.Client

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "poolalloc-loadtest-"}}
	if err := c.Create(ctx, ns); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	defer func() { err = errors.Join(err, cluster.RemoveNamespace(cleanupCtx, c, ns.Name, f.concurrency)) }()
	pool := types.NamespacedName{Namespace: ns.Name, Name: "warm"}

	start := time.Now()
	if _, err := testenv.CreatePods(ctx, c, ns.Name, pool.Name, f.pods, true); err != nil {
		return err
	}
	fmt.Printf("setup: namespace %s, %d ready pods created in %s\n", ns.Name, f.pods, since(start))

	t, err := newTest(ctx, conn, pool, f)
	if err != nil {
		return err
	}
	defer t.stopCache()
	if f.writeCost > 0 {
		return t.writeCost(ctx, f.writeCost, f.costReps)
	}
	if err := t.run(ctx); err != nil {
		return err
	}
	t.report()
	if n := int(t.nAllocated.Load()); n < f.claims {
		return fmt.Errorf("%d of %d claims allocated within -timeout %s", n, f.claims, f.timeout)
	}
	return verify(ctx, c, pool, f.claims)
}

// verify checks the records on the API server: every claim holds exactly
// one pod, and no pod is in two claims' records.
func verify(ctx context.Context, c client.Client, pool types.NamespacedName, claims int) error {
	s, err := syncer.NewAnnotationSyncer(c, syncer.DefaultKeys())
	if err != nil {
		return err
	}
	holdings, err := world.Holdings(ctx, c, pool, func(o client.Object) ([]string, error) {
		rec, err := s.Read(o)
		return rec.Held(), err
	})
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if len(holdings) != claims {
		return fmt.Errorf("verify: %d claims on the server, want %d", len(holdings), claims)
	}
	holder := make(map[string]string, claims)
	for claim, pods := range holdings {
		if len(pods) != 1 {
			return fmt.Errorf("verify: claim %s's record holds %v, want one pod", claim, pods)
		}
		if other, ok := holder[pods[0]]; ok {
			return fmt.Errorf("verify: pod %s is in the records of claims %s and %s", pods[0], other, claim)
		}
		holder[pods[0]] = claim
	}
	fmt.Printf("verified: %d claims hold one pod each, no pod twice\n", claims)
	return nil
}

// since is the time since start, rounded for printing.
func since(start time.Time) time.Duration { return time.Since(start).Round(time.Millisecond) }

// test is one load test. The round loop runs on the goroutine that calls
// run; fields are owned by it unless their comment says otherwise.
type test struct {
	f     flags
	c     client.Client // creates the claims; not counted
	pool  types.NamespacedName
	alloc allocator.Allocator
	cache cache.Cache
	// stopCache stops the cache's informers.
	stopCache func()
	// kick is signalled, without blocking, on every claim event of the
	// cache: the loop runs a round when it fires.
	kick     chan struct{}
	index    map[string]int // claim name → index; read-only once built
	embedded bool

	// Written by the interceptor, from the allocator's write goroutines.
	patches, conflicts, liveReads, podPatches atomic.Int64
	patchMu                                   sync.Mutex
	patchLat                                  []time.Duration // guarded by patchMu

	// Per claim, in Unix nanoseconds, 0 until it happened. created and
	// createDone are written by the creators, cached by the cache's event
	// handler; the rest by the loop.
	created, createDone, cached []atomic.Int64
	listed, allocated           []time.Time
	nAllocated                  atomic.Int64 // read by the progress bar
	nCreated                    atomic.Int64 // read by the progress bar

	start, end       time.Time // first create issued; last allocation
	createsEnd       time.Time // all creates returned
	rounds, roundErr int
	perRound         []int // claims allocated by each round that allocated any
	lastErr          error
	inRound          time.Duration // wall time inside Round
	slowest          time.Duration // the longest Round
	cpu              time.Duration // user+sys of the process over the timed phase
	heapPeak         uint64        // sampled HeapInuse, bytes; written by the sampler
	maxRSS           int64         // bytes
	plane            []procCPU     // control plane CPU over the timed phase
	load             [2]string     // load average at the start and the end
}

func newTest(ctx context.Context, conn cluster.Conn, pool types.NamespacedName, f flags) (*test, error) {
	t := &test{
		f:          f,
		c:          conn.Client,
		pool:       pool,
		kick:       make(chan struct{}, 1),
		index:      make(map[string]int, f.claims),
		embedded:   conn.Embedded,
		created:    make([]atomic.Int64, f.claims),
		createDone: make([]atomic.Int64, f.claims),
		cached:     make([]atomic.Int64, f.claims),
		listed:     make([]time.Time, f.claims),
		allocated:  make([]time.Time, f.claims),
	}
	for i := range f.claims {
		t.index[claimName(i)] = i
	}

	// The allocator's client counts its writes to claims and its live
	// reads of claims: it reads and writes the API server directly, rate
	// limited as -qps and -burst say.
	base := conn.Client
	if f.qps != 0 {
		cfg := rest.CopyConfig(conn.Config)
		cfg.QPS, cfg.Burst = float32(f.qps), f.burst
		c, err := client.NewWithWatch(cfg, client.Options{Scheme: conn.Scheme})
		if err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
		base = c
	}
	counted := interceptor.NewClient(base, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if !isClaim(c, obj) {
				if _, isPod := obj.(*corev1.Pod); isPod {
					t.podPatches.Add(1)
				}
				return c.Patch(ctx, obj, patch, opts...)
			}
			t.patches.Add(1)
			start := time.Now()
			err := c.Patch(ctx, obj, patch, opts...)
			t.recordPatch(time.Since(start))
			if apierrors.IsConflict(err) {
				t.conflicts.Add(1)
			}
			return err
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if isClaim(c, obj) {
				t.patches.Add(1)
			}
			return c.Update(ctx, obj, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if isClaim(c, obj) {
				t.liveReads.Add(1)
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	opts := []allocator.Option{allocator.WithAPIReader(counted), allocator.WithWriteConcurrency(f.writers)}
	if !f.marks {
		opts = append(opts, allocator.WithPodMarks(false))
	}
	a, err := allocator.New(counted, opts...)
	if err != nil {
		return nil, err
	}
	t.alloc = a

	start := time.Now()
	if err := t.startCache(ctx, conn); err != nil {
		return nil, err
	}
	// The operator has been running before the burst: the pool is known.
	in, err := t.input(ctx)
	if err != nil {
		t.stopCache()
		return nil, err
	}
	if len(in.Pods) != f.pods || len(in.Claims) != 0 {
		t.stopCache()
		return nil, fmt.Errorf("cache lists %d pods and %d claims, want %d and 0", len(in.Pods), len(in.Claims), f.pods)
	}
	res, err := a.Round(ctx, in)
	if err != nil {
		t.stopCache()
		return nil, fmt.Errorf("first round: %w", err)
	}
	fmt.Printf("setup: cache synced and first round run (%d idle pods) in %s\n", len(res.Idle), since(start))
	return t, nil
}

func claimName(i int) string { return fmt.Sprintf("load-%05d", i) }

// isClaim reports whether obj is a test claim, typed or unstructured.
func isClaim(c client.Client, obj client.Object) bool {
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	return err == nil && gvk == testenv.ClaimGVK
}

// startCache starts an informer cache of the namespace with informers for
// pods and claims, and waits until both have synced.
func (t *test) startCache(ctx context.Context, conn cluster.Conn) error {
	ca, err := cache.New(conn.Config, cache.Options{
		Scheme:            conn.Scheme,
		DefaultNamespaces: map[string]cache.Config{t.pool.Namespace: {}},
	})
	if err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	cacheCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- ca.Start(cacheCtx) }()
	t.cache = ca
	t.stopCache = func() {
		cancel()
		<-done
	}
	if _, err := ca.GetInformer(ctx, &corev1.Pod{}); err != nil {
		t.stopCache()
		return fmt.Errorf("cache: pod informer: %w", err)
	}
	claims, err := ca.GetInformer(ctx, &testenv.Claim{})
	if err != nil {
		t.stopCache()
		return fmt.Errorf("cache: claim informer: %w", err)
	}
	_, err = claims.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if cl, ok := obj.(*testenv.Claim); ok {
				if i, ok := t.index[cl.Name]; ok {
					t.cached[i].CompareAndSwap(0, time.Now().UnixNano())
				}
			}
			t.wake()
		},
		UpdateFunc: func(any, any) { t.wake() },
		DeleteFunc: func(any) { t.wake() },
	})
	if err != nil {
		t.stopCache()
		return fmt.Errorf("cache: claim event handler: %w", err)
	}
	if !ca.WaitForCacheSync(ctx) {
		t.stopCache()
		return errors.New("cache: not synced")
	}
	return nil
}

func (t *test) wake() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// input lists the pool's pods and claims from the cache.
func (t *test) input(ctx context.Context) (allocator.Input, error) {
	in := allocator.Input{Pool: t.pool}
	var pods corev1.PodList
	if err := t.cache.List(ctx, &pods, client.InNamespace(t.pool.Namespace), client.MatchingLabels{testenv.PoolLabel: t.pool.Name}); err != nil {
		return in, fmt.Errorf("list pods of pool %s: %w", t.pool, err)
	}
	in.Pods = pods.Items
	var claims testenv.ClaimList
	if err := t.cache.List(ctx, &claims, client.InNamespace(t.pool.Namespace)); err != nil {
		return in, fmt.Errorf("list claims of pool %s: %w", t.pool, err)
	}
	in.Claims = make([]allocator.Claim, 0, len(claims.Items))
	for i := range claims.Items {
		cl := &claims.Items[i]
		if cl.Spec.PoolRef == t.pool.Name {
			in.Claims = append(in.Claims, allocator.Claim{Object: cl, Want: int(cl.Spec.Replicas), Priority: cl.Spec.Priority})
		}
	}
	return in, nil
}

// run is the timed phase: it creates the claims and runs rounds until all
// are allocated or the timeout passes.
func (t *test) run(parent context.Context) (err error) {
	ctx, cancel := context.WithTimeout(parent, t.f.timeout)
	defer cancel()
	t.load[0] = loadAverage()
	planeBefore := t.controlPlaneCPU()
	cpuBefore, err := cpuTime()
	if err != nil {
		return err
	}
	if t.f.cpuProfile != "" {
		stop, perr := startProfile(t.f.cpuProfile)
		if perr != nil {
			return perr
		}
		defer func() { err = errors.Join(err, stop()) }()
	}
	// Once every claim is allocated every create has returned, so the
	// two end with the loop; an error of either stops the other.
	t.start = time.Now()
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Go(func() { t.sample(sampleCtx) })
	defer func() {
		stopSampling()
		sampling.Wait()
	}()
	both := []func(context.Context) error{t.createClaims, t.loop}
	runErr := parallel.Do(ctx, len(both), len(both), func(ctx context.Context, i int) error { return both[i](ctx) })
	cpuAfter, err := cpuTime()
	if err != nil {
		return err
	}
	t.cpu = cpuAfter - cpuBefore
	t.plane = diffCPU(planeBefore, t.controlPlaneCPU())
	t.load[1] = loadAverage()
	stopSampling()
	sampling.Wait()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		t.maxRSS = ru.Maxrss * 1024 // KiB on Linux
	}
	switch {
	case parent.Err() != nil: // Ctrl-C
		return parent.Err()
	case ctx.Err() != nil: // -timeout: report what was allocated
		return nil
	}
	return runErr
}

// createClaims creates the claims, concurrency at once, each wanting one
// pod, and records when each create was issued and when it returned.
func (t *test) createClaims(ctx context.Context) error {
	err := parallel.Do(ctx, t.f.claims, t.f.concurrency, func(ctx context.Context, i int) error {
		cl := testenv.NewClaim(t.pool.Namespace, claimName(i), t.pool.Name, 1)
		t.created[i].Store(time.Now().UnixNano())
		if err := t.c.Create(ctx, cl); err != nil {
			return fmt.Errorf("create claim %s: %w", cl.Name, err)
		}
		t.createDone[i].Store(time.Now().UnixNano())
		t.nCreated.Add(1)
		return nil
	})
	t.createsEnd = time.Now()
	return err
}

// loop runs a round whenever the cache reports a claim event (at least
// every 100 ms while claims wait), until every claim holds its pod.
func (t *test) loop(ctx context.Context) error {
	retry := time.NewTicker(100 * time.Millisecond)
	defer retry.Stop()
	for int(t.nAllocated.Load()) < t.f.claims {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.kick:
		case <-retry.C:
		}
		in, err := t.input(ctx)
		if err != nil {
			return err
		}
		listedAt := time.Now()
		for _, cl := range in.Claims {
			if i, ok := t.index[cl.Object.GetName()]; ok && t.listed[i].IsZero() {
				t.listed[i] = listedAt
			}
		}
		res, err := t.alloc.Round(ctx, in)
		now := time.Now()
		d := now.Sub(listedAt)
		t.inRound += d
		t.slowest = max(t.slowest, d)
		t.rounds++
		if err != nil {
			// Partial failures (a write conflict on a stale listing) are
			// retried by the next round.
			t.roundErr++
			t.lastErr = err
		}
		if len(res.Allocated) > 0 {
			t.perRound = append(t.perRound, len(res.Allocated))
		}
		for _, g := range res.Allocated {
			if i, ok := t.index[g.Claim.Name]; ok && t.allocated[i].IsZero() {
				t.allocated[i] = now
				t.end = now
				t.nAllocated.Add(1)
			}
		}
	}
	return nil
}

// sample records the peak of HeapInuse and draws the progress bar, ten
// times a second, until ctx ends.
func (t *test) sample(ctx context.Context) {
	bar := isTerminal(os.Stderr)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		t.heapPeak = max(t.heapPeak, heapInuse())
		if bar {
			t.drawBar()
		}
		select {
		case <-ctx.Done():
			if bar {
				t.drawBar()
				fmt.Fprintln(os.Stderr)
			}
			return
		case <-tick.C:
		}
	}
}

func (t *test) drawBar() {
	const width = 40
	done, created := int(t.nAllocated.Load()), int(t.nCreated.Load())
	n := done * width / t.f.claims
	fmt.Fprintf(os.Stderr, "\r[%s%s] %d/%d claims allocated (%d created) %5.1fs",
		strings.Repeat("#", n), strings.Repeat(".", width-n), done, t.f.claims, created, time.Since(t.start).Seconds())
}

// isTerminal reports whether f is a character device, as a terminal is.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// report prints the figures of the timed phase.
func (t *test) report() {
	n := int(t.nAllocated.Load())
	total := t.end.Sub(t.start)
	if n == 0 {
		total = 0
	}
	var lat, createLat, lag, queued, inRound []time.Duration
	for i := range t.f.claims {
		if t.allocated[i].IsZero() {
			continue
		}
		created := time.Unix(0, t.created[i].Load())
		lat = append(lat, t.allocated[i].Sub(created))
		if d := t.createDone[i].Load(); d != 0 {
			createLat = append(createLat, time.Unix(0, d).Sub(created))
		}
		if c := t.cached[i].Load(); c != 0 {
			cached := time.Unix(0, c)
			lag = append(lag, cached.Sub(created))
			queued = append(queued, t.listed[i].Sub(cached))
		}
		inRound = append(inRound, t.allocated[i].Sub(t.listed[i]))
	}
	limits := "the connection's"
	if t.f.qps != 0 {
		limits = fmt.Sprintf("QPS %g, burst %d", t.f.qps, t.f.burst)
	}
	fmt.Printf("\n%d of %d claims (1 pod each) allocated on a pool of %d ready pods; %d creators; allocator's client rate limits: %s\n",
		n, t.f.claims, t.f.pods, t.f.concurrency, limits)
	if n < t.f.claims {
		fmt.Printf("  time to allocate all    not reached: -timeout %s passed (last allocation after %s)\n", t.f.timeout, round(total))
	} else {
		fmt.Printf("  time to allocate all    %s (first create issued → last Round returned)\n", round(total))
	}
	if total > 0 {
		fmt.Printf("  throughput              %.0f claims/s\n", float64(n)/total.Seconds())
	}
	fmt.Printf("  creates done after      %s\n", round(t.createsEnd.Sub(t.start)))
	fmt.Printf("  latency per claim       %s   (create issued → Round that wrote it returned)\n", pcts(lat))
	fmt.Printf("    create request        %s\n", pcts(createLat))
	fmt.Printf("    issued → in cache     %s   (create + watch delivery)\n", pcts(lag))
	fmt.Printf("    in cache → listed     %s   (waiting for the round in progress)\n", pcts(queued))
	fmt.Printf("    listed → allocated    %s   (the round that wrote it)\n", pcts(inRound))
	fmt.Printf("  rounds                  %d, %d with errors; claims allocated per round %v", t.rounds, t.roundErr, t.perRound)
	if t.lastErr != nil {
		fmt.Printf(" (last: %s)", firstLine(t.lastErr))
	}
	fmt.Println()
	perClaim := 0.0
	if n > 0 {
		perClaim = float64(t.patches.Load()) / float64(n)
	}
	fmt.Printf("  API writes to claims    %d patches = %.2f per allocated claim (%d conflicts); %d live reads\n",
		t.patches.Load(), perClaim, t.conflicts.Load(), t.liveReads.Load())
	if n > 0 {
		fmt.Printf("  API writes to pods      %d patches = %.2f per allocated claim (pod marks: %v)\n",
			t.podPatches.Load(), float64(t.podPatches.Load())/float64(n), t.f.marks)
	}
	t.patchMu.Lock()
	fmt.Printf("    patch request         %s   (%d at once at most)\n", pcts(t.patchLat), t.f.writers)
	t.patchMu.Unlock()
	wall := t.end.Sub(t.start)
	if n < t.f.claims || wall <= 0 {
		wall = time.Since(t.start)
	}
	fmt.Printf("  CPU of this process     %s user+sys (%.2f cores); includes the claim creators, client and cache, not only the allocator\n",
		round(t.cpu), t.cpu.Seconds()/wall.Seconds())
	fmt.Printf("  wall time inside Round  %s over %d rounds (slowest %s)\n", round(t.inRound), t.rounds, round(t.slowest))
	if len(t.plane) > 0 {
		var parts []string
		for _, p := range t.plane {
			parts = append(parts, fmt.Sprintf("%s %s", p.name, round(p.cpu)))
		}
		fmt.Printf("  control plane CPU       %s (same 2-core machine)\n", strings.Join(parts, ", "))
	}
	fmt.Printf("  load average (1 min)    %s at start, %s at end\n", t.load[0], t.load[1])
	fmt.Printf("  peak memory             heap in use %.0f MiB (sampled), max RSS %.0f MiB\n",
		float64(t.heapPeak)/(1<<20), float64(t.maxRSS)/(1<<20))
	verdict := "PASS"
	if n < t.f.claims || total > target {
		verdict = "FAIL"
	}
	fmt.Printf("target: %d claims allocated in ≤%s: %s (%s)\n", t.f.claims, target, verdict, round(total))
}

func (t *test) recordPatch(d time.Duration) {
	t.patchMu.Lock()
	defer t.patchMu.Unlock()
	t.patchLat = append(t.patchLat, d)
}

// loadAverage returns the 1-minute load average, or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

func round(d time.Duration) string { return d.Round(time.Millisecond).String() }

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// pcts formats the p50 and p99 of ds (nearest rank).
func pcts(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration {
		i := int(float64(len(s))*p+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return fmt.Sprintf("p50 %-8s p99 %-8s", round(at(0.50)), round(at(0.99)))
}

// cpuTime returns the user and system CPU time of this process.
func cpuTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// procCPU is the CPU time of a process, by command name.
type procCPU struct {
	name string
	cpu  time.Duration
}

// controlPlaneCPU returns the CPU time of the embedded API server and etcd,
// our child processes, read from /proc; nil when not embedded or not on
// Linux.
func (t *test) controlPlaneCPU() []procCPU {
	if !t.embedded {
		return nil
	}
	self := strconv.Itoa(os.Getpid())
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []procCPU
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15), in clock ticks.
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		name := s[open+1 : end]
		if len(fields) < 13 || fields[1] != self || (name != "kube-apiserver" && name != "etcd") {
			continue
		}
		utime, _ := strconv.ParseInt(fields[11], 10, 64)
		stime, _ := strconv.ParseInt(fields[12], 10, 64)
		const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
		out = append(out, procCPU{name: name, cpu: time.Duration(utime+stime) * tick})
	}
	slices.SortFunc(out, func(a, b procCPU) int { return strings.Compare(a.name, b.name) })
	return out
}

func diffCPU(before, after []procCPU) []procCPU {
	out := slices.Clone(after)
	for i := range out {
		for _, b := range before {
			if b.name == out[i].name {
				out[i].cpu -= b.cpu
			}
		}
	}
	return out
}

// startProfile starts a CPU profile written to path; the function returned
// stops it.
func startProfile(path string) (func() error, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, errors.Join(fmt.Errorf("cpu profile: %w", err), f.Close())
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// heapInuse returns the bytes of heap spans in use.
func heapInuse() uint64 {
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return m.HeapInuse
}
