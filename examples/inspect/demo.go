package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

// demoPool is the demo pool's name unless -pool names another.
const demoPool = "demo"

// demoClaims are the demo's claims and how many pods each wants; the pool
// has demoPods pods, so some stay free.
var demoClaims = map[string]int32{"alpha": 2, "beta": 1, "gamma": 2}

const demoPods = 7

// demo starts an embedded API server, sets up a demo pool on it and
// inspects that. Progress goes to stderr; the report says it is a demo.
func demo(ctx context.Context, f flags, stderr io.Writer) (rep Report, err error) {
	fmt.Fprintln(stderr, "KUBECONFIG is not set: nothing to inspect, so this runs a demo on an embedded kube-apiserver and etcd (about a minute to start)")
	if f.namespaceSet {
		fmt.Fprintln(stderr, "-namespace is ignored: the demo creates a namespace of its own")
	}
	env, err := testenv.Start(ctx, stderr)
	if err != nil {
		return Report{}, err
	}
	defer func() { err = errors.Join(err, env.Stop()) }()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "poolalloc-inspect-demo-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		return Report{}, fmt.Errorf("create namespace: %w", err)
	}
	f.opts.Pool = types.NamespacedName{Namespace: ns.Name, Name: demoPool}
	if f.pool != "" {
		f.opts.Pool.Name = f.pool
	}
	if err := setupDemo(ctx, env.Client, f.opts, f.demoFaults, stderr); err != nil {
		return Report{}, fmt.Errorf("demo: %w", err)
	}
	rep, err = inspect(ctx, env.Client, f.opts)
	rep.Demo = true
	return rep, err
}

// setupDemo creates the demo pool in opts.Pool's namespace: demoPods Ready
// pods and the demoClaims, served by two rounds of a real allocator that
// keeps records and marks as opts says. With faults it then edits, by
// hand, beta's record to list one of alpha's pods too and, with marks, an
// idle pod's mark to name alpha.
func setupDemo(ctx context.Context, c client.Client, opts options, faults bool, log io.Writer) error {
	pool := opts.Pool
	if _, err := testenv.CreatePods(ctx, c, pool.Namespace, pool.Name, demoPods, true); err != nil {
		return err
	}
	claims := map[string]*testenv.Claim{}
	for _, name := range slices.Sorted(maps.Keys(demoClaims)) {
		cl := testenv.NewClaim(pool.Namespace, name, pool.Name, demoClaims[name])
		if err := c.Create(ctx, cl); err != nil {
			return fmt.Errorf("create claim %s: %w", name, err)
		}
		claims[name] = cl
	}
	aopts := []allocator.Option{allocator.WithPodMarks(opts.MarkKey != "")}
	if opts.MarkKey != "" {
		aopts = append(aopts, allocator.WithPodMarkKey(opts.MarkKey))
	}
	if opts.OpenSandbox {
		aopts = append(aopts, allocator.WithOpenSandbox())
	}
	a, err := allocator.New(c, aopts...)
	if err != nil {
		return err
	}
	var res allocator.Result
	for i := 1; i <= 2; i++ {
		if res, err = world.Round(ctx, a, c, pool); err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		if len(res.Warnings) > 0 {
			return fmt.Errorf("round %d: %w", i, errors.Join(res.Warnings...))
		}
		n := 0
		for _, g := range res.Allocated {
			n += len(g.Pods)
		}
		fmt.Fprintf(log, "demo: pool %s, %d pods, claims alpha/beta/gamma want 2/1/2: allocator round %d handed out %d pods, %d idle\n",
			pool, demoPods, i, n, res.IdleCount)
	}
	if !faults {
		return nil
	}

	// Hand edits, as an operator's mistake or an attacker might make them.
	snap, err := a.Store().Snapshot(pool)
	if err != nil {
		return err
	}
	var alphaPod string
	for _, pod := range slices.Sorted(maps.Keys(snap)) {
		if snap[pod].UID == claims["alpha"].UID {
			alphaPod = pod
			break
		}
	}
	if alphaPod == "" || len(res.Idle) == 0 {
		return fmt.Errorf("after two rounds alpha holds no pod or no pod is idle (%d idle)", len(res.Idle))
	}
	s, err := newSyncer(c, opts.OpenSandbox)
	if err != nil {
		return err
	}
	beta := &testenv.Claim{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(claims["beta"]), beta); err != nil {
		return err
	}
	rec, err := s.Read(beta)
	if err != nil {
		return err
	}
	value, err := syncer.EncodePods(append(rec.Allocated, alphaPod))
	if err != nil {
		return err
	}
	orig := beta.DeepCopy()
	metav1.SetMetaDataAnnotation(&beta.ObjectMeta, s.Keys().Allocated, value)
	if err := c.Patch(ctx, beta, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("edit beta's record: %w", err)
	}
	fmt.Fprintf(log, "demo: edited claim beta's record by hand to list %s, alpha's pod, too\n", alphaPod)
	if opts.MarkKey == "" {
		return nil
	}
	idle := slices.Min(res.Idle)
	pod := &corev1.Pod{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: idle}, pod); err != nil {
		return err
	}
	orig2 := pod.DeepCopy()
	metav1.SetMetaDataAnnotation(&pod.ObjectMeta, opts.MarkKey, "alpha/"+string(claims["alpha"].UID))
	if err := c.Patch(ctx, pod, client.MergeFrom(orig2)); err != nil {
		return fmt.Errorf("mark pod %s: %w", idle, err)
	}
	fmt.Fprintf(log, "demo: marked idle pod %s for claim alpha by hand\n", idle)
	return nil
}
