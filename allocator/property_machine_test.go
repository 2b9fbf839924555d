package allocator_test

// The model-based property test of the allocator, shared by the run on
// controller-runtime's fake client (property_fake_test.go) and the run on a
// real API server (property_envtest_test.go).
//
// One history is one world: three pools (p1 and p2 in one namespace, p1
// again in a second namespace), their pods and claims, one allocator (a new
// instance after each simulated crash), a controllable recycler and a fake
// clock. rapid draws a sequence of actions; after each one the "" action
// compares the allocator's store and the records on the API server with
// internal/model, which also checks every record write and recycler answer
// as it happens (the allocator's client is wrapped by an interceptor that
// reports them, and injects faults).
//
// Bugs it found, each fixed in the allocator: a pod recycled only once, a
// want change masked by a write on a live read, resourceVersions forgotten
// after four, a landed write of unknown outcome overwritten, reservations
// settled all-or-nothing per claim, a pod written as both allocated and
// released, a landed release of unknown outcome taken for tampering, pod
// marks left behind, reserved pods written back although unready or beyond
// the claim's want, and (without pod marks) orphans lost by a restart, now
// the documented limit of WithPodMarks(false) that the machine steers around.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/allocator/follow"
	"github.com/poolalloc/poolalloc/internal/model"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/store"
	"github.com/poolalloc/poolalloc/syncer"
)

// propertyStats counts what all histories of a test did.
type propertyStats struct {
	histories, steps, rounds, faults, restarts, stale, concurrent, writes, handouts atomic.Int64
}

func (s *propertyStats) String() string {
	return fmt.Sprintf("%d histories, %d steps, %d rounds (%d stale, %d concurrent pairs), %d record writes, %d pods handed out, %d injected faults, %d restarts",
		s.histories.Load(), s.steps.Load(), s.rounds.Load(), s.stale.Load(), s.concurrent.Load(),
		s.writes.Load(), s.handouts.Load(), s.faults.Load(), s.restarts.Load())
}

var (
	budgetOnce                    sync.Once
	explicitChecks, explicitSteps bool
)

// propertyBudget sets rapid's number of histories to checks unless
// -rapid.checks (or RAPID_CHECKS) was given, and returns the minimum number
// of steps of a history: steps, or -rapid.steps when given; halved with
// -short (rapid itself divides the checks by 5 then). Histories are built
// from t.Repeat runs of about a fifth of that each, repeated until the
// minimum is reached. The flags are restored when the test ends.
func propertyBudget(t *testing.T, checks, steps int) int {
	budgetOnce.Do(func() {
		flag.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "rapid.checks":
				explicitChecks = true
			case "rapid.steps":
				explicitSteps = true
			}
		})
		_, env := os.LookupEnv("RAPID_CHECKS")
		explicitChecks = explicitChecks || env
		_, env = os.LookupEnv("RAPID_STEPS")
		explicitSteps = explicitSteps || env
	})
	checksFlag, stepsFlag := flag.Lookup("rapid.checks"), flag.Lookup("rapid.steps")
	oldChecks, oldSteps := checksFlag.Value.String(), stepsFlag.Value.String()
	t.Cleanup(func() {
		_ = checksFlag.Value.Set(oldChecks)
		_ = stepsFlag.Value.Set(oldSteps)
	})
	if !explicitChecks {
		_ = checksFlag.Value.Set(strconv.Itoa(checks))
	}
	if explicitSteps {
		steps, _ = strconv.Atoi(oldSteps)
	}
	if testing.Short() {
		steps /= 2
	}
	_ = stepsFlag.Value.Set(strconv.Itoa(max(4, steps/5)))
	return steps
}

// backend gives each history a fresh API server view.
type backend struct {
	// raw is the client the test uses for its own changes and listings;
	// base is wrapped by the fault-injecting interceptor for the
	// allocator. Both see the same server.
	raw  client.Client
	base client.WithWatch
	// namespaces returns two fresh namespaces and a cleanup.
	namespaces func(ctx context.Context, id int) ([2]string, func(), error)
	// fakeUIDs is set when the server assigns no UIDs.
	fakeUIDs bool
}

// faultKind is a write fault of the interceptor.
type faultKind int

const (
	// faultBefore fails the write without sending it.
	faultBefore faultKind = iota + 1
	// faultAfter sends the write, then reports an error of unknown outcome.
	faultAfter
	// faultConflict reports a Conflict without sending the write.
	faultConflict
	// faultOwnerEdit scales the claim on the server just before the write,
	// so that the write really conflicts.
	faultOwnerEdit
)

type patchFault struct {
	kind faultKind
	err  error
	// failGet (faultAfter) also fails the allocator's next read of the
	// claim, so that it cannot tell whether the write landed.
	failGet bool
	// want is the owner's new spec.replicas (faultOwnerEdit).
	want int32
}

// event is one thing the model must hear of, in the order it happened.
type event struct {
	write   *model.Record
	gone    bool // the write made the claim go away
	errOut  bool // the write landed, then an error was reported
	recycle model.Key
	done    bool
	scale   types.UID // owner edit during a write
	want    int
}

// machine is the state of one history.
type machine struct {
	t     *rapid.T
	ctx   context.Context
	b     *backend
	c     client.Client // the allocator's client, with faults
	ns    [2]string
	pools []types.NamespacedName
	stats *propertyStats
	ids   int
	close func()
	steps int

	clock *clocktesting.FakeClock
	opts  []allocator.Option
	marks bool // WithPodMarks
	// hook is set when the allocator has WithMarkHook(routeHook).
	hook bool
	// sorted runs the allocator on store.Sorted instead of the default
	// store.InMemory.
	sorted bool
	a      allocator.Allocator

	// mu guards the fields below it, written by the interceptor and the
	// recycler from the allocator's goroutines.
	mu     sync.Mutex
	events []event
	// patches and getFails are one-shot faults per claim, so that which
	// write fails does not depend on the order of concurrent writes.
	patches   map[types.NamespacedName]patchFault
	getFails  map[types.NamespacedName]int
	recAuto   bool
	recFinish map[model.Key]bool
	recFail   map[model.Key]bool

	m *model.Model
	// Per allocator instance.
	recovered map[types.NamespacedName]bool
	// pending marks pools with a write that landed but was reported
	// failed, and whose outcome the allocator may not have settled yet:
	// their store may lag the records (I4). unsettled marks pools where a
	// fault may have left pods quarantined. Both hold the time of the
	// fault; a fresh round without faults a quarantine later clears them.
	pending   map[types.NamespacedName]time.Time
	unsettled map[types.NamespacedName]time.Time
	prevStore model.Stores
	replays   []allocator.Input
	// lastWritten is the newest resourceVersion the allocator wrote per
	// claim; best the newest it was given in a listing, with its want.
	lastWritten map[types.UID]uint64
	bestRV      map[types.UID]uint64
	bestWant    map[types.UID]int

	podSeq    map[types.NamespacedName]int
	printedRV map[types.UID]string
	claims    []types.UID // in creation order
	kinds     map[types.UID]bool
	// place is each claim's placement as created (issue 23): checked
	// after every step (checkPlacement) and round (checkHandOuts).
	place map[types.UID]testenv.ClaimSpec

	// The event-driven path (property_follow_test.go), per allocator
	// instance: its Follower, the listing its last full Sync took, and
	// per pool the listing events were last made from.
	f            *follow.Follower
	followListed *allocator.Input
	delivered    map[types.NamespacedName]*allocator.Input
}

var claimGK = schema.GroupKind{Group: testenv.Group, Kind: "Claim"}

const keepFinalizer = "test.poolalloc.io/keep"
const podHoldFinalizer = "test.poolalloc.io/hold"

func newMachine(t *rapid.T, b *backend, stats *propertyStats, id int) *machine {
	ctx := context.Background()
	ns, cleanup, err := b.namespaces(ctx, id)
	if err != nil {
		t.Fatalf("namespaces: %v", err)
	}
	m := &machine{
		t: t, ctx: ctx, b: b, ns: ns, close: cleanup, stats: stats,
		clock:     clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		getFails:  make(map[types.NamespacedName]int),
		patches:   make(map[types.NamespacedName]patchFault),
		recFinish: make(map[model.Key]bool),
		recFail:   make(map[model.Key]bool),
		m:         model.New(),
		podSeq:    make(map[types.NamespacedName]int),
		printedRV: make(map[types.UID]string),
		kinds:     make(map[types.UID]bool),
		place:     make(map[types.UID]testenv.ClaimSpec),
	}
	m.pools = []types.NamespacedName{
		{Namespace: ns[0], Name: "p1"}, {Namespace: ns[0], Name: "p2"}, {Namespace: ns[1], Name: "p1"},
	}
	m.c = interceptor.NewClient(b.base, interceptor.Funcs{Patch: m.interceptPatch, Get: m.interceptGet})
	m.opts = []allocator.Option{
		allocator.WithClock(m.clock),
		allocator.WithRecycler(m.recycle),
		allocator.WithWriteConcurrency(rapid.IntRange(1, 4).Draw(t, "writers")),
	}
	if m.marks = rapid.Bool().Draw(t, "pod marks"); !m.marks {
		m.opts = append(m.opts, allocator.WithPodMarks(false))
	}
	m.sorted = rapid.Bool().Draw(t, "sorted store")
	m.recAuto = rapid.IntRange(0, 3).Draw(t, "recycler finishes everything unless 0") > 0
	if m.marks && rapid.Bool().Draw(t, "mark hook") {
		m.hook = true
		m.opts = append(m.opts, allocator.WithMarkHook(routeHook))
	}
	if m.marks && rapid.Bool().Draw(t, "no recycle fence") {
		// The machine's recycler writes nothing to the pod.
		m.opts = append(m.opts, allocator.WithRecycleFence(false))
	}
	m.newAllocator()
	for _, pool := range m.pools {
		for range rapid.IntRange(2, 6).Draw(t, "pods "+pool.String()) {
			m.addPod(pool, true)
		}
	}
	for range rapid.IntRange(0, 3).Draw(t, "initial claims") {
		m.createClaim(t)
	}
	return m
}

func (m *machine) fatalf(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf(format, args...)
}

func (m *machine) must(err error, what string) {
	m.t.Helper()
	if err != nil {
		m.fatalf("%s: %v", what, err)
	}
}

func (m *machine) newAllocator() {
	opts := m.opts
	if m.sorted {
		// The second, independent store implementation; each allocator
		// instance starts with an empty one, as after a restart.
		opts = append(slices.Clone(opts), allocator.WithStore(store.NewSorted()))
	}
	a, err := allocator.New(m.c, opts...)
	m.must(err, "allocator.New")
	m.a = a
	m.recovered = make(map[types.NamespacedName]bool)
	m.pending = make(map[types.NamespacedName]time.Time)
	m.unsettled = make(map[types.NamespacedName]time.Time)
	m.prevStore = nil
	m.replays = nil
	m.lastWritten = make(map[types.UID]uint64)
	m.bestRV = make(map[types.UID]uint64)
	m.bestWant = make(map[types.UID]int)
	m.newFollower()
}

// ---- interceptor and recycler (called from the allocator's goroutines) ----

func isClaim(obj client.Object) bool {
	switch o := obj.(type) {
	case *testenv.Claim:
		return true
	case *unstructured.Unstructured:
		return o.GroupVersionKind().GroupKind() == claimGK
	}
	return false
}

func (m *machine) interceptPatch(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if !isClaim(obj) {
		return c.Patch(ctx, obj, patch, opts...)
	}
	key := client.ObjectKeyFromObject(obj)
	m.mu.Lock()
	f, ok := m.patches[key]
	if ok {
		delete(m.patches, key)
		m.stats.faults.Add(1)
	}
	m.mu.Unlock()
	switch f.kind {
	case faultBefore:
		return f.err
	case faultConflict:
		return apierrors.NewConflict(schema.GroupResource{Group: testenv.Group, Resource: "claims"}, key.Name, errors.New("injected conflict"))
	case faultOwnerEdit:
		var cl testenv.Claim
		if err := m.b.raw.Get(ctx, key, &cl); err == nil {
			cl.Spec.Replicas = f.want
			if err := m.b.raw.Update(ctx, &cl); err == nil {
				m.addEvent(event{scale: cl.UID, want: int(f.want)})
			}
		}
	}
	err := c.Patch(ctx, obj, patch, opts...)
	if err != nil {
		return err
	}
	rec, derr := model.Decode(obj)
	if derr != nil {
		return derr
	}
	gone := obj.GetDeletionTimestamp() != nil && len(obj.GetFinalizers()) == 0
	m.addEvent(event{write: &rec, gone: gone, errOut: f.kind == faultAfter})
	if f.kind == faultAfter {
		if f.failGet {
			m.mu.Lock()
			m.getFails[key]++
			m.mu.Unlock()
		}
		return f.err
	}
	return nil
}

func (m *machine) interceptGet(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if isClaim(obj) {
		m.mu.Lock()
		fail := m.getFails[key] > 0
		if fail {
			m.getFails[key]--
			m.stats.faults.Add(1)
		}
		m.mu.Unlock()
		if fail {
			return apierrors.NewTimeoutError("injected read timeout", 1)
		}
	}
	return c.Get(ctx, key, obj, opts...)
}

func (m *machine) addEvent(e event) {
	m.mu.Lock()
	m.events = append(m.events, e)
	m.mu.Unlock()
}

func (m *machine) recycle(_ context.Context, req allocator.RecycleRequest) (bool, error) {
	pool, pod := req.Pool, req.Pod
	key := model.Key{Namespace: pool.Namespace, Name: pod}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.recFail[key] {
		delete(m.recFail, key)
		m.events = append(m.events, event{recycle: key})
		return false, errors.New("injected recycle failure")
	}
	done := m.recAuto || m.recFinish[key]
	m.events = append(m.events, event{recycle: key, done: done})
	return done, nil
}

// drain feeds the events since the last drain to the model. It returns the
// pools with a write that landed but was reported failed.
func (m *machine) drain() map[types.NamespacedName]bool {
	m.mu.Lock()
	evs := m.events
	m.events = nil
	m.mu.Unlock()
	errOut := make(map[types.NamespacedName]bool)
	var errs []error
	for _, e := range evs {
		switch {
		case e.write != nil:
			if e.errOut {
				errOut[e.write.Pool] = true
			}
			if rv, err := strconv.ParseUint(e.write.RV, 10, 64); err == nil && rv > m.lastWritten[e.write.UID] {
				m.lastWritten[e.write.UID] = rv
			}
			m.stats.writes.Add(1)
			if c := m.m.Claims[e.write.UID]; c != nil {
				for _, p := range e.write.Held {
					if !c.Held[p] {
						m.stats.handouts.Add(1)
					}
				}
			}
			if err := m.m.Write(*e.write, e.gone); err != nil {
				errs = append(errs, fmt.Errorf("write of claim %s: %w", e.write.Name, err))
			}
		case e.scale != "":
			m.m.Scale(e.scale, e.want)
		default:
			m.m.Recycle(e.recycle, e.done)
			if e.done {
				m.mu.Lock()
				delete(m.recFinish, e.recycle)
				m.mu.Unlock()
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		m.fatalf("%v", err)
	}
	return errOut
}

// ---- world helpers ----

func (m *machine) addPod(pool types.NamespacedName, ready bool) {
	i := m.podSeq[pool]
	m.podSeq[pool]++
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pool.Namespace,
			Name:      pool.Name + "-" + strconv.Itoa(i),
			Labels:    map[string]string{testenv.PoolLabel: pool.Name, "size": podSize(i)},
		},
		Spec: corev1.PodSpec{
			NodeName:   "node-" + strconv.Itoa(i%3),
			Containers: []corev1.Container{{Name: "main", Image: testenv.PodImage}},
		},
	}
	m.must(m.b.raw.Create(m.ctx, pod), "create pod")
	if ready {
		m.must(testenv.SetPodReady(m.ctx, m.b.raw, pod, true), "set pod ready")
	}
	m.m.AddPod(model.Key{Namespace: pool.Namespace, Name: pod.Name}, pool, ready)
}

// existingPods returns the pods of the model that exist, sorted.
func (m *machine) existingPods() []model.Key {
	var out []model.Key
	for k, p := range m.m.Pods {
		if p.Exists {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, cmpKey)
	return out
}

func cmpKey(a, b model.Key) int { return strings.Compare(a.String(), b.String()) }

// liveClaims returns the claims that exist, in creation order.
func (m *machine) liveClaims() []types.UID {
	var out []types.UID
	for _, uid := range m.claims {
		if c := m.m.Claims[uid]; c != nil && !c.Gone {
			out = append(out, uid)
		}
	}
	return out
}

func (m *machine) getClaim(uid types.UID) (*testenv.Claim, bool) {
	c := m.m.Claims[uid]
	var cl testenv.Claim
	err := m.b.raw.Get(m.ctx, c.Name, &cl)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	m.must(err, "get claim")
	return &cl, true
}

func (m *machine) list(pool types.NamespacedName) allocator.Input {
	var in allocator.Input
	var err error
	if rapid.Bool().Draw(m.t, "unstructured listing") {
		in, err = world.UnstructuredInput(m.ctx, m.b.raw, pool)
	} else {
		in, err = world.Input(m.ctx, m.b.raw, pool)
	}
	m.must(err, "list pool")
	return in
}

func (m *machine) snapshot(pool types.NamespacedName) map[string]store.Holder {
	s, err := m.a.Store().Snapshot(pool)
	m.must(err, "store snapshot")
	return s
}

// preHolders returns who holds each pod now, in the store or the records.
func (m *machine) preHolders() map[model.Key]types.UID {
	pre := m.m.Holders()
	for _, pool := range m.pools {
		for pod, h := range m.snapshot(pool) {
			pre[model.Key{Namespace: pool.Namespace, Name: pod}] = h.UID
		}
	}
	return pre
}

// round runs one round and checks what a single round must keep. fresh
// says in was listed just now with nothing changed since; faulty that
// faults were armed for it.
func (m *machine) round(in allocator.Input, fresh, faulty bool) (allocator.Result, error) {
	pre := m.preHolders()
	newest := m.newest()
	res, err := m.a.Round(m.ctx, in)
	m.stats.rounds.Add(1)
	errOut := m.drain()
	m.afterRound(in, res, err, fresh, faulty, pre, nil, errOut, newest)
	return res, err
}

// newest returns, per claim, the newest resourceVersion the allocator wrote
// or was given in a listing.
func (m *machine) newest() map[types.UID]uint64 {
	out := make(map[types.UID]uint64, len(m.bestRV))
	for uid, rv := range m.bestRV {
		out[uid] = rv
	}
	for uid, rv := range m.lastWritten {
		out[uid] = max(out[uid], rv)
	}
	return out
}

func rvOf(o client.Object) uint64 {
	rv, _ := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
	return rv
}

func (m *machine) afterRound(in allocator.Input, res allocator.Result, err error, fresh, faulty bool,
	pre map[model.Key]types.UID, freed map[model.Key]bool, errOut map[types.NamespacedName]bool, known map[types.UID]uint64) {
	m.t.Helper()
	for _, bad := range []error{allocator.ErrPoolBlocked, allocator.ErrPlan, allocator.ErrInvalidInput,
		store.ErrPodHeld, store.ErrNotHeld, store.ErrInvalidArgument} {
		if errors.Is(err, bad) {
			m.fatalf("round on %s: unexpected error: %v", in.Pool, err)
		}
	}
	// A replayed listing may show a claim the allocator forgot (gone, or
	// holding nothing) with an old record: refusing to trust it is right.
	if fresh && errors.Is(errors.Join(res.Warnings...), allocator.ErrUntrustedRecord) {
		m.fatalf("round on %s: unexpected warning on a current listing: %v", in.Pool, errors.Join(res.Warnings...))
	}
	// Warnings are never errors of the round, and match a sentinel.
	for _, sentinel := range []error{allocator.ErrUntrustedRecord, allocator.ErrInvalidRelease} {
		if errors.Is(err, sentinel) {
			m.fatalf("round on %s: %v returned as an error, not a warning: %v", in.Pool, sentinel, err)
		}
	}
	for _, w := range res.Warnings {
		if !errors.Is(w, allocator.ErrUntrustedRecord) && !errors.Is(w, allocator.ErrInvalidRelease) && !errors.Is(w, allocator.ErrWrite) {
			m.fatalf("round on %s: warning matching no sentinel: %v", in.Pool, w)
		}
	}
	// Nothing writes between a current listing and its round: a write that
	// fails there, without an injected fault, is a bug (e.g. a write
	// taken for failed although it landed). One may fail as documented: a
	// claim known only from a mark, with no claim of its type listed yet.
	if fresh && !faulty && errors.Is(err, allocator.ErrWrite) && !errors.Is(err, allocator.ErrNoProto) {
		m.fatalf("round on %s: a write failed on a current listing without a fault: %v", in.Pool, err)
	}
	if err == nil || !errors.Is(err, allocator.ErrPoolBlocked) {
		m.recovered[in.Pool] = true
	}
	now := m.clock.Now()
	if errOut[in.Pool] {
		m.pending[in.Pool] = now
	}
	if faulty {
		m.unsettled[in.Pool] = now
	}
	if fresh && !faulty {
		for _, marks := range []map[types.NamespacedName]time.Time{m.pending, m.unsettled} {
			if at, ok := marks[in.Pool]; ok && !now.Before(at.Add(allocator.DefaultQuarantine)) {
				delete(marks, in.Pool)
			}
		}
	}
	post := m.snapshot(in.Pool)
	var errs []error
	errs = append(errs, model.CheckAllocated(in, res, pre, freed, m.m))
	if fresh {
		errs = append(errs, model.CheckBounded(in, res, post, m.m))
		// Pods reserved by a write of unknown outcome count against their
		// claim's demand (96dda56) and are not in the shortfall, but are
		// in no store: while a pool may have such reservations, the
		// shortfall is not compared.
		if _, reserved := m.unsettled[in.Pool]; !faulty && !reserved && !errors.Is(err, allocator.ErrWrite) {
			errs = append(errs, model.CheckShortfall(in, res, post))
			errs = append(errs, m.checkHandOuts(in, res, pre, post))
		}
	}
	// I7: a claim listed older than a version the allocator already
	// wrote or was given must not get pods beyond the newest want.
	got := make(map[types.UID]bool)
	for _, g := range res.Allocated {
		got[g.UID] = true
	}
	recycling := make(map[string]bool)
	for _, p := range res.Recycling {
		recycling[p] = true
	}
	for _, c := range in.Claims {
		uid, rv := c.Object.GetUID(), rvOf(c.Object)
		newest := known[uid]
		if got[uid] && rv < newest {
			n := 0
			for pod, h := range post {
				if h.UID == uid && !recycling[pod] {
					n++
				}
			}
			if n > m.bestWant[uid] {
				errs = append(errs, fmt.Errorf("I7: pool %s: claim %s listed at rv %d (allocator knows rv %d, want %d) now holds %d unreleased pods",
					in.Pool, c.Object.GetName(), rv, newest, m.bestWant[uid], n))
			}
		}
		if _, seen := m.bestRV[uid]; !seen || rv >= m.bestRV[uid] {
			m.bestRV[uid], m.bestWant[uid] = rv, c.Want
		}
	}
	if e := errors.Join(errs...); e != nil {
		m.fatalf("after round on %s (fresh=%t faulty=%t, err=%v): %v", in.Pool, fresh, faulty, err, e)
	}
	if len(m.replays) == 8 {
		m.replays = m.replays[1:]
	}
	m.replays = append(m.replays, in)
}

// check is the "" action: the invariants that hold after every step.
func (m *machine) check(t *rapid.T) {
	m.t = t
	t.Helper()
	recs, err := model.ReadRecords(m.ctx, m.b.raw, m.ns[:]...)
	m.must(err, "read records")
	m.must(m.m.Reconcile(recs, m.ns[:]...), "records vs model")
	stores := make(model.Stores, len(m.pools))
	for _, pool := range m.pools {
		stores[pool] = m.snapshot(pool)
	}
	errs := []error{
		allocator.CheckInvariants(m.a),
		m.checkSelectors(recs),
		m.checkHookLabels(),
		model.CheckExclusive(stores, m.m),
		model.CheckIsolated(stores, m.m),
		model.CheckFinalizers(m.m),
	}
	for _, pool := range m.pools {
		if _, pending := m.pending[pool]; m.recovered[pool] {
			err := model.CheckDurable(pool, stores[pool], m.m)
			if err == nil {
				delete(m.pending, pool) // nothing landed is left unsettled
			} else if !pending {
				errs = append(errs, err)
			}
		}
		if m.prevStore != nil {
			errs = append(errs, model.CheckFreed(pool, m.prevStore[pool], stores[pool], m.m))
		}
	}
	m.must(errors.Join(errs...), "invariants")
	m.prevStore = stores
	for _, uid := range slices.Sorted(maps.Keys(recs)) {
		r := recs[uid]
		if m.printedRV[uid] == r.RV {
			continue
		}
		m.printedRV[uid] = r.RV
		t.Logf("  record %s rv %s want %d terminating %t finalizers %d(ours %t): held %v released %v release %v",
			r.Name, r.RV, r.Want, r.Terminating, r.Finalizers, r.Finalizer, r.Held, r.Released, r.Release)
	}
}

// ---- actions ----

func (m *machine) actions() map[string]func(*rapid.T) {
	// Weights: rounds, claim changes and faults are the point. rapid
	// picks map actions with a bias toward the first keys, so the machine
	// draws its own, uniformly, from this table; the first entry is what
	// shrinking tends to.
	var table []string
	fs := make(map[string]func(*rapid.T))
	for _, a := range []struct {
		name   string
		weight int
		f      func(*rapid.T)
	}{
		{"round", 5, m.freshRound},
		{"createClaim", 3, m.createClaim},
		{"scaleClaim", 3, m.scaleClaim},
		{"ownerRelease", 2, m.ownerRelease},
		{"recyclerFinish", 2, m.recyclerFinish},
		{"recyclerFail", 1, m.recyclerFail},
		{"recyclerAuto", 1, m.recyclerAuto},
		{"podReadiness", 2, m.podReadiness},
		{"deletePod", 1, m.deletePod},
		{"addPods", 2, m.addPods},
		{"deleteClaim", 1, m.deleteClaim},
		{"forceDeleteClaim", 1, m.forceDeleteClaim},
		{"staleRound", 2, m.staleRound},
		{"writeFailBefore", 1, m.writeFailBefore},
		{"writeFailAfter", 2, m.writeFailAfter},
		{"conflict", 2, m.conflict},
		{"readFail", 1, m.readFail},
		{"restart", 1, m.restart},
		{"concurrentRounds", 2, m.concurrentRounds},
		{"advanceClock", 2, m.advanceClock},
		{"followEvents", 3, m.followEvents},
		{"followSync", 3, m.followSync},
		{"followRelist", 1, m.followRelist},
	} {
		fs[a.name] = a.f
		for range a.weight {
			table = append(table, a.name)
		}
	}
	return map[string]func(*rapid.T){
		"": m.check,
		"step": func(t *rapid.T) {
			m.t = t
			bits := rapid.SliceOfN(rapid.Bool(), 6, 6).Draw(t, "action bits")
			i := 0
			for _, b := range bits {
				i <<= 1
				if b {
					i |= 1
				}
			}
			name := table[i%len(table)]
			t.Logf("> %s", name)
			fs[name](t)
			m.steps++
			m.stats.steps.Add(1)
		},
	}
}

func (m *machine) pickPool(t *rapid.T) types.NamespacedName {
	return rapid.SampledFrom(m.pools).Draw(t, "pool")
}

func (m *machine) pickClaim(t *rapid.T) types.UID {
	live := m.liveClaims()
	if len(live) == 0 {
		t.Skip("no claim")
	}
	return rapid.SampledFrom(live).Draw(t, "claim")
}

func (m *machine) createClaim(t *rapid.T) {
	if len(m.liveClaims()) >= 10 {
		t.Skip("enough claims")
	}
	pool := m.pickPool(t)
	want := rapid.IntRange(0, 4).Draw(t, "replicas")
	prio := rapid.IntRange(0, 2).Draw(t, "priority")
	typed := rapid.Bool().Draw(t, "typed")
	keep := rapid.Bool().Draw(t, "keepFinalizer")
	m.ids++
	name := "c" + strconv.Itoa(m.ids)
	uid := types.UID("")
	if m.b.fakeUIDs {
		uid = types.UID(fmt.Sprintf("uid-%d", m.ids))
	}
	place := drawPlacement(t)
	var obj client.Object
	if typed {
		cl := testenv.NewClaim(pool.Namespace, name, pool.Name, int32(want))
		cl.Spec.Priority = int32(prio)
		cl.Spec.Selector, cl.Spec.Class, cl.Spec.Topology, cl.Spec.Gang = place.Selector, place.Class, place.Topology, place.Gang
		obj = cl
	} else {
		u := testenv.NewUnstructuredClaim(pool.Namespace, name, pool.Name, int64(want))
		spec := u.Object["spec"].(map[string]any)
		spec["priority"] = int64(prio)
		extra, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&place)
		m.must(err, "placement as unstructured")
		for k, v := range extra {
			if k != "poolRef" && k != "replicas" {
				spec[k] = v
			}
		}
		obj = u
	}
	obj.SetUID(uid)
	if keep {
		obj.SetFinalizers([]string{keepFinalizer})
	}
	m.must(m.b.raw.Create(m.ctx, obj), "create claim")
	uid = obj.GetUID()
	m.m.AddClaim(uid, client.ObjectKeyFromObject(obj), pool, want)
	m.claims = append(m.claims, uid)
	m.place[uid] = place
	t.Logf("create claim %s/%s uid %s pool %s want %d typed %t keep %t placement %s", pool.Namespace, name, uid, pool.Name, want, typed, keep, placementString(place))
}

func (m *machine) scaleClaim(t *rapid.T) {
	uid := m.pickClaim(t)
	want := rapid.IntRange(0, 4).Draw(t, "replicas")
	cl, ok := m.getClaim(uid)
	if !ok {
		t.Skip("claim gone")
	}
	cl.Spec.Replicas = int32(want)
	m.must(m.b.raw.Update(m.ctx, cl), "scale claim")
	m.m.Scale(uid, want)
	t.Logf("scale %s to %d", cl.Name, want)
}

func (m *machine) ownerRelease(t *rapid.T) {
	uid := m.pickClaim(t)
	c := m.m.Claims[uid]
	var cands []string
	other := ""
	for _, k := range slices.SortedFunc(maps.Keys(m.m.Pods), cmpKey) {
		switch p := m.m.Pods[k]; {
		case k.Namespace != c.Name.Namespace:
		case p.Pool == c.Pool:
			cands = append(cands, k.Name)
		case other == "":
			other = k.Name // one pod of another pool
			cands = append(cands, other)
		}
	}
	// In a fixed order, so that a kept history replays draw for draw.
	for _, p := range slices.Sorted(maps.Keys(c.Held)) {
		cands = append(cands, p, p) // favour the pods it holds
	}
	var pods []string
	if len(cands) > 0 {
		pods = rapid.SliceOfNDistinct(rapid.SampledFrom(cands), 0, 3, rapid.ID[string]).Draw(t, "release")
	}
	slices.Sort(pods)
	cl, ok := m.getClaim(uid)
	if !ok {
		t.Skip("claim gone")
	}
	ann := cl.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	key := syncer.DefaultKeys().Release
	if len(pods) == 0 {
		delete(ann, key)
	} else {
		v, err := syncer.EncodePods(pods)
		m.must(err, "encode release")
		ann[key] = v
	}
	cl.SetAnnotations(ann)
	m.must(m.b.raw.Update(m.ctx, cl), "owner release")
	t.Logf("owner of %s releases %v (holds %v)", cl.Name, pods, heldNames(c))
}

func heldNames(c *model.Claim) []string {
	out := make([]string, 0, len(c.Held))
	for p := range c.Held {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// dirtyPods returns the pods handed out and not clean, sorted.
func (m *machine) dirtyPods() []model.Key {
	var out []model.Key
	for k := range m.m.Dirty {
		out = append(out, k)
	}
	slices.SortFunc(out, cmpKey)
	return out
}

func (m *machine) recyclerFinish(t *rapid.T) {
	dirty := m.dirtyPods()
	if len(dirty) == 0 {
		t.Skip("nothing to recycle")
	}
	pods := rapid.SliceOfNDistinct(rapid.SampledFrom(dirty), 1, -1, func(k model.Key) string { return k.String() }).Draw(t, "finish")
	m.mu.Lock()
	for _, k := range pods {
		m.recFinish[k] = true
		delete(m.recFail, k)
	}
	m.mu.Unlock()
	t.Logf("recycler will finish %v", pods)
}

func (m *machine) recyclerFail(t *rapid.T) {
	dirty := m.dirtyPods()
	if len(dirty) == 0 {
		t.Skip("nothing to recycle")
	}
	pods := rapid.SliceOfNDistinct(rapid.SampledFrom(dirty), 1, -1, func(k model.Key) string { return k.String() }).Draw(t, "fail")
	m.mu.Lock()
	for _, k := range pods {
		m.recFail[k] = true
	}
	m.mu.Unlock()
	t.Logf("recycler will fail %v once", pods)
}

func (m *machine) recyclerAuto(t *rapid.T) {
	auto := rapid.Bool().Draw(t, "auto")
	m.mu.Lock()
	m.recAuto = auto
	m.mu.Unlock()
	t.Logf("recycler finishes everything: %t", auto)
}

func (m *machine) podReadiness(t *rapid.T) {
	pods := m.existingPods()
	if len(pods) == 0 {
		t.Skip("no pod")
	}
	key := rapid.SampledFrom(pods).Draw(t, "pod")
	ready := rapid.Bool().Draw(t, "ready")
	var pod corev1.Pod
	m.must(m.b.raw.Get(m.ctx, key, &pod), "get pod")
	m.must(testenv.SetPodReady(m.ctx, m.b.raw, &pod, ready), "set readiness")
	m.m.SetReady(key, allocator.PodReady(&pod))
	// The pod's new version re-dates its mark: marked for a claim whose
	// record does not list it (a release of unknown outcome that landed),
	// it is reserved for that claim for a quarantine, as a hand-out that
	// may be in flight, and is not in the shortfall meanwhile (see
	// markedNotHeld). A terminating one is (deletePod).
	if m.podMarkedNotHeld(key) {
		m.unsettled[m.m.Pods[key].Pool] = m.clock.Now()
	}
	t.Logf("pod %s ready=%t", key, ready)
}

func (m *machine) deletePod(t *rapid.T) {
	pods := m.existingPods()
	if len(pods) == 0 {
		t.Skip("no pod")
	}
	key := rapid.SampledFrom(pods).Draw(t, "pod")
	var pod corev1.Pod
	m.must(m.b.raw.Get(m.ctx, key, &pod), "get pod")
	switch {
	case pod.DeletionTimestamp != nil:
		// Terminating: let it go.
		pod.Finalizers = nil
		m.must(m.b.raw.Update(m.ctx, &pod), "drop pod finalizer")
	case rapid.Bool().Draw(t, "terminate"):
		pod.Finalizers = []string{podHoldFinalizer}
		m.must(m.b.raw.Update(m.ctx, &pod), "add pod finalizer")
		m.must(m.b.raw.Delete(m.ctx, &pod, client.GracePeriodSeconds(0)), "delete pod")
		m.m.SetReady(key, false)
		t.Logf("pod %s terminating", key)
		return
	default:
		m.must(m.b.raw.Delete(m.ctx, &pod, client.GracePeriodSeconds(0)), "delete pod")
	}
	m.m.DeletePod(key)
	t.Logf("pod %s deleted", key)
}

func (m *machine) addPods(t *rapid.T) {
	pool := m.pickPool(t)
	n := rapid.IntRange(1, 3).Draw(t, "pods")
	ready := rapid.IntRange(0, 3).Draw(t, "ready unless 0") > 0
	for range n {
		m.addPod(pool, ready)
	}
	t.Logf("add %d pods to %s ready=%t", n, pool, ready)
}

func (m *machine) deleteClaim(t *rapid.T) {
	uid := m.pickClaim(t)
	cl, ok := m.getClaim(uid)
	if !ok {
		t.Skip("claim gone")
	}
	if cl.DeletionTimestamp != nil {
		t.Skip("already terminating")
	}
	m.must(m.b.raw.Delete(m.ctx, cl), "delete claim")
	if _, still := m.getClaim(uid); still {
		m.m.Terminate(uid)
	}
	t.Logf("delete claim %s", cl.Name)
}

func (m *machine) forceDeleteClaim(t *rapid.T) {
	uid := m.pickClaim(t)
	cl, ok := m.getClaim(uid)
	if !ok {
		t.Skip("claim gone")
	}
	if len(cl.Finalizers) > 0 {
		cl.Finalizers = nil
		err := m.b.raw.Update(m.ctx, cl)
		if err != nil && !apierrors.IsNotFound(err) {
			m.fatalf("strip finalizers: %v", err)
		}
	}
	if err := m.b.raw.Delete(m.ctx, cl); err != nil && !apierrors.IsNotFound(err) {
		m.fatalf("force delete: %v", err)
	}
	m.m.Force(uid)
	t.Logf("force-delete claim %s (held %v)", cl.Name, heldNames(m.m.Claims[uid]))
}

func (m *machine) freshRound(t *rapid.T) {
	pool := m.pickPool(t)
	res, err := m.round(m.list(pool), true, false)
	t.Logf("round %s: allocated %v released %v recycling %v shortfall %d err %v", pool, res.Allocated, res.Released, res.Recycling, res.Shortfall, err)
}

func (m *machine) staleRound(t *rapid.T) {
	if len(m.replays) == 0 {
		t.Skip("no earlier listing")
	}
	old := m.replays[rapid.IntRange(0, len(m.replays)-1).Draw(t, "replay index")]
	fresh := m.list(old.Pool)
	in := allocator.Input{Pool: old.Pool, Pods: fresh.Pods, Claims: old.Claims}
	m.stats.stale.Add(1)
	res, err := m.round(in, false, false)
	t.Logf("stale round %s: allocated %v released %v err %v", in.Pool, res.Allocated, res.Released, err)
}

var injectedErrors = []func() error{
	func() error { return apierrors.NewTimeoutError("injected timeout", 1) },
	func() error { return apierrors.NewServiceUnavailable("injected unavailable") },
	func() error { return apierrors.NewInternalError(errors.New("injected internal error")) },
	func() error { return fmt.Errorf("injected: %w", context.DeadlineExceeded) },
	func() error {
		return apierrors.NewForbidden(schema.GroupResource{Group: testenv.Group, Resource: "claims"}, "x", errors.New("injected"))
	},
}

// faultClaims picks the pool of a faulty round (one with claims when there
// is one: faults hit writes) and some of its live claims, at least one.
func (m *machine) faultClaims(t *rapid.T) (types.NamespacedName, []types.NamespacedName) {
	var busy []types.NamespacedName
	for _, uid := range m.liveClaims() {
		if p := m.m.Claims[uid].Pool; !slices.Contains(busy, p) {
			busy = append(busy, p)
		}
	}
	if len(busy) == 0 {
		return m.pickPool(t), nil
	}
	slices.SortFunc(busy, cmpKey)
	pool := rapid.SampledFrom(busy).Draw(t, "pool")
	var all, picked []types.NamespacedName
	for _, uid := range m.liveClaims() {
		if c := m.m.Claims[uid]; c.Pool == pool {
			all = append(all, c.Name)
		}
	}
	for _, name := range all {
		if rapid.Bool().Draw(t, "fault "+name.Name) {
			picked = append(picked, name)
		}
	}
	if len(picked) == 0 {
		picked = all[:1]
	}
	return pool, picked
}

func (m *machine) armPatches(t *rapid.T, kind faultKind, claims []types.NamespacedName) {
	for _, name := range claims {
		f := patchFault{kind: kind}
		switch kind {
		case faultBefore:
			f.err = injectedErrors[rapid.IntRange(0, len(injectedErrors)-1).Draw(t, "error")]()
		case faultAfter:
			f.err = injectedErrors[rapid.IntRange(0, 3).Draw(t, "error")]()
			f.failGet = rapid.Bool().Draw(t, "fail read-back")
		case faultOwnerEdit:
			f.want = int32(rapid.IntRange(0, 4).Draw(t, "owner's new replicas"))
		}
		m.mu.Lock()
		m.patches[name] = f
		m.mu.Unlock()
	}
}

// faultyRound runs a fresh round on pool with the armed faults, then
// disarms what was not used.
func (m *machine) faultyRound(t *rapid.T, what string, pool types.NamespacedName, claims []types.NamespacedName) {
	in := m.list(pool)
	res, err := m.round(in, true, true)
	m.mu.Lock()
	clear(m.patches)
	clear(m.getFails)
	m.mu.Unlock()
	t.Logf("%s round %s (faults on %v): allocated %v released %v err %v", what, pool, claims, res.Allocated, res.Released, err)
}

func (m *machine) writeFailBefore(t *rapid.T) {
	pool, claims := m.faultClaims(t)
	m.armPatches(t, faultBefore, claims)
	m.faultyRound(t, "write-fails-before", pool, claims)
}

func (m *machine) writeFailAfter(t *rapid.T) {
	pool, claims := m.faultClaims(t)
	m.armPatches(t, faultAfter, claims)
	m.faultyRound(t, "write-lands-then-fails", pool, claims)
}

func (m *machine) conflict(t *rapid.T) {
	kind := faultConflict
	if rapid.Bool().Draw(t, "owner edits during the write") {
		kind = faultOwnerEdit
	}
	pool, claims := m.faultClaims(t)
	m.armPatches(t, kind, claims)
	m.faultyRound(t, "conflict", pool, claims)
}

func (m *machine) readFail(t *rapid.T) {
	pool, claims := m.faultClaims(t)
	for _, name := range claims {
		n := 1 + rapid.IntRange(0, 1).Draw(t, "extra failed reads")
		m.mu.Lock()
		m.getFails[name] = n
		m.mu.Unlock()
	}
	m.faultyRound(t, "read-fails", pool, claims)
}

func (m *machine) advanceClock(t *rapid.T) {
	d := rapid.SampledFrom([]time.Duration{10 * time.Second, time.Minute, allocator.DefaultQuarantine + time.Second, 5 * time.Minute}).Draw(t, "advance")
	m.clock.Step(d)
	t.Logf("clock +%s", d)
}

func (m *machine) restart(t *rapid.T) {
	// Without pod marks, a claim force-deleted and then a restart before
	// its pods were recycled is the documented limit of WithPodMarks(false).
	if !m.marks {
		// Pods handed to a claim that is gone and not yet recycled live
		// only in the allocator's memory (store or quarantine).
		for _, d := range m.m.Dirty {
			if c := m.m.Claims[d.Claim]; c == nil || c.Gone {
				t.Skip("orphans being recycled would be lost")
			}
		}
		for _, pool := range m.pools {
			for _, h := range m.snapshot(pool) {
				if c := m.m.Claims[h.UID]; c == nil || c.Gone {
					t.Skip("orphans being recycled would be lost")
				}
			}
		}
	}
	before := make(model.Stores)
	// A write of unknown outcome may be settled differently by the new
	// allocator (with pod marks, a pod reserved before is held after):
	// such pools are compared with the records (I4) only.
	wasRecovered, wasPending, wasUnsettled := m.recovered, m.pending, m.unsettled
	for _, pool := range m.pools {
		before[pool] = m.snapshot(pool)
	}
	m.newAllocator()
	m.stats.restarts.Add(1)
	// A pod marked for a claim whose record does not list it (a hand-out
	// cut short) is reserved for the claim by the new allocator for a
	// quarantine: it is on its way, so not in the shortfall, which the
	// machine does not model. Such pools are not compared for it until
	// the quarantine has passed, as after a write of unknown outcome.
	for _, pool := range m.pools {
		if m.markedNotHeld(pool) {
			m.unsettled[pool] = m.clock.Now()
		}
	}
	order := rapid.Permutation(m.pools).Draw(t, "recovery order")
	var errs []error
	for _, pool := range order {
		res, err := m.round(m.list(pool), true, false)
		_, pending := wasPending[pool]
		_, unsettled := wasUnsettled[pool]
		if wasRecovered[pool] && !pending && !unsettled {
			// An orphan whose pod is gone is held by nothing durable, not
			// even a pod mark: it is free, and harmless, after a restart.
			goneOrphan := func(h store.Holder, pod string) bool {
				c, p := m.m.Claims[h.UID], m.m.Pods[model.Key{Namespace: pool.Namespace, Name: pod}]
				if (c == nil || c.Gone || m.marks) && (p == nil || !p.Exists) {
					// With pod marks, a record entry for a pod that no
					// longer exists is not believed after a restart: no
					// mark says whose it was, and a pod created later under
					// the name is a new one.
					return true
				}
				// A pod marked for a claim whose record does not hold it
				// (a hand-out cut short) is settled by whichever allocator
				// meets it: held as an orphan's, or waiting for the hand-out
				// to land. Either way it is not handed out as it is.
				return m.marks && (c == nil || c.Gone || !c.Held[pod]) && m.markOf(pool.Namespace, pod) == string(h.UID)
			}
			errs = append(errs, model.CheckRecovered(pool, before[pool], m.snapshot(pool), res, goneOrphan))
		}
		t.Logf("restart: round %s: allocated %v released %v err %v", pool, res.Allocated, res.Released, err)
	}
	m.must(errors.Join(errs...), "restart")
}

// markedNotHeld reports whether a pod of pool is marked for a claim (with
// pod marks) whose record does not hold it.
func (m *machine) markedNotHeld(pool types.NamespacedName) bool {
	for key, pod := range m.m.Pods {
		if pod.Pool == pool && m.podMarkedNotHeld(key) {
			return true
		}
	}
	return false
}

// podMarkedNotHeld reports whether the pod exists, marked for a claim whose
// record does not list it held.
func (m *machine) podMarkedNotHeld(key model.Key) bool {
	if !m.marks {
		return false
	}
	if pod := m.m.Pods[key]; pod == nil || !pod.Exists {
		return false
	}
	uid := m.markOf(key.Namespace, key.Name)
	if uid == "" {
		return false
	}
	c := m.m.Claims[types.UID(uid)]
	return c == nil || !c.Held[key.Name]
}

// markOf returns the claim UID the pod's mark names on the server, "" if
// none.
func (m *machine) markOf(ns, pod string) string {
	var p corev1.Pod
	if err := m.b.raw.Get(m.ctx, types.NamespacedName{Namespace: ns, Name: pod}, &p); err != nil {
		return ""
	}
	v := p.Annotations[allocator.DefaultPodMarkKey]
	return v[strings.LastIndexByte(v, '/')+1:]
}

func (m *machine) concurrentRounds(t *rapid.T) {
	p1 := m.pickPool(t)
	p2 := p1
	if rapid.Bool().Draw(t, "two pools") {
		p2 = m.pickPool(t)
	}
	in1, in2 := m.list(p1), m.list(p2)
	pre := m.preHolders()
	newest := m.newest()
	var res [2]allocator.Result
	var errs [2]error
	var wg sync.WaitGroup
	wg.Go(func() { res[0], errs[0] = m.a.Round(m.ctx, in1) })
	wg.Go(func() { res[1], errs[1] = m.a.Round(m.ctx, in2) })
	wg.Wait()
	m.stats.rounds.Add(2)
	m.stats.concurrent.Add(1)
	errOut := m.drain()
	freed := make(map[model.Key]bool)
	for i, in := range []allocator.Input{in1, in2} {
		for _, g := range res[i].Released {
			for _, p := range g.Pods {
				freed[model.Key{Namespace: in.Pool.Namespace, Name: p}] = true
			}
		}
	}
	seen := make(map[model.Key]types.UID)
	for i, in := range []allocator.Input{in1, in2} {
		for _, g := range res[i].Allocated {
			for _, p := range g.Pods {
				k := model.Key{Namespace: in.Pool.Namespace, Name: p}
				if other, dup := seen[k]; dup {
					m.fatalf("I1: concurrent rounds handed pod %s to %s and uid %s", k, g.Claim, other)
				}
				seen[k] = g.UID
			}
		}
	}
	m.afterRound(in1, res[0], errs[0], false, false, pre, freed, errOut, newest)
	m.afterRound(in2, res[1], errs[1], false, false, pre, freed, errOut, newest)
	t.Logf("concurrent rounds %s and %s: allocated %v / %v", p1, p2, res[0].Allocated, res[1].Allocated)
}

// keptReplays is the *testing.T rapid.Check gets. With exact (a world on
// the fake client, where a kept history replays draw for draw), a kept
// file under testdata/rapid/ that rapid reports as no longer valid fails
// the test: it replays nothing any more. On the real API server no replay
// is exact, so there it is only logged.
type keptReplays struct {
	*testing.T
	exact bool
}

func (k keptReplays) Logf(format string, args ...any) {
	k.T.Helper()
	msg := fmt.Sprintf(format, args...)
	if k.exact && strings.Contains(msg, "is no longer valid") {
		k.T.Errorf("%s: it replays nothing. Pin its bug with a plain test and delete the file (see testdata/rapid/README.md)", msg)
		return
	}
	k.T.Log(msg)
}

// runProperty runs the machine under rapid.Check and logs the counts. exact
// is set for a world on the fake client (see keptReplays).
func runProperty(t *testing.T, b *backend, minSteps int, exact bool) {
	stats := &propertyStats{}
	start := time.Now()
	var id atomic.Int64
	t.Cleanup(func() {
		t.Logf("property %s: %v in %s (min %d steps a history)",
			t.Name(), stats, time.Since(start).Round(time.Millisecond), minSteps)
	})
	rapid.Check(keptReplays{T: t, exact: exact}, func(rt *rapid.T) {
		m := newMachine(rt, b, stats, int(id.Add(1)))
		defer m.close()
		actions := m.actions()
		for m.steps < minSteps {
			rt.Repeat(actions)
		}
		stats.histories.Add(1)
	})
}
