// Command quickstart walks through poolalloc on a real API server: a pool of
// six warm pods, three claims, a pod given back, a claim deleted, and a
// restart that rebuilds the allocation from the claims' records.
//
// Without KUBECONFIG it starts an embedded kube-apiserver and etcd (built
// once into a cache, see internal/testenv). With KUBECONFIG it uses that
// cluster, installs the test CRDs if missing, and removes what it created.
// Its pods are bound to made-up nodes and marked Ready by hand: nothing runs
// them.
package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/cluster"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) (err error) {
	ctrllog.SetLogger(logr.Discard()) // envtest logs through it
	conn, err := cluster.Connect(ctx)
	if err != nil {
		return err
	}
	// Cleanup runs after an error or Ctrl-C too, on a context of its own.
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	defer func() { err = errors.Join(err, conn.Close(cleanupCtx)) }()
	c := conn.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "poolalloc-quickstart-"}}
	if err := c.Create(ctx, ns); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	defer func() { err = errors.Join(err, cluster.RemoveNamespace(cleanupCtx, c, ns.Name, 8)) }()
	d := demo{c: c, pool: types.NamespacedName{Namespace: ns.Name, Name: "warm"}}
	fmt.Printf("namespace %s, pool %s\n", ns.Name, d.pool.Name)

	if _, err := testenv.CreatePods(ctx, c, ns.Name, d.pool.Name, 6, true); err != nil {
		return err
	}
	alpha := testenv.NewClaim(ns.Name, "alpha", d.pool.Name, 2)           // a typed object
	beta := testenv.NewUnstructuredClaim(ns.Name, "beta", d.pool.Name, 2) // no Go type needed
	gamma := testenv.NewClaim(ns.Name, "gamma", d.pool.Name, 3)
	for _, cl := range []client.Object{alpha, beta, gamma} {
		if err := c.Create(ctx, cl); err != nil {
			return fmt.Errorf("create claim %s: %w", cl.GetName(), err)
		}
	}
	a, err := allocator.New(c, allocator.WithRecycler(newScrubber()))
	if err != nil {
		return err
	}
	if err := d.step(ctx, a, "1. six Ready pods; alpha (typed), beta (unstructured) and gamma want 2+2+3",
		expect{held: map[string]int{"alpha": 2, "beta": 2, "gamma": 2}, shortfall: 1}); err != nil {
		return err
	}

	// alpha's owner is done with one pod: it names it in the release
	// annotation, its side of the record, and lowers its replicas. A merge
	// patch leaves the allocator's annotations as they are.
	held, err := a.Store().Held(d.pool, alpha.UID)
	if err != nil {
		return err
	}
	value, err := syncer.EncodePods(held[:1])
	if err != nil {
		return err
	}
	orig := alpha.DeepCopy()
	alpha.Annotations = map[string]string{syncer.DefaultKeys().Release: value}
	alpha.Spec.Replicas = 1
	if err := c.Patch(ctx, alpha, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("release a pod of alpha: %w", err)
	}
	if err := d.step(ctx, a, "2. alpha gives back "+held[0]+" and now wants 1",
		expect{held: map[string]int{"alpha": 1, "beta": 2, "gamma": 2}, recycling: 1, shortfall: 1}); err != nil {
		return err
	}

	if err := c.Delete(ctx, beta); err != nil {
		return fmt.Errorf("delete claim beta: %w", err)
	}
	for i := 1; ; i++ {
		res, claims, err := d.round(ctx, a)
		if err != nil {
			return err
		}
		gone := !slices.ContainsFunc(claims, func(cl allocator.Claim) bool { return cl.Object.GetUID() == beta.GetUID() })
		title := fmt.Sprintf("3.%d beta is deleted: it gets nothing new, our finalizer keeps it while its pods are recycled", i)
		if gone {
			title = fmt.Sprintf("3.%d beta's pods are released: the finalizer is off and beta is gone", i)
		}
		held, err := d.print(title, a, res, claims)
		if err != nil {
			return err
		}
		if gone && len(res.Recycling) == 0 {
			if err := (expect{held: map[string]int{"alpha": 1, "gamma": 3}}).check(title, held, res); err != nil {
				return err
			}
			break
		}
		if i == 10 {
			return errors.New("claim beta is still there after 10 rounds")
		}
	}

	// Restart: a new allocator on the same API server rebuilds the
	// allocation from the claims' records in its first round.
	before, err := a.Store().Snapshot(d.pool)
	if err != nil {
		return err
	}
	if a, err = allocator.New(c, allocator.WithRecycler(newScrubber())); err != nil {
		return err
	}
	if err := d.step(ctx, a, "4. restart: a new allocator, first round",
		expect{held: map[string]int{"alpha": 1, "gamma": 3}}); err != nil {
		return err
	}
	after, err := a.Store().Snapshot(d.pool)
	if err != nil {
		return err
	}
	if !maps.Equal(before, after) {
		all := maps.Clone(before)
		maps.Copy(all, after)
		for _, pod := range slices.Sorted(maps.Keys(all)) {
			if before[pod] != after[pod] {
				fmt.Printf("  %s: held by %q before, by %q after\n", pod, before[pod].Claim.Name, after[pod].Claim.Name)
			}
		}
		return errors.New("the recovered allocation differs from the one before the restart")
	}
	fmt.Println("\nrecovered: identical")
	return nil
}

// newScrubber stands in for a real recycle hook (restarting a sandbox,
// wiping a workspace): a pod is clean on the second call.
func newScrubber() allocator.Recycler {
	var mu sync.Mutex
	started := map[string]bool{} // guarded by mu
	return func(_ context.Context, req allocator.RecycleRequest) (bool, error) {
		pool, pod := req.Pool, req.Pod
		mu.Lock()
		defer mu.Unlock()
		done := started[pool.String()+"/"+pod]
		started[pool.String()+"/"+pod] = !done
		return done, nil
	}
}

type demo struct {
	c    client.Client
	pool types.NamespacedName
}

// round runs one round of a on the pool as listed now, and returns its
// result and the claims listed after it.
func (d demo) round(ctx context.Context, a allocator.Allocator) (allocator.Result, []allocator.Claim, error) {
	in, err := world.Input(ctx, d.c, d.pool)
	if err != nil {
		return allocator.Result{}, nil, err
	}
	res, err := a.Round(ctx, in)
	if err != nil {
		return res, nil, err
	}
	after, err := world.Input(ctx, d.c, d.pool)
	return res, after.Claims, err
}

// step runs a round, prints it and checks it against what the walkthrough
// expects.
func (d demo) step(ctx context.Context, a allocator.Allocator, title string, want expect) error {
	res, claims, err := d.round(ctx, a)
	if err != nil {
		return err
	}
	held, err := d.print(title, a, res, claims)
	if err != nil {
		return err
	}
	return want.check(title, held, res)
}

// expect is what a step of the walkthrough should show: how many pods
// each claim holds (not counting those being recycled), how many are being
// recycled, and the shortfall.
type expect struct {
	held                 map[string]int
	recycling, shortfall int
}

func (e expect) check(title string, held map[string][]string, res allocator.Result) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(e.held)) {
		if got := len(held[name]); got != e.held[name] {
			errs = append(errs, fmt.Errorf("claim %s holds %d pods, want %d", name, got, e.held[name]))
		}
	}
	for name := range held {
		if _, ok := e.held[name]; !ok {
			errs = append(errs, fmt.Errorf("claim %s holds %s, want nothing", name, list(held[name])))
		}
	}
	if len(res.Recycling) != e.recycling {
		errs = append(errs, fmt.Errorf("%d pods recycling, want %d", len(res.Recycling), e.recycling))
	}
	if res.Shortfall != e.shortfall {
		errs = append(errs, fmt.Errorf("shortfall %d, want %d", res.Shortfall, e.shortfall))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("step %q: %w", title, err)
	}
	return nil
}

// print shows who holds what: a line per claim, then the idle and
// recycling pods and how many pods the pool is short. It returns the pods
// each claim holds, not counting those being recycled.
func (d demo) print(title string, a allocator.Allocator, res allocator.Result, claims []allocator.Claim) (map[string][]string, error) {
	snap, err := a.Store().Snapshot(d.pool)
	if err != nil {
		return nil, err
	}
	held := map[string][]string{}
	for pod, h := range snap {
		if !slices.Contains(res.Recycling, pod) {
			held[h.Claim.Name] = append(held[h.Claim.Name], pod)
		}
	}
	var recycling []string
	for _, pod := range res.Recycling {
		recycling = append(recycling, pod+" (from "+snap[pod].Claim.Name+")")
	}
	fmt.Printf("\n%s\n", title)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  CLAIM\tWANTS\tPODS")
	for _, cl := range claims {
		wants := fmt.Sprint(cl.Want)
		if cl.Object.GetDeletionTimestamp() != nil {
			wants = "deleting"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\n", cl.Object.GetName(), wants, list(held[cl.Object.GetName()]))
	}
	fmt.Fprintf(w, "  idle\t\t%s\n  recycling\t\t%s\n  shortfall\t\t%d\n", list(res.Idle), list(recycling), res.Shortfall)
	return held, w.Flush()
}

func list(pods []string) string {
	if len(pods) == 0 {
		return "-"
	}
	return strings.Join(slices.Sorted(slices.Values(pods)), " ")
}
