package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	poolv1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
	"github.com/poolalloc/poolalloc/examples/operator/fakekubelet"
	"github.com/poolalloc/poolalloc/syncer"
)

// The embedded mode: an API server of our own, the operator, a fake
// kubelet and a scripted demo. None of this runs with KUBECONFIG.
const (
	leaseNamespace = "poolalloc-system"
	demoNamespace  = "demo"
	demoPool       = "warm"
	// printEvery is how often the demo prints who holds what.
	printEvery = 3 * time.Second
	// stepTimeout bounds how long a step waits to be served.
	stepTimeout = 20 * time.Second
)

// runEmbedded starts an embedded API server, runs the operator, the fake
// kubelet and the demo on it, and stops them all when the demo ends
// (-demo-duration) or ctx does.
func runEmbedded(ctx context.Context, f flags, stdout, stderr io.Writer) (err error) {
	fmt.Fprintln(stdout, "KUBECONFIG is not set: starting an embedded kube-apiserver and etcd (see embedded.go)")
	env, err := startEmbedded(ctx, stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, env.stop()) }()

	ns := demoNamespace
	if f.namespaceSeen {
		ns = f.namespace
	}
	mc := f.managerConfig()
	if mc.LeaseNamespace == "" {
		mc.LeaseNamespace = leaseNamespace
	}
	if f.namespace != "" {
		mc.Namespaces = []string{ns}
	}
	for _, name := range []string{mc.LeaseNamespace, ns} {
		err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace %s: %w", name, err)
		}
	}
	mgr, err := NewManager(env.Config, mc)
	if err != nil {
		return err
	}
	if err := Setup(mgr, Options{Resync: f.resync, FullResync: f.fullResync}); err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var mgrErr, kubeletErr error
	wg.Go(func() {
		mgrErr = mgr.Start(runCtx)
		if mgrErr != nil {
			mgrErr = fmt.Errorf("manager: %w", mgrErr)
		}
		cancel() // the demo has nothing to show without the operator
	})
	kubelet := &fakekubelet.Kubelet{Client: env.Client, Namespace: ns, StartDelay: 500 * time.Millisecond}
	wg.Go(func() {
		kubeletErr = kubelet.Run(runCtx)
		if kubeletErr != nil {
			cancel()
		}
	})
	d := &demo{c: env.Client, ns: ns, out: stdout, start: time.Now()}
	fmt.Fprintf(stdout, "operator running (metrics %s, probes %s, leader election %t, lease %s/%s); demo in namespace %s for %v\n",
		f.metricsAddr, f.probeAddr, mc.LeaderElection, mc.LeaseNamespace, mc.LeaseID, ns, durationText(f.demoDuration))
	demoErr := d.run(runCtx, f.demoDuration)
	cancel()
	wg.Wait()
	return errors.Join(demoErr, mgrErr, kubeletErr)
}

func durationText(d time.Duration) string {
	if d == 0 {
		return "ever (until signalled)"
	}
	return d.String()
}

// demo scripts a pool's life while the operator serves it, and prints who
// holds what, as the claims' records on the API server say. Calls to say
// and snapshot are serialized by mu.
type demo struct {
	c     client.Client
	ns    string
	out   io.Writer
	start time.Time
	mu    sync.Mutex // serializes output
}

// run creates the demo pool and claims and walks through the steps, then
// waits; it returns nil when duration (0: ctx) ends.
func (d *demo) run(ctx context.Context, duration time.Duration) error {
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		t := time.NewTicker(printEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				d.snapshot(ctx)
			}
		}
	})
	err := d.steps(ctx)
	if ctx.Err() != nil {
		d.say("demo over: stopping the operator")
		return nil // the demo's time is up, or a signal came
	}
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if duration > 0 {
		d.say("all steps done: the operator keeps serving until the demo's %v are up", duration)
	} else {
		d.say("all steps done: the operator keeps serving until SIGTERM or Ctrl-C")
	}
	<-ctx.Done()
	d.say("demo over: stopping the operator")
	return nil
}

// steps is the script.
func (d *demo) steps(ctx context.Context) error {
	if err := d.c.Create(ctx, poolv1.NewPool(d.ns, demoPool, 4)); err != nil {
		return fmt.Errorf("create pool %s/%s: %w", d.ns, demoPool, err)
	}
	for _, cl := range []*poolv1.Claim{
		poolv1.NewClaim(d.ns, "alpha", demoPool, 2),
		poolv1.NewClaim(d.ns, "beta", demoPool, 1),
		poolv1.NewClaim(d.ns, "gamma", demoPool, 2),
	} {
		if err := d.c.Create(ctx, cl); err != nil {
			return fmt.Errorf("create claim %s/%s: %w", d.ns, cl.Name, err)
		}
	}
	d.say("created pool %s (replicas 4) and claims alpha (2), beta (1), gamma (2): the pool grows to 5", demoPool)
	if err := d.served(ctx); err != nil {
		return err
	}

	d.say("alpha scales up to 3")
	if err := d.edit(ctx, "alpha", func(cl *poolv1.Claim) { cl.Spec.Replicas = 3 }); err != nil {
		return err
	}
	if err := d.served(ctx); err != nil {
		return err
	}

	pod, err := d.firstHeld(ctx, "beta")
	if err != nil {
		return err
	}
	d.say("beta swaps %s: releases it and keeps wanting 1; %s is deleted and beta gets another pod", pod, pod)
	if err := d.release(ctx, "beta", pod, 1); err != nil {
		return err
	}
	if err := d.served(ctx); err != nil {
		return err
	}

	if pod, err = d.firstHeld(ctx, "alpha"); err != nil {
		return err
	}
	d.say("alpha gives back %s for good: releases it and now wants 2", pod)
	if err := d.release(ctx, "alpha", pod, 2); err != nil {
		return err
	}
	if err := d.served(ctx); err != nil {
		return err
	}

	d.say("gamma is deleted: its pods are deleted, then its finalizer goes")
	if err := d.c.Delete(ctx, poolv1.NewClaim(d.ns, "gamma", demoPool, 0)); err != nil {
		return fmt.Errorf("delete claim %s/gamma: %w", d.ns, err)
	}
	if err := d.served(ctx); err != nil {
		return err
	}

	d.say("delta wants 3 pods of class large, all at once (a gang): the operator makes 3 large pods, and delta gets them in one hand-out")
	delta := poolv1.NewClaim(d.ns, "delta", demoPool, 3)
	delta.Spec.Class, delta.Spec.Gang = "large", true
	if err := d.c.Create(ctx, delta); err != nil {
		return fmt.Errorf("create claim %s/delta: %w", d.ns, err)
	}
	if err := d.served(ctx); err != nil {
		return err
	}

	d.say("epsilon wants 3 pods spread over zones, at most one more in a zone than in any other")
	epsilon := poolv1.NewClaim(d.ns, "epsilon", demoPool, 3)
	epsilon.Spec.Topology = &poolv1.ClaimTopology{Mode: "Spread", Key: allocator.ZoneLabel, MaxSkew: 1}
	if err := d.c.Create(ctx, epsilon); err != nil {
		return fmt.Errorf("create claim %s/epsilon: %w", d.ns, err)
	}
	if err := d.served(ctx); err != nil {
		return err
	}
	if err := d.zones(ctx, "epsilon"); err != nil {
		return err
	}

	d.say("pool %s scales down to 2: the idle pods beyond what the claims hold are deleted", demoPool)
	pool := poolv1.NewPool(d.ns, demoPool, 0)
	patch := []byte(`{"spec":{"replicas":2}}`)
	if err := d.c.Patch(ctx, pool, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		return fmt.Errorf("scale pool %s/%s: %w", d.ns, demoPool, err)
	}
	return d.served(ctx)
}

// zones prints the zones of the pods claim holds.
func (d *demo) zones(ctx context.Context, claim string) error {
	v, err := d.view(ctx)
	if err != nil {
		return err
	}
	zone := map[string]string{}
	for _, p := range v.pods {
		zone[p.Name] = p.Labels[allocator.ZoneLabel]
	}
	for _, c := range v.claims {
		if c.name == claim {
			var zs []string
			for _, p := range c.held {
				zs = append(zs, p+" in "+zone[p])
			}
			d.say("%s holds %s", claim, strings.Join(zs, ", "))
		}
	}
	return nil
}

// edit changes a claim with a merge patch (the allocator's annotations and
// finalizer are left as they are).
func (d *demo) edit(ctx context.Context, name string, change func(*poolv1.Claim)) error {
	var cl poolv1.Claim
	if err := d.c.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: name}, &cl); err != nil {
		return fmt.Errorf("claim %s/%s: %w", d.ns, name, err)
	}
	orig := cl.DeepCopy()
	change(&cl)
	if err := d.c.Patch(ctx, &cl, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("claim %s/%s: patch: %w", d.ns, name, err)
	}
	return nil
}

// release is what a claim's owner does to give a pod back: it names the pod
// in the release annotation and sets the replicas it wants from now on.
func (d *demo) release(ctx context.Context, claim, pod string, replicas int32) error {
	value, err := syncer.EncodePods([]string{pod})
	if err != nil {
		return err
	}
	return d.edit(ctx, claim, func(cl *poolv1.Claim) {
		if cl.Annotations == nil {
			cl.Annotations = map[string]string{}
		}
		cl.Annotations[syncer.DefaultKeys().Release] = value
		cl.Spec.Replicas = replicas
	})
}

// firstHeld returns the first pod claim's record holds.
func (d *demo) firstHeld(ctx context.Context, claim string) (string, error) {
	v, err := d.view(ctx)
	if err != nil {
		return "", err
	}
	for _, c := range v.claims {
		if c.name == claim && len(c.held) > 0 {
			return c.held[0], nil
		}
	}
	return "", fmt.Errorf("claim %s/%s holds no pod", d.ns, claim)
}

// served waits until every claim holds what it wants and every pod it
// released is recorded released (the owner then clears its release
// annotation, as the protocol asks), no claim is being deleted, and the
// pool has no idle pod beyond its size; then it prints who holds what.
func (d *demo) served(ctx context.Context) error {
	t0, parent := time.Now(), ctx
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		v, err := d.view(ctx)
		if err == nil {
			if err = d.clearReleased(ctx, v); err == nil {
				last = v.unsettled()
				if last == "" {
					d.say("served in %.1fs", time.Since(t0).Seconds())
					d.print(v)
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			if parent.Err() != nil {
				return parent.Err()
			}
			return fmt.Errorf("not served after %v: %s (last error: %v)", stepTimeout, last, err)
		case <-tick.C:
		}
	}
}

// clearReleased clears the release annotation of claims whose released
// pods show in the released annotation.
func (d *demo) clearReleased(ctx context.Context, v view) error {
	for _, c := range v.claims {
		if len(c.release) > 0 && !c.deleting && subset(c.release, c.released) {
			if err := d.edit(ctx, c.name, func(cl *poolv1.Claim) { delete(cl.Annotations, syncer.DefaultKeys().Release) }); err != nil {
				return err
			}
		}
	}
	return nil
}

func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// view is the demo namespace as the API server shows it.
type view struct {
	replicas int64
	pods     []corev1.Pod
	claims   []claimView
}

type claimView struct {
	name                    string
	want                    int
	held, release, released []string
	deleting                bool
	err                     error // the record cannot be read
}

func (d *demo) view(ctx context.Context) (view, error) {
	var v view
	pool := poolv1.NewPool(d.ns, demoPool, 0)
	if err := d.c.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
		return v, fmt.Errorf("pool %s/%s: %w", d.ns, demoPool, err)
	}
	v.replicas, _, _ = unstructured.NestedInt64(pool.Object, "spec", "replicas")
	var pods corev1.PodList
	if err := d.c.List(ctx, &pods, client.InNamespace(d.ns), client.MatchingLabels{PoolLabel: demoPool}); err != nil {
		return v, fmt.Errorf("list pods of pool %s/%s: %w", d.ns, demoPool, err)
	}
	v.pods = pods.Items
	var claims poolv1.ClaimList
	if err := d.c.List(ctx, &claims, client.InNamespace(d.ns)); err != nil {
		return v, fmt.Errorf("list claims of %s: %w", d.ns, err)
	}
	records, err := syncer.NewAnnotationSyncer(d.c, syncer.DefaultKeys())
	if err != nil {
		return v, err
	}
	for i := range claims.Items {
		cl := &claims.Items[i]
		rec, err := records.Read(cl)
		v.claims = append(v.claims, claimView{
			name: cl.Name, want: int(cl.Spec.Replicas), deleting: cl.DeletionTimestamp != nil,
			held: rec.Held(), release: rec.Release, released: rec.Released, err: err,
		})
	}
	return v, nil
}

// unsettled says what is not done yet, "" when everything is.
func (v view) unsettled() string {
	held := 0
	for _, c := range v.claims {
		switch {
		case c.err != nil:
			return fmt.Sprintf("claim %s: %v", c.name, c.err)
		case c.deleting:
			return fmt.Sprintf("claim %s is being deleted", c.name)
		case len(c.held) != c.want:
			return fmt.Sprintf("claim %s holds %d of %d", c.name, len(c.held), c.want)
		case len(c.release) > 0:
			return fmt.Sprintf("claim %s gives back %s", c.name, strings.Join(c.release, ", "))
		}
		held += len(c.held)
	}
	live := 0
	for i := range v.pods {
		if podLive(&v.pods[i]) {
			live++
		}
	}
	if want := max(int(v.replicas), held); live != want {
		return fmt.Sprintf("pool has %d pods, wants %d", live, want)
	}
	return ""
}

// snapshot prints who holds what now.
func (d *demo) snapshot(ctx context.Context) {
	v, err := d.view(ctx)
	if err != nil {
		if ctx.Err() == nil {
			d.say("cannot read the pool: %v", err)
		}
		return
	}
	d.print(v)
}

// print prints v: the pool's pods, then each claim and the pods it holds.
func (d *demo) print(v view) {
	d.mu.Lock()
	defer d.mu.Unlock()
	holder := map[string]string{}
	for _, c := range v.claims {
		for _, p := range c.held {
			holder[p] = c.name
		}
	}
	starting, idle := 0, 0
	for i := range v.pods {
		switch p := &v.pods[i]; {
		case !podLive(p):
		case !allocator.PodReady(p):
			starting++
		case holder[p.Name] == "":
			idle++
		}
	}
	fmt.Fprintf(d.out, "[%5.1fs] pool %s (replicas %d): %d pods, %d starting, %d idle\n",
		time.Since(d.start).Seconds(), demoPool, v.replicas, len(v.pods), starting, idle)
	for _, c := range v.claims {
		note := ""
		switch {
		case c.err != nil:
			note = "  record unreadable: " + c.err.Error()
		case c.deleting:
			note = "  (being deleted)"
		case len(c.release) > 0:
			note = "  (giving back " + strings.Join(c.release, ", ") + ")"
		}
		fmt.Fprintf(d.out, "         %-6s wants %d, holds [%s]%s\n", c.name, c.want, strings.Join(c.held, " "), note)
	}
}

// say prints a line of the script.
func (d *demo) say(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.out, "[%5.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}
