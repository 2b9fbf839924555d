package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/allocator/follow"
	"github.com/poolalloc/poolalloc/allocator/sharding"
	poolv1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
	"github.com/poolalloc/poolalloc/syncer"
)

// The operator's API (package api/v1, CRDs in config/crd). A Pool
// (pools.test.poolalloc.io, no Go type: read as unstructured) keeps at
// least spec.replicas pods and grows to serve its claims; a Claim
// (claims.test.poolalloc.io, typed) names its pool in spec.poolRef and
// wants spec.replicas pods, spec.priority breaking ties when the pool is
// short. A claim may also place its pods (spec.selector,
// spec.class, spec.topology, spec.gang; see claimPlacement). A pool's pods
// are the pods of its namespace labelled PoolLabel=<pool name>; a pod made
// for a class is labelled ClassLabel=<class>. Fork: replace these with your
// own types.
const (
	// PoolLabel names a pod's pool.
	PoolLabel = poolv1.PoolLabel
	// ClassLabel names the class (the pod template) a pod was made for.
	ClassLabel = "poolalloc.io/class"
	// ClaimLabel names the claim a pod is handed to, while it is (the
	// mark hook sets it in the write that marks the pod).
	ClaimLabel = "poolalloc.io/claim"
	// ManagedByLabel marks the pods this operator created.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	// ManagedBy is ManagedByLabel's value.
	ManagedBy = "poolalloc-operator"
)

// Field indexes of the manager's cache: a claim's pool and a pod's pool,
// both by name in the object's namespace. claimPoolIndex is also a
// selectable field of the Claim CRD, so the same MatchingFields works on a
// client without a cache.
const (
	claimPoolIndex = "spec.poolRef"
	podPoolIndex   = "metadata.labels." + PoolLabel
)

// Defaults of Options.
const (
	DefaultResync = 30 * time.Second
	// DefaultPodImage is the image of the pods the operator creates
	// unless Options.PodImage names another: the pause image.
	DefaultPodImage = "registry.k8s.io/pause:3.10"
	// busyRequeue is how soon a pool that is waiting for something (pods
	// starting, pods being recycled, its cache catching up with our own
	// writes) is looked at again, whatever events arrive.
	busyRequeue = 2 * time.Second
	// expectTimeout is how long a pod this process created or deleted may
	// be missing from (or still in) the cache before we stop waiting for
	// it: a watch that lost the event.
	expectTimeout = 30 * time.Second
)

// Options configures Setup.
type Options struct {
	// Resync is how often a pool is reconciled when nothing happens to it:
	// the allocator acts on time too (quarantines). Default DefaultResync.
	Resync time.Duration
	// FullResync is how often a pool's round lists it whole (Round)
	// instead of taking the changes its events told (Update); default
	// follow.DefaultResync. It bounds how long an event the cache lost
	// goes unnoticed.
	FullResync time.Duration
	// PodImage is the image of the pods the operator creates; default
	// DefaultPodImage.
	PodImage string
	// MaxConcurrentReconciles is how many pools are reconciled at once
	// (rounds of different pools run in parallel); default 2.
	MaxConcurrentReconciles int
	// Metrics is where the allocator's metrics are registered; default
	// controller-runtime's metrics.Registry, which the manager's metrics
	// endpoint serves. A process that sets up more than one operator (a
	// test) gives each its own.
	Metrics prometheus.Registerer
	// Quarantine is the allocator's (allocator.WithQuarantine): among
	// others, how long a claim waits after a restart for a pod a stopped
	// process marked for it but did not record (its hand-out may still be
	// in flight). Default allocator.DefaultQuarantine.
	Quarantine time.Duration
	// Shards, when set, spreads the pools over the operator's replicas:
	// this one serves only the pools it owns (sharding.Membership.Owns),
	// forgets the others, and requeues every pool when the members change.
	// The caller runs the membership (mgr.Add(shards), say).
	Shards *sharding.Membership
}

// NewScheme returns the scheme the operator's manager needs: the core
// types (pods, events) and the API's typed Claim (api/v1). Pool has no Go
// type and is read as unstructured.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("scheme: core/v1: %w", err)
	}
	if err := poolv1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("scheme: %s: %w", poolv1.GroupVersion, err)
	}
	return s, nil
}

// CacheOptions returns the manager's cache options: only pods that belong
// to a pool (PoolLabel set) are cached, without their managed fields, and
// with namespaces only those namespaces are watched (all when empty).
func CacheOptions(namespaces ...string) (cache.Options, error) {
	hasPool, err := labels.NewRequirement(PoolLabel, selection.Exists, nil)
	if err != nil {
		return cache.Options{}, fmt.Errorf("cache: pod selector: %w", err)
	}
	opts := cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.NewSelector().Add(*hasPool)},
		},
	}
	if len(namespaces) > 0 {
		opts.DefaultNamespaces = make(map[string]cache.Config, len(namespaces))
		for _, ns := range namespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return opts, nil
}

// ManagerConfig is what NewManager needs beyond the REST config.
type ManagerConfig struct {
	// MetricsAddr is the metrics endpoint's address; "0" disables it.
	MetricsAddr string
	// ProbeAddr is the address of /healthz and /readyz; "0" disables them.
	ProbeAddr string
	// LeaderElection makes the manager run the controller only while it
	// holds the lease LeaseID in LeaseNamespace (empty: the namespace of the
	// pod it runs in).
	LeaderElection bool
	LeaseNamespace string
	LeaseID        string
	// Namespaces limits the cache to these namespaces; empty means all.
	Namespaces []string
}

// The client-side rate limits of the manager's clients (README, "Rate
// limits"). controller-runtime's client keeps a token bucket per resource
// type, and the allocator writes a claim's record while it marks the next
// claims' pods, so the operator hands out up to about ClientQPS pods a
// second (with pod marks: a pod write and a claim write each), ClientBurst
// at once: above what a small control plane serves (about 200 a second on
// 2 cores), while a runaway loop is still held to ClientQPS writes a
// second per resource. client-go's defaults (5 and 10, for a rest.Config
// that leaves them 0) would allow about 5 hand-outs a second.
const (
	ClientQPS   = 200
	ClientBurst = 400
)

// NewManager returns a manager for Setup: NewScheme, CacheOptions, the
// metrics server, the probes and leader election; its clients are limited
// to ClientQPS and ClientBurst, whatever cfg says. The lease is given up on
// shutdown (the process exits right after Start returns), so that a
// successor takes over at once.
func NewManager(cfg *rest.Config, mc ManagerConfig) (ctrl.Manager, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = ClientQPS, ClientBurst
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	cacheOpts, err := CacheOptions(mc.Namespaces...)
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Cache:                         cacheOpts,
		Metrics:                       metricsserver.Options{BindAddress: mc.MetricsAddr},
		HealthProbeBindAddress:        mc.ProbeAddr,
		LeaderElection:                mc.LeaderElection,
		LeaderElectionNamespace:       mc.LeaseNamespace,
		LeaderElectionID:              mc.LeaseID,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		if mc.LeaderElection && mc.LeaseNamespace == "" {
			err = fmt.Errorf("%w (outside a cluster, set the lease's namespace, -leader-election-namespace, or turn leader election off)", err)
		}
		return nil, fmt.Errorf("manager: %w", err)
	}
	return mgr, nil
}

// newPoolObject returns an empty Pool to read into.
func newPoolObject() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(poolv1.PoolGVK)
	return u
}

// Setup registers the operator on mgr: the field indexes, the pool
// reconciler with its watches, and the health and readiness probes. mgr's
// scheme must hold NewScheme's types and its cache should be made with
// CacheOptions. It fails, naming the kind, when the CRDs are not served.
func Setup(mgr ctrl.Manager, opts Options) error {
	if opts.Resync <= 0 {
		opts.Resync = DefaultResync
	}
	if opts.PodImage == "" {
		opts.PodImage = DefaultPodImage
	}
	if opts.MaxConcurrentReconciles <= 0 {
		opts.MaxConcurrentReconciles = 2
	}
	for _, gvk := range []struct{ kind, plural string }{{"Pool", "pools"}, {"Claim", "claims"}} {
		gk := poolv1.GroupVersion.WithKind(gvk.kind).GroupKind()
		if _, err := mgr.GetRESTMapper().RESTMapping(gk, poolv1.Version); err != nil {
			return fmt.Errorf("CRD %s.%s is not served (install it first): %w", gvk.plural, poolv1.Group, err)
		}
	}

	ctx := context.Background() // IndexField only uses it to start informers lazily
	err := mgr.GetFieldIndexer().IndexField(ctx, &poolv1.Claim{}, claimPoolIndex, func(o client.Object) []string {
		if c, ok := o.(*poolv1.Claim); ok && c.Spec.PoolRef != "" {
			return []string{c.Spec.PoolRef}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("index claims by %s: %w", claimPoolIndex, err)
	}
	err = mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, podPoolIndex, func(o client.Object) []string {
		if p := o.GetLabels()[PoolLabel]; p != "" {
			return []string{p}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("index pods by %s: %w", podPoolIndex, err)
	}

	reg := opts.Metrics
	if reg == nil {
		reg = ctrlmetrics.Registry
	}
	quarantine := opts.Quarantine
	if quarantine <= 0 {
		quarantine = allocator.DefaultQuarantine
	}
	alloc, err := allocator.New(mgr.GetClient(),
		allocator.WithAPIReader(mgr.GetAPIReader()), // live reads to settle conflicts
		allocator.WithQuarantine(quarantine),
		allocator.WithRecycler(allocator.RecycleDelete(mgr.GetClient())),
		// RecycleDelete deletes under the pod's resourceVersion: no
		// fence write before it.
		allocator.WithRecycleFence(false),
		// A claimed pod is labelled poolalloc.io/claim=<claim name> (for
		// a Service that routes to a claim's pods) in the write that
		// marks it, and unlabelled in the write that unmarks it.
		allocator.WithMarkHook(func(p allocator.MarkedPod) allocator.PodChange {
			return allocator.PodChange{Labels: map[string]string{ClaimLabel: p.Claim.Claim.Name}}
		}),
		allocator.WithClaimType(&poolv1.Claim{}),
		allocator.WithClaimPool(claimPool),
		allocator.WithMetrics(reg),
		// Allocated, Released and warnings on the claims, rate-limited.
		allocator.WithEvents(mgr.GetEventRecorder("poolalloc"), 0))
	if err != nil {
		return fmt.Errorf("allocator: %w", err)
	}
	r := &poolReconciler{
		client:   mgr.GetClient(),
		cache:    mgr.GetCache(),
		scheme:   mgr.GetScheme(),
		alloc:    alloc,
		pods:     newPodIndex(),
		events:   mgr.GetEventRecorder("poolalloc-operator"),
		opts:     opts,
		expected: expectations{pools: map[types.NamespacedName]map[string]expectation{}},
		gone:     map[types.NamespacedName]bool{},
	}
	// Rounds from the pods' and claims' events: a reconcile costs what
	// changed, and the pool is listed whole only on its first reconcile
	// and every FullResync.
	r.follow, err = follow.New(follow.Config{
		Allocator: alloc,
		PodPool:   poolOf,
		ClaimPool: func(o client.Object) types.NamespacedName {
			if p := claimPool(o); p.Name != "" {
				return p
			}
			return types.NamespacedName{}
		},
		Claim:  r.claim,
		List:   r.list,
		Resync: opts.FullResync,
	})
	if err != nil {
		return fmt.Errorf("follower: %w", err)
	}
	b := ctrl.NewControllerManagedBy(mgr)
	if opts.Shards != nil {
		b = b.WatchesRawSource(opts.Shards.Source(func(ctx context.Context) ([]types.NamespacedName, error) {
			return listPools(ctx, mgr.GetCache())
		}))
	}
	err = b.
		Named("pool").
		// Our own status writes change no generation: they do not wake us.
		For(newPoolObject(), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&poolv1.Claim{}, r.follow.ClaimEvents()).
		Watches(&corev1.Pod{}, indexedPods(r.pods, r.follow.PodEvents())).
		WithOptions(controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("pool controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("health probe: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("readiness probe: %w", err)
	}
	return nil
}

// listPools returns every Pool c (the manager's cache) holds.
func listPools(ctx context.Context, c client.Reader) ([]types.NamespacedName, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(poolv1.PoolGVK.GroupVersion().WithKind(poolv1.PoolGVK.Kind + "List"))
	if err := c.List(ctx, list); err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	out := make([]types.NamespacedName, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, client.ObjectKeyFromObject(&list.Items[i]))
	}
	return out, nil
}

// claimPool is the pool a claim names, for allocator.WithClaimPool: the
// allocator gives a claim's pods back at once when a live read shows it
// moved to another pool.
func claimPool(o client.Object) types.NamespacedName {
	name := ""
	switch c := o.(type) {
	case *poolv1.Claim:
		name = c.Spec.PoolRef
	case *unstructured.Unstructured:
		name, _, _ = unstructured.NestedString(c.Object, "spec", "poolRef")
	}
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: name}
}

// poolReconciler runs an allocator round for one pool per reconcile and
// sizes the pool. controller-runtime never reconciles one pool in two
// workers at once; different pools run in parallel.
type poolReconciler struct {
	client client.Client
	// cache reads pools from the manager's cache: the client reads
	// unstructured objects live, and Pool has no Go type.
	cache    client.Reader
	scheme   *runtime.Scheme
	alloc    allocator.Allocator
	follow   *follow.Follower
	pods     *podIndex
	events   recorder.EventRecorder
	opts     Options
	expected expectations

	goneMu sync.Mutex
	gone   map[types.NamespacedName]bool // pools deleted or being deleted; guarded by goneMu
}

// listingKey is the context key under which Reconcile asks list to keep
// the pool's pods it listed (for a pool's scale-down, which needs them).
type listingKey struct{}

// list lists a pool whole from the cache for the Follower's Round: its
// pods and its claims. A pool that is gone (or being deleted) takes all
// its pods back: its claims want none.
func (r *poolReconciler) list(ctx context.Context, poolName types.NamespacedName) (allocator.Input, error) {
	in := allocator.Input{Pool: poolName}
	var pods corev1.PodList
	if err := r.client.List(ctx, &pods, client.InNamespace(poolName.Namespace), client.MatchingFields{podPoolIndex: poolName.Name}); err != nil {
		return in, fmt.Errorf("pool %s: list pods: %w", poolName, err)
	}
	var claims poolv1.ClaimList
	if err := r.client.List(ctx, &claims, client.InNamespace(poolName.Namespace), client.MatchingFields{claimPoolIndex: poolName.Name}); err != nil {
		return in, fmt.Errorf("pool %s: list claims: %w", poolName, err)
	}
	in.Pods = pods.Items
	for i := range claims.Items {
		in.Claims = append(in.Claims, r.claim(&claims.Items[i]))
	}
	if keep, ok := ctx.Value(listingKey{}).(*[]corev1.Pod); ok {
		*keep = pods.Items
	}
	return in, nil
}

// claim is what a claim asks of its pool: spec.replicas pods (none when
// the pool is gone or being deleted), spec.priority, its placement.
func (r *poolReconciler) claim(o client.Object) allocator.Claim {
	c, ok := o.(*poolv1.Claim)
	if !ok {
		return allocator.Claim{Object: o}
	}
	want := int(c.Spec.Replicas)
	if r.poolGone(types.NamespacedName{Namespace: c.Namespace, Name: c.Spec.PoolRef}) {
		want = 0 // a pool's deletion takes its pods back
	}
	return allocator.Claim{Object: c, Want: want, Priority: c.Spec.Priority, Placement: claimPlacement(c.Spec)}
}

// poolGone reports whether the pool's last reconcile found it deleted or
// being deleted (rounds run only from its reconcile).
func (r *poolReconciler) poolGone(name types.NamespacedName) bool {
	r.goneMu.Lock()
	defer r.goneMu.Unlock()
	return r.gone[name]
}

// setGone records whether a pool is gone, for poolGone.
func (r *poolReconciler) setGone(name types.NamespacedName, gone bool) {
	r.goneMu.Lock()
	defer r.goneMu.Unlock()
	if gone {
		r.gone[name] = true
	} else {
		delete(r.gone, name)
	}
}

// Reconcile runs a round for the pool through the Follower: an Update with
// what the pool's events told since the last round, or, on the pool's
// first reconcile and every FullResync, a Round on the pool listed whole
// from the cache. Then it creates the pods the pool lacks, from counts the
// pod index keeps. A pool that is gone (or being deleted) gets its pods
// back from its claims through recycling, its idle pods are deleted, and
// once nothing is left the allocator forgets it.
func (r *poolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logr.FromContextOrDiscard(ctx)
	poolName := req.NamespacedName
	if s := r.opts.Shards; s != nil && !s.Owns(poolName) {
		// Another replica's (or nobody's yet): nothing of it is kept here.
		// The membership requeues it when that changes.
		r.forget(poolName)
		if err := r.alloc.ForgetPool(poolName); err != nil {
			return ctrl.Result{}, fmt.Errorf("pool %s: forget: %w", poolName, err)
		}
		return ctrl.Result{}, nil
	}
	pool := newPoolObject()
	gone := false
	switch err := r.cache.Get(ctx, poolName, pool); {
	case apierrors.IsNotFound(err):
		gone, pool = true, nil
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("pool %s: get: %w", poolName, err)
	default:
		gone = pool.GetDeletionTimestamp() != nil
	}
	r.setGone(poolName, gone)
	counts := r.pods.counts(poolName)
	waiting := r.expected.observe(poolName, func(name string) bool { return r.pods.has(poolName, name) }, time.Now())
	if gone {
		if counts.pods == 0 {
			var claims poolv1.ClaimList
			if err := r.client.List(ctx, &claims, client.InNamespace(poolName.Namespace), client.MatchingFields{claimPoolIndex: poolName.Name}); err != nil {
				return ctrl.Result{}, fmt.Errorf("pool %s: list claims: %w", poolName, err)
			}
			if !slices.ContainsFunc(claims.Items, hasAllocationFinalizer) {
				// Nothing of the pool is left and no claim holds anything
				// of it.
				r.forget(poolName)
				if err := r.alloc.ForgetPool(poolName); err != nil {
					return ctrl.Result{}, fmt.Errorf("pool %s: forget: %w", poolName, err)
				}
				log.V(1).Info("pool gone, forgotten")
				return ctrl.Result{}, nil
			}
		}
		// Every claim's want is 0 now, and the idle pods are deleted:
		// both need the pool listed whole.
		r.follow.Invalidate(poolName)
	}

	var listed []corev1.Pod // the pods, when the round listed the pool
	res, full, roundErr := r.follow.Sync(context.WithValue(ctx, listingKey{}, &listed), poolName)
	r.warn(pool, res.Warnings)

	var sizeErr error
	switch {
	case gone:
		sizeErr = r.deleteIdle(ctx, poolName, listed, res.Idle, len(res.Idle))
	case waiting:
		// The cache does not show all our creations and deletions yet: the
		// counts below would be wrong. Look again soon (events will come).
	default:
		var excess bool
		excess, sizeErr = r.size(ctx, pool, counts, res)
		if excess && roundErr == nil {
			if full {
				sizeErr = r.deleteIdle(ctx, poolName, listed, res.Idle, counts.live-replicasOf(pool))
			} else {
				// Trimming picks among the idle pods, which only a
				// Round lists: the next reconcile lists the pool.
				r.follow.Invalidate(poolName)
				waiting = true
			}
		}
	}
	var statusErr error
	if !gone {
		statusErr = r.writeStatus(ctx, pool, counts, res)
	}

	if err := errors.Join(roundErr, sizeErr, statusErr); err != nil {
		if ctx.Err() != nil {
			return ctrl.Result{}, nil // shutting down: nothing to retry here
		}
		return ctrl.Result{}, err // requeued with backoff; the error names the pool
	}
	if waiting || res.Shortfall > 0 || len(res.Recycling) > 0 || (gone && counts.pods > 0) {
		return ctrl.Result{RequeueAfter: busyRequeue}, nil
	}
	return ctrl.Result{RequeueAfter: r.opts.Resync}, nil
}

// forget drops what the operator keeps of a pool besides the allocator.
func (r *poolReconciler) forget(pool types.NamespacedName) {
	r.expected.forget(pool)
	r.setGone(pool, false)
	r.follow.Forget(pool)
}

// replicasOf is a pool's spec.replicas (0 when unset or unreadable; size
// reports the error).
func replicasOf(pool *unstructured.Unstructured) int {
	n, _, _ := unstructured.NestedInt64(pool.Object, "spec", "replicas")
	return int(n)
}

// claimPlacement is a claim's placement: its selector, topology and gang
// as written, and its class, which also selects the pods made for it
// (ClassLabel=<class>), so that the pods this operator creates for a
// class's shortfall (size) are the ones that serve it.
func claimPlacement(spec poolv1.ClaimSpec) algorithm.Placement {
	pl := spec.Placement()
	if spec.Class != "" {
		sel := labels.Set{ClassLabel: spec.Class}
		for k, v := range spec.Selector {
			sel[k] = v
		}
		pl.Selector = labels.SelectorFromSet(sel)
	}
	return pl
}

// hasAllocationFinalizer reports whether the allocator's finalizer is on
// the claim: it may hold pods.
func hasAllocationFinalizer(c poolv1.Claim) bool {
	return controllerutil.ContainsFinalizer(&c, syncer.DefaultKeys().Finalizer)
}

// size creates the pods the pool lacks: for each class, enough for its
// claims' shortfall less that class's pods still starting, and at least
// spec.replicas pods in all (of no class). It reports whether the pool has
// more live pods than spec.replicas while no claim waits for one: then
// idle pods may be deleted.
func (r *poolReconciler) size(ctx context.Context, pool *unstructured.Unstructured, counts podCounts, res allocator.Result) (excess bool, err error) {
	poolName := client.ObjectKeyFromObject(pool)
	replicas, _, err := unstructured.NestedInt64(pool.Object, "spec", "replicas")
	if err != nil {
		return false, fmt.Errorf("pool %s: spec.replicas: %w", poolName, err)
	}
	// The allocator's Starting is exact but not by class: the pods of no
	// class are what is left of it once the classes' are taken out.
	starting := counts.starting
	starting[""] = res.Starting
	for class, n := range starting {
		if class != "" {
			starting[""] -= n
		}
	}
	create, total := map[string]int{}, 0
	for class, n := range res.ShortfallByClass {
		if c := n - max(0, starting[class]); c > 0 {
			create[class], total = c, total+c
		}
	}
	if low := int(replicas) - counts.live - total; low > 0 {
		create[""], total = create[""]+low, total+low
	}
	for _, class := range slices.Sorted(maps.Keys(create)) {
		for range create[class] {
			pod, err := r.newPod(pool, class)
			if err != nil {
				return false, err
			}
			if err := r.client.Create(ctx, pod); err != nil {
				return false, fmt.Errorf("pool %s: create pod: %w", poolName, err)
			}
			r.expected.add(poolName, pod.Name, true, time.Now())
			logr.FromContextOrDiscard(ctx).V(1).Info("created pod", "pod", pod.Name, "class", class, "shortfall", res.Shortfall, "starting", res.Starting, "replicas", replicas, "live", counts.live)
		}
	}
	return total == 0 && res.Shortfall == 0 && counts.live > int(replicas), nil
}

// podLive reports whether a pod counts towards the pool's size: not being
// deleted and not finished.
func podLive(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// deleteIdle deletes up to n of the pool's idle pods (as the round found
// them) that carry no pod mark in the listing, newest first. Each delete is
// guarded by the pod's UID and resourceVersion as listed: the allocator
// marks a pod (a new resourceVersion) before it hands it out, so a pod
// handed out since, here or by another allocator, is left alone.
func (r *poolReconciler) deleteIdle(ctx context.Context, poolName types.NamespacedName, pods []corev1.Pod, idle []string, n int) error {
	isIdle := make(map[string]bool, len(idle))
	for _, name := range idle {
		isIdle[name] = true
	}
	var victims []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		_, marked := p.Annotations[allocator.DefaultPodMarkKey]
		if !marked && p.DeletionTimestamp == nil && isIdle[p.Name] {
			victims = append(victims, p)
		}
	}
	slices.SortFunc(victims, func(a, b *corev1.Pod) int {
		if c := b.CreationTimestamp.Compare(a.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(b.Name, a.Name)
	})
	var errs []error
	for _, p := range victims[:min(n, len(victims))] {
		uid, rv := p.UID, p.ResourceVersion
		err := r.client.Delete(ctx, p, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		switch {
		case err == nil:
			r.expected.add(poolName, p.Name, false, time.Now())
			logr.FromContextOrDiscard(ctx).V(1).Info("deleted idle pod", "pod", p.Name)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			// Gone already, or changed since the listing: next round.
		default:
			errs = append(errs, fmt.Errorf("pool %s: delete idle pod %s: %w", poolName, p.Name, err))
		}
	}
	return errors.Join(errs...)
}

// newPod is the pool's pod template: one pause container, the pool label,
// the class label if class is not empty, and the pool as controlling owner
// (the garbage collector deletes a deleted pool's pods). Fork: put your
// sandbox here, a template per class.
func (r *poolReconciler) newPod(pool *unstructured.Unstructured, class string) (*corev1.Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    pool.GetNamespace(),
			GenerateName: pool.GetName() + "-",
			Labels:       map[string]string{PoolLabel: pool.GetName(), ManagedByLabel: ManagedBy},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "sandbox", Image: r.opts.PodImage}},
		},
	}
	if class != "" {
		pod.Labels[ClassLabel] = class
	}
	if err := controllerutil.SetControllerReference(pool, pod, r.scheme); err != nil {
		return nil, fmt.Errorf("pool %s/%s: pod owner reference: %w", pool.GetNamespace(), pool.GetName(), err)
	}
	return pod, nil
}

// warn reports what the round dealt with itself and that is about no claim
// (a mark removal retried, say) as a Warning event on the pool. Warnings
// about a claim are on the claim already (allocator.WithEvents). They need
// no retry.
func (r *poolReconciler) warn(pool *unstructured.Unstructured, warnings []error) {
	for _, w := range warnings {
		var ce *allocator.ClaimError
		if !errors.As(w, &ce) && pool != nil {
			r.events.Eventf(pool, nil, corev1.EventTypeWarning, "AllocationWarning", "Allocate", "%s", w.Error())
		}
	}
}

// writeStatus writes what the round found into the pool's status, when it
// changed: pods, ready, idle, starting, recycling, lost, shortfall.
func (r *poolReconciler) writeStatus(ctx context.Context, pool *unstructured.Unstructured, counts podCounts, res allocator.Result) error {
	status := map[string]any{
		"observedGeneration": pool.GetGeneration(),
		"pods":               int64(counts.live),
		"ready":              int64(counts.ready),
		"idle":               int64(res.IdleCount),
		"starting":           int64(res.Starting),
		"recycling":          int64(len(res.Recycling)),
		"lost":               int64(len(res.Lost)),
		"shortfall":          int64(res.Shortfall),
	}
	old, _, _ := unstructured.NestedMap(pool.Object, "status")
	if reflect.DeepEqual(old, status) {
		return nil
	}
	orig := pool.DeepCopy()
	pool.Object["status"] = status
	if err := r.client.Status().Patch(ctx, pool, client.MergeFrom(orig)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("pool %s/%s: write status: %w", pool.GetNamespace(), pool.GetName(), err)
	}
	return nil
}

// expectations are the pod creations and deletions this process made that
// its cache does not show yet (the ReplicaSet controller's pattern): while
// any is pending, a pool's size is not acted on, so a lagging cache never
// makes us create or delete a pod twice.
type expectations struct {
	mu sync.Mutex
	// pools maps a pool to its pending pods by name. Guarded by mu.
	pools map[types.NamespacedName]map[string]expectation
}

// expectation is one pending pod.
type expectation struct {
	create bool // true: created, waiting to be listed; false: deleted, waiting to be unlisted
	since  time.Time
}

func (e *expectations) add(pool types.NamespacedName, pod string, create bool, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pools[pool] == nil {
		e.pools[pool] = map[string]expectation{}
	}
	e.pools[pool][pod] = expectation{create: create, since: now}
}

// observe drops the pending pods the cache shows done (listed tells
// whether it shows a pod of that name), or that waited longer than
// expectTimeout, and reports whether any is still pending.
func (e *expectations) observe(pool types.NamespacedName, listed func(name string) bool, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	pending := e.pools[pool]
	if len(pending) == 0 {
		return false
	}
	for name, x := range pending {
		if x.create == listed(name) || now.Sub(x.since) > expectTimeout {
			delete(pending, name)
		}
	}
	if len(pending) == 0 {
		delete(e.pools, pool)
		return false
	}
	return true
}

func (e *expectations) forget(pool types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.pools, pool)
}
