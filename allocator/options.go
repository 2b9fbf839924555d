package allocator

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/validate/content"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/store"
	"github.com/poolalloc/poolalloc/syncer"
)

// Option configures New.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// RecycleRequest is one pod to recycle.
type RecycleRequest struct {
	// Pool is the pod's pool; the pod is in its namespace.
	Pool types.NamespacedName
	// Pod is the pod's name.
	Pod string
	// UID and ResourceVersion are the pod's, with its mark naming Claim.
	// With pod marks the allocator has just proven on the API server that
	// the pod was marked for Claim at the version it knew, and stamped the
	// recycle (a patch guarded by that version, the fence); ResourceVersion
	// is the version that patch made. Without the fence
	// (WithRecycleFence(false), or RecycleNoop) ResourceVersion is the
	// version at which the allocator knows the pod marked for Claim, and
	// the recycler's preconditions are the proof. The pod stays marked for
	// Claim until a release is recorded, after the recycler. A recycler
	// that writes to the pod, or may take long, should use them as
	// preconditions (as RecycleDelete does): another allocator recycling
	// the same pod at once stamps a newer version, and without pod marks
	// nothing else fences it.
	UID             types.UID
	ResourceVersion string
	// Claim is the claim the pod is given back by.
	Claim store.Holder
	// Object is the pod as this round's input listed it, for a recycler
	// that needs its spec or status; it is the caller's object and must
	// not be modified. It may be older than ResourceVersion (a listing
	// that does not show the allocator's own last write of the pod yet),
	// and is nil when the round's input did not show the pod (an Update
	// that left it out). Use UID and ResourceVersion, not Object's, as
	// preconditions.
	Object *corev1.Pod
}

// Recycler makes a pod given back by a claim fit to hand out again: it may
// do nothing, delete the pod, or restart it. It is called once per round for
// each pod being recycled until it reports done; a pod that no longer exists
// counts as recycled without a call. With pod marks it is called only once
// the allocator proved the pod's mark names req.Claim (see RecycleRequest),
// so a recycler that takes no precondition (a restart) is not called for a
// pod handed to another claim. The proof holds at its version only: a
// recycler that acts on the pod takes RecycleRequest.UID and
// ResourceVersion as preconditions, or another allocator may have
// recycled and released the pod before it acts (docs/design.md §7). It
// must be safe for concurrent use. A panic in
// it is an ErrRecycle for that pod.
type Recycler func(ctx context.Context, req RecycleRequest) (done bool, err error)

// RecycleNoop reports every pod recycled at once: pods go straight back to
// the pool.
func RecycleNoop(context.Context, RecycleRequest) (bool, error) { return true, nil }

// RecycleDelete returns a Recycler that deletes the pod, with the request's
// UID (and, when set, resourceVersion) as preconditions; the pod counts as
// recycled once it is gone (the pool then creates a fresh one). A pod that
// changed since is left alone and offered again next round. Its
// preconditions fence it: give WithRecycleFence(false) with it to save
// the fence's pod write per recycled pod.
func RecycleDelete(c client.Client) Recycler {
	return func(ctx context.Context, req RecycleRequest) (bool, error) {
		p := &corev1.Pod{}
		p.Namespace, p.Name = req.Pool.Namespace, req.Pod
		pre := &metav1.Preconditions{}
		if req.UID != "" {
			pre.UID = &req.UID
		}
		if req.ResourceVersion != "" {
			pre.ResourceVersion = &req.ResourceVersion
		}
		err := c.Delete(ctx, p, client.Preconditions(*pre))
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return false, nil // done when the pod has left the listing
		case apierrors.IsConflict(err):
			return false, nil // changed since: looked at again next round
		}
		return false, err
	}
}

// PodReady is the default readiness rule: the pod is Running, its Ready
// condition is True and it is not being deleted.
func PodReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ZoneLabel is the pod label read for a candidate's zone
// (algorithm.Candidate.Zone), for strategies of your own: the built-in ones
// do not look at zones.
const ZoneLabel = corev1.LabelTopologyZone

type config struct {
	// metrics are WithMetrics's collectors, nil without it; metricsReg
	// and metricsCfg what WithMetrics was given.
	metrics    *metrics
	metricsReg prometheus.Registerer
	metricsCfg metricsConfig
	// events records WithEvents's events, nil without it.
	events *eventSink

	client  client.Client
	markKey string
	// stampKey is the annotation a recycle's fence writes (markKey +
	// "-recycling"), "" without pod marks.
	stampKey    string
	marksOff    bool
	markMigrate bool
	store       store.AllocationStore
	syncer      syncer.AllocationSyncer
	keys        *syncer.Keys
	apiReader   client.Reader
	// podReader reads pods live (pod marks): the API reader, else the
	// client.
	podReader client.Reader
	algorithm algorithm.Algorithm
	ready     func(*corev1.Pod) bool
	recycle   Recycler
	// fence is whether each recycle is fenced by a pod write first
	// (WithRecycleFence; fenceSet when it was given).
	fence, fenceSet bool
	// topology is the pools' default layout (WithTopology).
	topology algorithm.Topology
	// markHook is WithMarkHook's, nil without.
	markHook MarkHook
	// nodeLabels reads a node's labels (WithNodeLabels), nil for none.
	nodeLabels  func(node string) map[string]string
	clock       clock.PassiveClock
	writers     int
	quarantine  time.Duration
	replaceLost bool
	claimType   client.Object
	// openSandbox is set by WithOpenSandbox.
	openSandbox bool
	// checks is whether every call ends with the pool's self-check
	// (WithInvariantChecks).
	checks bool
	// claimPool is WithClaimPool's function, nil if not given.
	claimPool func(client.Object) types.NamespacedName
	// nilSet names the options that were given nil where nil is not
	// allowed (WithStore, WithSyncer, WithAPIReader, WithClaimType).
	nilSet []string

	// slimKeys are the keys of the syncer when it is the annotation
	// syncer (see claimMeta), and ourFinalizers is a list of just its
	// finalizer, shared by the claims that carry only that one.
	slimKeys      *syncer.Keys
	ourFinalizers []string
}

// WithInvariantChecks turns on (or off) the pool's self-check at the end of
// every Round and Update: every pod's state is the one its listing, marks
// and the store give it (or one a decision put it in), and every index
// the pool keeps of its pods and claims agrees with the states and with
// the store (docs/design.md, "The pod state"). A pool that fails it fails
// closed: the call returns an error matching ErrInconsistent, and the next
// Round rebuilds the pool from the records and marks.
//
// The check visits every pod and claim of the pool: at 50,000 pods it
// costs about as much as a Round on a full listing (README, Performance),
// many times the cost of an Update. It is on by default in test binaries
// (testing.Testing), off otherwise. The moves between states are checked
// in every call whatever this option says.
func WithInvariantChecks(on bool) Option { return optionFunc(func(c *config) { c.checks = on }) }

// WithStore replaces the in-memory store. The store is the allocator's one
// index of holdings: it records there every hand-out and release once the
// record is written, and reads from there who holds what. It must not be
// shared with another Allocator or written by anything else. A store that
// fails a read makes its pods count as held until it answers (ErrStore).
// It must not be nil.
func WithStore(s store.AllocationStore) Option {
	return optionFunc(func(c *config) { c.store = s; c.checkNil("WithStore", s) })
}

// WithSyncer replaces the annotation syncer. It cannot be combined with
// WithKeys or WithAPIReader, which configure the default syncer. s must keep
// the syncer.AllocationSyncer contract (check it with syncertest on a real
// API server): in particular every successful Write makes a new version of
// the claim. A write that returns the version it replaced is reported as a
// failed write naming the claim, and the pods it releases stay marked
// until a write does.
// s must not be nil.
func WithSyncer(s syncer.AllocationSyncer) Option {
	return optionFunc(func(c *config) { c.syncer = s; c.checkNil("WithSyncer", s) })
}

// WithKeys sets the annotation names and finalizer of the default syncer,
// for example syncer.OpenSandboxKeys(). The default is syncer.DefaultKeys().
func WithKeys(k syncer.Keys) Option { return optionFunc(func(c *config) { c.keys = &k }) }

// WithAPIReader sets the reader the allocator uses to read claims (and,
// with pod marks or WithReplaceLost, pods) live: when a write conflicts or
// its outcome is unknown, when a settled claim is written again (its
// object is not kept, see the package documentation), and where a listing
// may lag. It needs get on claims (and pods). With a manager's cached
// client, pass mgr.GetAPIReader(). The default is the client; r must not be
// nil.
func WithAPIReader(r client.Reader) Option {
	return optionFunc(func(c *config) { c.apiReader = r; c.checkNil("WithAPIReader", r) })
}

// WithAlgorithm replaces the default algorithm, algorithm.Packed.
func WithAlgorithm(a algorithm.Algorithm) Option {
	return optionFunc(func(c *config) { c.algorithm = a })
}

// WithReadiness replaces PodReady, the rule that decides which pods may be
// handed out. A pod being deleted is never ready, whatever the rule says.
// The rule may be called from several goroutines at once (for different
// pools, and for the pods of one pool in its first round): it must only
// read the pod it is given.
func WithReadiness(ready func(*corev1.Pod) bool) Option {
	return optionFunc(func(c *config) { c.ready = ready })
}

// WithTopology sets the pool's topology layout: the one of claims whose
// Placement.Topology.Mode is algorithm.TopologyDefault. The default is
// TopologyAny: pods in the pool's order, wherever they run.
func WithTopology(t algorithm.Topology) Option {
	return optionFunc(func(c *config) { c.topology = t })
}

// WithNodeLabels lets placement read node labels: a topology key that a
// pod's labels lack is looked up in the labels of its node, which
// nodeLabels returns (from your manager's node cache, say; nil for a node
// it does not know). It is called once per node and pod label set, under
// the pool's lock, when a pod of that kind is first listed on the node; a
// change to a node's labels is seen by pods listed after a pod of theirs
// changes (or after a restart). A pod's zone (ZoneLabel) falls back to its
// node's.
func WithNodeLabels(nodeLabels func(node string) map[string]string) Option {
	return optionFunc(func(c *config) { c.nodeLabels = nodeLabels; c.checkNil("WithNodeLabels", nodeLabels) })
}

// WithRecycler sets what happens to pods given back; the default is
// RecycleNoop. With pod marks, each call of r is fenced by a pod write
// first (see RecycleRequest), unless WithRecycleFence(false) says r needs
// none or r is RecycleNoop.
func WithRecycler(r Recycler) Option { return optionFunc(func(c *config) { c.recycle = r }) }

// WithRecycleFence turns the fence before each recycle (pod marks) on or
// off. The fence is a pod write: a patch guarded by the resourceVersion at
// which the allocator knows the pod marked for the claim, which stamps
// the recycle (see RecycleRequest); the recycler is called only if it
// succeeds, so a recycler that takes no precondition never acts on a pod
// handed to another claim meanwhile.
//
// A recycler that writes nothing to the pod, or makes every write to it
// under RecycleRequest.UID and ResourceVersion as preconditions (as
// RecycleDelete does), needs no fence: its own precondition is the proof
// the fence would give, and a pod that changed meanwhile makes it fail
// (RecycleDelete then leaves the pod for the next round). Without the
// fence, ResourceVersion is the version at which the allocator knows the
// pod marked for the claim, and each recycle costs one pod write less.
// Turn it off only for such a recycler.
//
// By default the fence is on, except for RecycleNoop (the default
// recycler, or given to WithRecycler), which writes nothing.
func WithRecycleFence(on bool) Option {
	return optionFunc(func(c *config) { c.fence, c.fenceSet = on, true })
}

// isRecycleNoop reports whether r is RecycleNoop.
func isRecycleNoop(r Recycler) bool {
	return r != nil && reflect.ValueOf(r).Pointer() == reflect.ValueOf(Recycler(RecycleNoop)).Pointer()
}

// WithClock injects the clock, for tests.
func WithClock(clk clock.PassiveClock) Option { return optionFunc(func(c *config) { c.clock = clk }) }

// WithQuarantine sets the quarantine (DefaultQuarantine, 2 minutes, by
// default): how long a claim may be missing from its pool's listings before
// the pods it holds are taken back (recycled and recorded released), and
// how long pods named in a write of unknown outcome, or marked by another
// allocator for a claim whose record does not list them yet, stay out of
// the pool before they are settled. Caches must lag by less than it
// (README, guarantee 7), and it must be longer than the API server's
// request timeout (60 s by default) for a write still in flight to have
// landed or failed when it ends. d must be positive.
func WithQuarantine(d time.Duration) Option { return optionFunc(func(c *config) { c.quarantine = d }) }

// WithWriteConcurrency bounds how many claims are written (and how many pods
// recycled) at once in a round. The default is 16.
func WithWriteConcurrency(n int) Option { return optionFunc(func(c *config) { c.writers = n }) }

// WithReplaceLost makes the allocator replace held pods that were lost: a
// pod that no longer exists is dropped from its claim's record, and a pod
// that is no longer ready is recycled; either way the claim is then offered
// a replacement. By default lost pods stay held and are only reported in
// Result.Lost.
//
// A held pod the listing lacks is read live first (WithAPIReader, else the
// client; it needs get on pods): a lagging listing may lack a pod that is
// still there, and such a pod is neither dropped nor replaced.
func WithReplaceLost(replace bool) Option {
	return optionFunc(func(c *config) { c.replaceLost = replace })
}

// DefaultPodMarkKey is the pod annotation pod marks use by default.
const DefaultPodMarkKey = "poolalloc.io/claim"

// WithPodMarks turns pod marks on (the default) or off; WithPodMarkKey
// sets their annotation.
//
// With pod marks the allocator marks every pod it hands out with its
// claim's name and UID, in an annotation on the pod written with the pod's
// resourceVersion as a lock before the claim's record, and removed only
// after the pod was recycled and its release recorded. It costs one pod
// write per pod handed out and one per pod released, and buys three things
// the claim's record alone cannot give:
//
//   - a pod of a claim force-deleted while no allocator ran is still known
//     to be dirty after a restart, and is recycled;
//   - a record edited to list a pod marked for another claim is not
//     believed, also at recovery;
//   - several allocators running on one pool at once (a failover, a
//     rolling update), also on lagging listings (lagging by less than
//     the quarantine, WithQuarantine), cannot hand one pod to two claims: marks and records
//     are written under resourceVersions, and the allocator compares
//     resourceVersions of pods and claims as numbers, as the API server's
//     etcd revisions allow (see the package documentation). Records name
//     pods, not UIDs: a pod deleted and recreated under a name a record
//     still lists is a new pod, and an allocator that cannot see that
//     record yet may hand it out while the record still names it (README,
//     "Many allocators").
//
// The client given to New must be allowed to patch pods, and the API reader
// (WithAPIReader, else the client) to get pods and claims: the allocator
// reads them live where a listing is older than what it must decide on.
//
// WithPodMarks(false) turns them off: one write per hand-out instead of
// two, at the price of all the above. In particular the pods of a claim
// force-deleted while no allocator ran look free after a restart and may
// be handed out without being recycled (docs/design.md's I6 then holds only for
// claims deleted gracefully).
func WithPodMarks(on bool) Option { return optionFunc(func(c *config) { c.marksOff = !on }) }

// WithPodMarkKey sets the pod annotation of pod marks; "" means
// DefaultPodMarkKey, the default. It must be a valid annotation key, and
// so must the key with "-recycling" appended: the annotation a pod gets
// when a recycle of it begins (see RecycleRequest).
func WithPodMarkKey(key string) Option {
	return optionFunc(func(c *config) {
		if key == "" {
			key = DefaultPodMarkKey
		}
		c.markKey = key
	})
}

// WithOpenSandbox makes the allocator keep records exactly as
// OpenSandbox's Kubernetes controller does, so that an operator can switch
// from that controller to poolalloc and back (see the README, "Switching
// from OpenSandbox"):
//
//   - records use syncer.OpenSandboxKeys() and syncer.WithOpenSandboxFormat:
//     a pod listed more than once is read as one;
//   - released pods stay in the allocated list (alloc-status) and are
//     listed in the released one (alloc-released); neither list is ever
//     sorted or pruned: pods are appended in the order they are handed out
//     or released;
//   - a claim is never handed a pod its record already lists: the format
//     cannot say that a released pod is held again;
//   - the allocation finalizer stays while the claim lives and is listed
//     in its pool, also when it holds nothing, and goes once it is being
//     deleted and all its pods are released;
//   - Claim.Want is OpenSandbox's spec.replicas, a bound over the claim's
//     lifetime: a claim is handed pods until its record lists Want of
//     them, released ones included, and never gives one back because Want
//     went down. It holds max(held, Want − recycling − released) pods
//     once served.
//
// It cannot be combined with WithSyncer or WithKeys; WithAPIReader is
// passed on to the syncer.
func WithOpenSandbox() Option { return optionFunc(func(c *config) { c.openSandbox = true }) }

// WithClaimPool tells the allocator which pool a claim belongs to (for
// example its spec.poolRef in its namespace). A claim that leaves a pool's
// listing but still exists keeps its pods for a quarantine (WithQuarantine),
// since a lagging listing may just not show it; with WithClaimPool, a live
// read that finds it in another pool, or in none, gives its pods back at
// once. poolOf is called only on objects read live from the API server.
// It must not be nil.
func WithClaimPool(poolOf func(claim client.Object) types.NamespacedName) Option {
	return optionFunc(func(c *config) {
		c.checkNil("WithClaimPool", poolOf)
		c.claimPool = poolOf
	})
}

// WithPodMarkMigration makes recovery believe records that list pods
// carrying no mark, and mark them: for the first start with pod marks on
// pools whose allocations were made without them. Without it, such pods
// are not given to the claim that lists them (a record is editable by the
// claim's users; a mark only by the allocator). It also believes a record
// over a pod's mark when the record is newer than the mark and the claim
// the mark names does not hold the pod: poolalloc never writes such a
// record, an OpenSandbox controller run in between does (see
// WithOpenSandbox). "Newer" is judged by the claims' resourceVersions,
// which any change to a claim moves on; a claim the mark names that is
// missing from the pool's listing is read live first, and the record
// wins only if that claim is deleted or its record does not list the pod.
// Turn it off again once every pool has recovered.
func WithPodMarkMigration(migrate bool) Option {
	return optionFunc(func(c *config) { c.markMigrate = migrate })
}

// WithClaimType tells the allocator the Go type (and, for
// *unstructured.Unstructured, the apiVersion and kind) of the claims, by
// example: an empty object of that type. With pod marks the allocator
// reads live a claim that a pod's mark names but the pool's listing does
// not show, to learn whether it still exists; it learns the type from any
// claim listed in any pool, so this is needed only when a pool may be
// listed with no claims at all (after its last claim was force-deleted, for
// example). Without it, such pods wait until a claim of the type has been
// listed. obj must not be nil.
func WithClaimType(obj client.Object) Option {
	return optionFunc(func(c *config) { c.claimType = obj; c.checkNil("WithClaimType", obj) })
}

// checkNil records that option was given v if v is nil, also a typed nil
// pointer in an interface.
func (c *config) checkNil(option string, v any) {
	if v == nil {
		c.nilSet = append(c.nilSet, option)
		return
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Slice, reflect.Chan, reflect.Interface:
		if rv.IsNil() {
			c.nilSet = append(c.nilSet, option)
		}
	}
}

func newConfig(c client.Client, opts []Option) (*config, error) {
	cfg := &config{
		client:     c,
		markKey:    DefaultPodMarkKey,
		algorithm:  algorithm.Packed{},
		ready:      PodReady,
		recycle:    RecycleNoop,
		clock:      clock.RealClock{},
		writers:    16,
		quarantine: DefaultQuarantine,
		checks:     testing.Testing(),
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		o.apply(cfg)
	}
	if len(cfg.nilSet) > 0 {
		return nil, fmt.Errorf("%w: %s(nil)", ErrInvalidOption, strings.Join(cfg.nilSet, "(nil), "))
	}
	switch {
	case cfg.algorithm == nil:
		return nil, fmt.Errorf("%w: nil algorithm", ErrInvalidOption)
	case cfg.ready == nil:
		return nil, fmt.Errorf("%w: nil readiness rule", ErrInvalidOption)
	case cfg.recycle == nil:
		return nil, fmt.Errorf("%w: nil recycler", ErrInvalidOption)
	case cfg.clock == nil:
		return nil, fmt.Errorf("%w: nil clock", ErrInvalidOption)
	case cfg.writers < 1:
		return nil, fmt.Errorf("%w: write concurrency %d, want at least 1", ErrInvalidOption, cfg.writers)
	case cfg.topology.Validate() != nil:
		return nil, fmt.Errorf("%w: WithTopology: %w", ErrInvalidOption, cfg.topology.Validate())
	case cfg.quarantine <= 0:
		return nil, fmt.Errorf("%w: quarantine %s, want more than 0", ErrInvalidOption, cfg.quarantine)
	}
	if cfg.claimType != nil {
		if u, ok := cfg.claimType.(interface{ IsList() bool }); ok && u.IsList() {
			return nil, fmt.Errorf("%w: WithClaimType: %T is a list", ErrInvalidOption, cfg.claimType)
		}
		if _, ok := cfg.claimType.(*unstructured.Unstructured); ok && cfg.claimType.GetObjectKind().GroupVersionKind().Empty() {
			return nil, fmt.Errorf("%w: WithClaimType: an unstructured object needs its apiVersion and kind", ErrInvalidOption)
		}
	}
	if !cfg.fenceSet {
		cfg.fence = !isRecycleNoop(cfg.recycle)
	}
	if cfg.marksOff {
		cfg.markKey = ""
	}
	if cfg.markMigrate && cfg.markKey == "" {
		return nil, fmt.Errorf("%w: WithPodMarkMigration with WithPodMarks(false)", ErrInvalidOption)
	}
	if cfg.markHook != nil && cfg.markKey == "" {
		return nil, fmt.Errorf("%w: WithMarkHook with WithPodMarks(false): the hook's change rides the pod's mark", ErrInvalidOption)
	}
	if cfg.markKey != "" {
		if c == nil {
			return nil, fmt.Errorf("%w: pod marks need a client (or WithPodMarks(false))", ErrInvalidOption)
		}
		if errs := content.IsLabelKey(cfg.markKey); len(errs) > 0 {
			return nil, fmt.Errorf("%w: pod mark key %q: %s", ErrInvalidOption, cfg.markKey, strings.Join(errs, "; "))
		}
		cfg.stampKey = cfg.markKey + "-recycling"
		if errs := content.IsLabelKey(cfg.stampKey); len(errs) > 0 {
			return nil, fmt.Errorf("%w: pod mark key %q leaves no room for its recycling stamp %q: %s", ErrInvalidOption, cfg.markKey, cfg.stampKey, strings.Join(errs, "; "))
		}
	}
	if cfg.openSandbox && (cfg.syncer != nil || cfg.keys != nil) {
		return nil, fmt.Errorf("%w: WithOpenSandbox sets the syncer and its keys and cannot be combined with WithSyncer or WithKeys", ErrInvalidOption)
	}
	if cfg.syncer != nil && (cfg.keys != nil || cfg.apiReader != nil) {
		return nil, fmt.Errorf("%w: WithKeys and WithAPIReader configure the default syncer and cannot be combined with WithSyncer", ErrInvalidOption)
	}
	if cfg.syncer == nil {
		if c == nil {
			return nil, fmt.Errorf("%w: nil client and no syncer", ErrInvalidOption)
		}
		keys := syncer.DefaultKeys()
		if cfg.keys != nil {
			keys = *cfg.keys
		}
		var sopts []syncer.Option
		if cfg.apiReader != nil {
			sopts = append(sopts, syncer.WithAPIReader(cfg.apiReader))
		}
		if cfg.openSandbox {
			keys = syncer.OpenSandboxKeys()
			sopts = append(sopts, syncer.WithOpenSandboxFormat())
		}
		s, err := syncer.NewAnnotationSyncer(c, keys, sopts...)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		cfg.syncer = s
	}
	if s, ok := cfg.syncer.(*syncer.AnnotationSyncer); ok {
		keys := s.Keys()
		cfg.slimKeys = &keys
		cfg.ourFinalizers = []string{keys.Finalizer}
	}
	if cfg.store == nil {
		cfg.store = store.NewInMemory()
	}
	cfg.podReader = cfg.apiReader
	if cfg.podReader == nil && c != nil {
		cfg.podReader = c
	}
	if cfg.metricsReg != nil {
		m, err := newMetrics(cfg.metricsReg, cfg.metricsCfg)
		if err != nil {
			return nil, err
		}
		cfg.metrics = m
	}
	return cfg, nil
}
