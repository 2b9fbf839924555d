package allocator_test

// The scenarios of issue 9 (exclusive under failover, late joiners and moved
// pools), one test each, against the real API server. Each test drives the
// allocators through the public API only and checks outcomes on the server,
// against the invariants of spec/fencing.md:
//
//   - EXCL: no pod is in the held list of two claims' records at the same
//     instant. Checked after every write an allocator under test makes (its
//     client is wrapped by an interceptor) and after every step.
//   - I11: with pod marks, a pod a record lists as held, if it exists,
//     carries the mark of that claim. Checked after every step; records a
//     test "user" edits on purpose are exempt until the allocator had its
//     chance to put them right.
//   - I13: a pod of uncertain ownership is recycled (the recycler is called
//     for it, or it is deleted) before it appears in another claim's record.
//     Checked after every write and every step.
//   - Liveness: with a single allocator left, within fenceSettleRounds rounds
//     (the fake clock stepped past allocator.DefaultQuarantine before each), every
//     claim holds what the pool can give it, from its own pool and marked
//     for it, and no pod stays marked for a claim whose record does not list
//     it.
//
// A lagging informer cache is simulated by giving an allocator an older
// listing: a deep copy of what the server showed earlier.
//
// These tests fail on the allocator as of the commit that added them; they
// encode the behaviour the rewrite for issue 9 must have.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/store"
	"github.com/poolalloc/poolalloc/syncer"
)

// fenceSettleRounds bounds the rounds a single allocator may take to serve
// every claim after a disturbance (spec/fencing.md, liveness).
const fenceSettleRounds = 10

// ---------------------------------------------------------------------------
// What the server shows, and the invariants over it. These helpers take a
// client and a namespace, not a fixture, so that other tests can reuse them.

// serverClaim is one claim as the API server shows it.
type serverClaim struct {
	Name, Pool  string
	UID         types.UID
	Held        []string // allocated minus released, sorted
	Terminating bool
	// Err is set when the record's allocated or released list cannot be
	// decoded; Held is then what could be.
	Err error
}

// serverClaims lists the claims of namespace ns in one List call (one
// consistent snapshot of all of them) and decodes what their records say
// they hold. Only the allocated and released lists are read: a malformed
// release list (the owner's) does not hide what a claim holds.
func serverClaims(ctx context.Context, c client.Reader, ns string, keys syncer.Keys) ([]serverClaim, error) {
	var list testenv.ClaimList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("list claims of %s: %w", ns, err)
	}
	out := make([]serverClaim, 0, len(list.Items))
	for i := range list.Items {
		cl := &list.Items[i]
		sc := serverClaim{Name: cl.Name, Pool: cl.Spec.PoolRef, UID: cl.UID, Terminating: cl.DeletionTimestamp != nil}
		allocated, err1 := syncer.DecodePods(cl.Annotations[keys.Allocated])
		released, err2 := syncer.DecodePods(cl.Annotations[keys.Released])
		sc.Err = errors.Join(err1, err2)
		sc.Held = syncer.Record{Allocated: allocated, Released: released}.Held()
		slices.Sort(sc.Held)
		out = append(out, sc)
	}
	slices.SortFunc(out, func(x, y serverClaim) int { return strings.Compare(x.Name, y.Name) })
	return out, nil
}

// serverPods returns the pods of namespace ns, all pools, by name.
func serverPods(ctx context.Context, c client.Reader, ns string) (map[string]*corev1.Pod, error) {
	var list corev1.PodList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("list pods of %s: %w", ns, err)
	}
	out := make(map[string]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

// markFor is the value of the pod mark naming a claim.
func markFor(claim string, uid types.UID) string { return claim + "/" + string(uid) }

// exclusiveViolations (EXCL) describes every pod that the held lists of two
// or more claims name at once.
func exclusiveViolations(claims []serverClaim) []string {
	by := map[string][]string{}
	for _, c := range claims {
		for _, p := range c.Held {
			by[p] = append(by[p], c.Name)
		}
	}
	var out []string
	for p, cs := range by {
		if len(cs) > 1 {
			out = append(out, fmt.Sprintf("pod %s is held in the records of %s at once", p, strings.Join(cs, " and ")))
		}
	}
	slices.Sort(out)
	return out
}

// fencedViolations (I11) describes every pod a claim's record lists as held
// that exists and does not carry that claim's mark (annotation markKey).
// Claims named in exempt are skipped.
func fencedViolations(claims []serverClaim, pods map[string]*corev1.Pod, markKey string, exempt map[string]bool) []string {
	var out []string
	for _, c := range claims {
		if exempt[c.Name] {
			continue
		}
		for _, p := range c.Held {
			pod := pods[p]
			if pod == nil {
				continue
			}
			if got, want := pod.Annotations[markKey], markFor(c.Name, c.UID); got != want {
				out = append(out, fmt.Sprintf("pod %s is in %s's record but its mark is %q, want %q", p, c.Name, got, want))
			}
		}
	}
	return out
}

// strandedMarks describes every pod marked for a claim whose record does not
// list it as held (a claim that does not exist included).
func strandedMarks(claims []serverClaim, pods map[string]*corev1.Pod, markKey string) []string {
	holds := map[string]bool{}
	for _, c := range claims {
		for _, p := range c.Held {
			holds[markFor(c.Name, c.UID)+"|"+p] = true
		}
	}
	var out []string
	for name, pod := range pods {
		m := pod.Annotations[markKey]
		if m != "" && !holds[m+"|"+name] {
			out = append(out, fmt.Sprintf("pod %s is marked %q but that claim's record does not hold it", name, m))
		}
	}
	slices.Sort(out)
	return out
}

// requireExclusive fails t unless EXCL holds in namespace ns now.
func requireExclusive(t testing.TB, ctx context.Context, c client.Reader, ns string, keys syncer.Keys) {
	t.Helper()
	claims, err := serverClaims(ctx, c, ns, keys)
	require.NoError(t, err)
	require.Empty(t, exclusiveViolations(claims), "EXCL")
}

// requireFenced fails t unless I11 holds in namespace ns now, for every
// claim but those named in exempt.
func requireFenced(t testing.TB, ctx context.Context, c client.Reader, ns string, keys syncer.Keys, markKey string, exempt ...string) {
	t.Helper()
	claims, err := serverClaims(ctx, c, ns, keys)
	require.NoError(t, err)
	pods, err := serverPods(ctx, c, ns)
	require.NoError(t, err)
	ex := map[string]bool{}
	for _, n := range exempt {
		ex[n] = true
	}
	require.Empty(t, fencedViolations(claims, pods, markKey, ex), "I11")
}

// describeServer renders what the server shows of ns, for failure messages.
func describeServer(ctx context.Context, c client.Reader, ns string, keys syncer.Keys, markKey string) string {
	claims, err := serverClaims(ctx, c, ns, keys)
	if err != nil {
		return err.Error()
	}
	pods, err := serverPods(ctx, c, ns)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	b.WriteString("server state:\n")
	for _, cl := range claims {
		fmt.Fprintf(&b, "  claim %s (pool %s, uid …%s, terminating %t): holds %v", cl.Name, cl.Pool, tail(string(cl.UID)), cl.Terminating, cl.Held)
		if cl.Err != nil {
			fmt.Fprintf(&b, " (record error: %v)", cl.Err)
		}
		b.WriteString("\n")
	}
	names := make([]string, 0, len(pods))
	for n := range pods {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		p := pods[n]
		fmt.Fprintf(&b, "  pod %s (uid …%s, ready %t, terminating %t): mark %q\n",
			n, tail(string(p.UID)), testenv.IsPodReady(p), p.DeletionTimestamp != nil, p.Annotations[markKey])
	}
	return b.String()
}

func tail(s string) string {
	if len(s) > 6 {
		return s[len(s)-6:]
	}
	return s
}

// ---------------------------------------------------------------------------
// fenceWatch: the checks run while the scenario plays.

// fenceWatch checks the invariants on the server while allocators run: EXCL
// and I13 after every write made through its client (which every allocator
// of the test uses), EXCL, I11 and I13 after every step.
type fenceWatch struct {
	t       *testing.T
	f       *fixture
	markKey string // "" when the allocators run without pod marks
	// c is the client the allocators under test get: every write through
	// it is followed by a check.
	c client.Client

	mu         sync.Mutex
	step       string
	violations []string
	// exempt names claims whose records a test user edited on purpose:
	// they are left out of the I11 check (not of EXCL).
	exempt map[string]bool
	// uncertain maps a pod of uncertain ownership to the one claim that may
	// list it until it is recycled (I13).
	uncertain map[string]string
	// recycled counts, per pod, recycler calls and deletions through c.
	recycled map[string]int
}

func newFenceWatch(f *fixture) *fenceWatch {
	w := &fenceWatch{
		t:         f.t,
		f:         f,
		markKey:   allocator.DefaultPodMarkKey,
		exempt:    map[string]bool{},
		uncertain: map[string]string{},
		recycled:  map[string]int{},
	}
	base, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	require.NoError(f.t, err)
	w.c = interceptor.NewClient(base, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			err := c.Create(ctx, obj, opts...)
			w.afterWrite("create", obj, err)
			return err
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			err := c.Update(ctx, obj, opts...)
			w.afterWrite("update", obj, err)
			return err
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			err := c.Patch(ctx, obj, patch, opts...)
			w.afterWrite("patch", obj, err)
			return err
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			err := c.Delete(ctx, obj, opts...)
			if _, isPod := obj.(*corev1.Pod); isPod && (err == nil || apierrors.IsNotFound(err)) {
				w.noteRecycled(obj.GetName())
			}
			w.afterWrite("delete", obj, err)
			return err
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			err := c.SubResource(sub).Update(ctx, obj, opts...)
			w.afterWrite(sub+" update", obj, err)
			return err
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			err := c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			w.afterWrite(sub+" patch", obj, err)
			return err
		},
	})
	return w
}

// alloc returns an allocator on the watched client.
func (w *fenceWatch) alloc(opts ...allocator.Option) allocator.Allocator {
	w.t.Helper()
	a, err := allocator.New(w.c, opts...)
	require.NoError(w.t, err)
	return a
}

// recycler wraps inner so that every call is recorded: the pod counts as
// recycled for I13.
func (w *fenceWatch) recycler(inner allocator.Recycler) allocator.Recycler {
	return func(ctx context.Context, req allocator.RecycleRequest) (bool, error) {
		w.noteRecycled(req.Pod)
		return inner(ctx, req)
	}
}

func (w *fenceWatch) noteRecycled(pod string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recycled[pod]++
	delete(w.uncertain, pod)
}

// recycledCount is how often pod was recycled or deleted.
func (w *fenceWatch) recycledCount(pod string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.recycled[pod]
}

// markUncertain declares pods of uncertain ownership: until recycled, no
// claim but owner may list them (I13).
func (w *fenceWatch) markUncertain(owner string, pods ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range pods {
		w.uncertain[p] = owner
	}
}

// setExempt exempts claims from I11 (their records were edited by hand);
// with none, it clears the exemptions.
func (w *fenceWatch) setExempt(claims ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.exempt)
	for _, c := range claims {
		w.exempt[c] = true
	}
}

func (w *fenceWatch) uncertainViolations(claims []serverClaim) []string {
	var out []string
	for _, c := range claims {
		for _, p := range c.Held {
			if owner, ok := w.uncertain[p]; ok && owner != c.Name {
				out = append(out, fmt.Sprintf("pod %s, of uncertain ownership (listed by %s), is in %s's record without having been recycled", p, owner, c.Name))
			}
		}
	}
	return out
}

func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *corev1.Pod:
		return "pod"
	case *testenv.Claim:
		return "claim"
	}
	return fmt.Sprintf("%T", obj)
}

// afterWrite checks EXCL and I13 on the server after a write by an
// allocator. It runs on the allocator's goroutines: it only records what it
// finds.
func (w *fenceWatch) afterWrite(op string, obj client.Object, err error) {
	claims, lerr := serverClaims(context.Background(), w.f.c, w.f.ns, w.f.keys)
	w.mu.Lock()
	defer w.mu.Unlock()
	desc := fmt.Sprintf("after %s of %s %s (step %q, write error %v)", op, kindOf(obj), obj.GetName(), w.step, err)
	if lerr != nil {
		w.violations = append(w.violations, desc+": "+lerr.Error())
		return
	}
	for _, v := range exclusiveViolations(claims) {
		w.violations = append(w.violations, "EXCL "+desc+": "+v)
	}
	for _, v := range w.uncertainViolations(claims) {
		w.violations = append(w.violations, "I13 "+desc+": "+v)
	}
}

// checkStep checks EXCL, I11 and I13 on the server after a step, and fails
// the test with everything found since the previous check.
func (w *fenceWatch) checkStep() {
	w.t.Helper()
	ctx := context.Background()
	claims, err := serverClaims(ctx, w.f.c, w.f.ns, w.f.keys)
	require.NoError(w.t, err)
	pods, err := serverPods(ctx, w.f.c, w.f.ns)
	require.NoError(w.t, err)
	w.mu.Lock()
	desc := fmt.Sprintf("after step %q", w.step)
	for _, v := range exclusiveViolations(claims) {
		w.violations = append(w.violations, "EXCL "+desc+": "+v)
	}
	if w.markKey != "" {
		for _, v := range fencedViolations(claims, pods, w.markKey, w.exempt) {
			w.violations = append(w.violations, "I11 "+desc+": "+v)
		}
	}
	for _, v := range w.uncertainViolations(claims) {
		w.violations = append(w.violations, "I13 "+desc+": "+v)
	}
	found := w.violations
	w.violations = nil
	w.mu.Unlock()
	if len(found) > 0 {
		w.t.Fatalf("invariants broken:\n  %s\n%s", strings.Join(dedup(found), "\n  "), w.describe())
	}
}

func dedup(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

func (w *fenceWatch) describe() string {
	return describeServer(context.Background(), w.f.c, w.f.ns, w.f.keys, w.markKey)
}

// input lists pool as it is on the server now.
func (w *fenceWatch) input(pool types.NamespacedName) allocator.Input {
	w.t.Helper()
	in, err := world.Input(w.f.ctx, w.f.c, pool)
	require.NoError(w.t, err)
	return in
}

// round runs one round of a on in as step, then checks the invariants. A
// panic of the allocator fails the test (instead of ending the test binary).
// The round's own error is returned, not judged.
func (w *fenceWatch) round(a allocator.Allocator, in allocator.Input, step string) (res allocator.Result, err error) {
	w.t.Helper()
	w.mu.Lock()
	w.step = step
	w.mu.Unlock()
	func() {
		defer func() {
			if p := recover(); p != nil {
				w.t.Fatalf("step %q: the allocator panicked: %v\n%s", step, p, debug.Stack())
			}
		}()
		res, err = a.Round(w.f.ctx, in)
	}()
	w.checkStep()
	return res, err
}

// fresh runs a round of a on pool as the server shows it now.
func (w *fenceWatch) fresh(a allocator.Allocator, pool types.NamespacedName, step string) (allocator.Result, error) {
	w.t.Helper()
	return w.round(a, w.input(pool), step)
}

// until runs rounds of a on pool, at most 3, until cond holds, and fails the
// test if it does not: for setup steps that a rewritten allocator may take
// more than one round over.
func (w *fenceWatch) until(a allocator.Allocator, pool types.NamespacedName, step string, cond func() bool) {
	w.t.Helper()
	for i := 0; i < 3 && !cond(); i++ {
		w.fresh(a, pool, step)
	}
	require.True(w.t, cond(), "setup step %q did not happen within 3 rounds\n%s", step, w.describe())
}

// settle is the liveness check: a, the only allocator left, runs rounds on
// pools (the clock stepped past allocator.DefaultQuarantine before each) until
// every claim named in expect holds exactly that many pods (present, not
// terminating, of the claim's own pool, marked for it) and no pod is marked
// for a claim whose record does not hold it; at most fenceSettleRounds
// rounds per pool.
func (w *fenceWatch) settle(a allocator.Allocator, clk *clocktesting.FakeClock, pools []types.NamespacedName, expect map[string]int) {
	w.t.Helper()
	var unmet []string
	var lastErr error
	for i := range fenceSettleRounds {
		var errs []error
		for _, p := range pools {
			clk.Step(allocator.DefaultQuarantine + time.Second)
			if _, err := w.fresh(a, p, fmt.Sprintf("settle round %d of pool %s", i+1, p.Name)); err != nil {
				errs = append(errs, err)
			}
		}
		lastErr = errors.Join(errs...)
		unmet = w.unserved(expect)
		if len(unmet) == 0 {
			requireExclusive(w.t, w.f.ctx, w.f.c, w.f.ns, w.f.keys)
			if w.markKey != "" {
				requireFenced(w.t, w.f.ctx, w.f.c, w.f.ns, w.f.keys, w.markKey)
			}
			return
		}
	}
	w.t.Fatalf("liveness: after %d rounds of a single allocator:\n  %s\nlast round's error: %v\n%s",
		fenceSettleRounds, strings.Join(unmet, "\n  "), lastErr, w.describe())
}

// unserved says how the server falls short of expect.
func (w *fenceWatch) unserved(expect map[string]int) []string {
	w.t.Helper()
	ctx := context.Background()
	claims, err := serverClaims(ctx, w.f.c, w.f.ns, w.f.keys)
	require.NoError(w.t, err)
	pods, err := serverPods(ctx, w.f.c, w.f.ns)
	require.NoError(w.t, err)
	var out []string
	for _, c := range claims {
		want, ok := expect[c.Name]
		if !ok {
			continue
		}
		var good []string
		for _, p := range c.Held {
			pod := pods[p]
			switch {
			case pod == nil || pod.DeletionTimestamp != nil:
			case pod.Labels[testenv.PoolLabel] != c.Pool:
				out = append(out, fmt.Sprintf("claim %s (pool %s) still lists pod %s of pool %s", c.Name, c.Pool, p, pod.Labels[testenv.PoolLabel]))
			case w.markKey != "" && pod.Annotations[w.markKey] != markFor(c.Name, c.UID):
			default:
				good = append(good, p)
			}
		}
		if len(good) != want {
			out = append(out, fmt.Sprintf("claim %s holds %d usable pods %v, want %d", c.Name, len(good), good, want))
		}
	}
	for name := range expect {
		if !slices.ContainsFunc(claims, func(c serverClaim) bool { return c.Name == name }) {
			out = append(out, "claim "+name+" does not exist")
		}
	}
	if w.markKey != "" {
		out = append(out, strandedMarks(claims, pods, w.markKey)...)
	}
	return out
}

// ---------------------------------------------------------------------------
// Small fixture helpers.

func newFakeClock() *clocktesting.FakeClock { return clocktesting.NewFakeClock(time.Now()) }

// claimWithPriority creates a claim with a priority.
func (f *fixture) claimWithPriority(name, pool string, want, priority int32) *testenv.Claim {
	f.t.Helper()
	c := testenv.NewClaim(f.ns, name, pool, want)
	c.Spec.Priority = priority
	require.NoError(f.t, f.c.Create(f.ctx, c))
	return c
}

// podNamed creates one ready pod of pool under the given name, as
// testenv.CreatePods would.
func (f *fixture) podNamed(pool, name string) *corev1.Pod {
	f.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{testenv.PoolLabel: pool}},
		Spec: corev1.PodSpec{
			NodeName:   "node-0",
			Containers: []corev1.Container{{Name: "main", Image: testenv.PodImage}},
		},
	}
	require.NoError(f.t, f.c.Create(f.ctx, pod))
	require.NoError(f.t, testenv.SetPodReady(f.ctx, f.c, pod, true))
	return pod
}

// getPod reads a pod; nil when it does not exist.
func (f *fixture) getPod(name string) *corev1.Pod {
	f.t.Helper()
	pod := &corev1.Pod{}
	err := f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, pod)
	if apierrors.IsNotFound(err) {
		return nil
	}
	require.NoError(f.t, err)
	return pod
}

// movePool points a claim at another pool ("" detaches it), after edit,
// if any, changes it further.
func (f *fixture) movePool(name, pool string, edit ...func(*testenv.Claim)) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c := f.get(name)
		c.Spec.PoolRef = pool
		for _, e := range edit {
			e(c)
		}
		return f.c.Update(f.ctx, c)
	})
	require.NoError(f.t, err)
}

// cloneInput deep-copies a listing, to be handed to an allocator later as
// what a lagging cache shows.
func cloneInput(in allocator.Input) allocator.Input {
	out := allocator.Input{Pool: in.Pool, Pods: make([]corev1.Pod, len(in.Pods)), Claims: make([]allocator.Claim, len(in.Claims))}
	for i := range in.Pods {
		in.Pods[i].DeepCopyInto(&out.Pods[i])
	}
	for i, c := range in.Claims {
		c.Object = c.Object.DeepCopyObject().(client.Object)
		out.Claims[i] = c
	}
	return out
}

// withoutClaims drops the named claims from a listing.
func withoutClaims(in allocator.Input, names ...string) allocator.Input {
	in.Claims = slices.DeleteFunc(slices.Clone(in.Claims), func(c allocator.Claim) bool {
		return slices.Contains(names, c.Object.GetName())
	})
	return in
}

// claimErrors returns every *allocator.ClaimError in err's tree.
func claimErrors(err error) []*allocator.ClaimError {
	var out []*allocator.ClaimError
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if ce, ok := e.(*allocator.ClaimError); ok {
			out = append(out, ce)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// ---------------------------------------------------------------------------
// Scenario 1.

// A second allocator that started earlier keeps a stale belief: it recovered
// when c3 held p-0; since then the first allocator released p-0 and gave it
// to c4. The second one's cache does not show c4 yet. It must not write p-0
// back into c3's record: p-0's mark names c4.
func TestFencingStaleSecondAllocatorKeepsNoStaleBelief(t *testing.T) {
	f := newFixture(t)
	w := newFenceWatch(f)
	pool := f.pool("p", 1)
	clk := newFakeClock()
	a1 := w.alloc(allocator.WithClock(clk))
	a2 := w.alloc(allocator.WithClock(clk))

	f.claim("c3", "p", 1)
	w.fresh(a1, pool, "a1 gives p-0 to c3")
	require.Equal(t, []string{"p-0"}, f.held("c3"))
	w.fresh(a2, pool, "a2 starts and recovers c3 holding p-0")

	f.scale("c3", 0)
	w.until(a1, pool, "a1 releases p-0 from c3", func() bool { return len(f.held("c3")) == 0 && len(f.marks("p")) == 0 })
	f.scale("c3", 1)
	c4 := f.claimWithPriority("c4", "p", 1, 10)
	w.until(a1, pool, "a1 gives p-0 to the higher-priority c4", func() bool { return slices.Equal(f.held("c4"), []string{"p-0"}) })
	require.Equal(t, markFor("c4", c4.UID), f.marks("p")["p-0"])

	for i := range 2 {
		lagging := withoutClaims(w.input(pool), "c4")
		w.round(a2, lagging, fmt.Sprintf("a2 round %d on a listing that does not show c4 yet", i+1))
		w.fresh(a1, pool, fmt.Sprintf("a1 round %d", i+1))
	}

	// a2 stops; a1 alone serves what the pool can serve.
	w.settle(a1, clk, []types.NamespacedName{pool}, map[string]int{"c3": 0, "c4": 1})
	require.Equal(t, []string{"p-0"}, f.held("c4"))
}

// ---------------------------------------------------------------------------
// Scenario 2.

// A new allocator's first round gets a listing one write behind the server
// (the write of the allocator that stopped). Recovery from it must not swap
// the claim's pod, leak a pod (marked, held by no one) or double-record one.
func TestFencingFailoverOnLaggingListing(t *testing.T) {
	t.Run("behind-a-replacement", func(t *testing.T) {
		f := newFixture(t)
		w := newFenceWatch(f)
		pool := f.pool("p", 2)
		clk := newFakeClock()
		a1 := w.alloc(allocator.WithClock(clk))
		f.claim("c", "p", 1)
		w.fresh(a1, pool, "a1 gives c a pod")
		first := f.held("c")
		require.Len(t, first, 1)
		other := map[string]string{"p-0": "p-1", "p-1": "p-0"}[first[0]]

		// The owner gives its pod back, and the pod goes unready while it
		// is recycled, so that the replacement is the other pod. The
		// lagging cache shows all that, but not a1's write that follows.
		f.release("c", first[0])
		pod := f.getPod(first[0])
		require.NoError(t, testenv.SetPodReady(f.ctx, f.c, pod, false))
		lagging := cloneInput(w.input(pool))
		w.until(a1, pool, "a1 recycles the pod and gives c the other one", func() bool { return slices.Equal(f.held("c"), []string{other}) })
		held := f.held("c")
		require.NoError(t, testenv.SetPodReady(f.ctx, f.c, pod, true))

		// a1 stops; a2 takes over, its first listing one write behind.
		a2 := w.alloc(allocator.WithClock(clk))
		w.round(a2, lagging, "a2's first round, on the lagging listing")
		w.fresh(a2, pool, "a2's second round, on a fresh listing")
		// Not fatal: the settle below shows where this leads.
		assert.Equal(t, held, f.held("c"), "c keeps the pod it held on the server: no swap, no leak")
		w.settle(a2, clk, []types.NamespacedName{pool}, map[string]int{"c": 1})
		require.Equal(t, held, f.held("c"), "c keeps the pod it held on the server: no swap, no leak")
	})
	t.Run("behind-a-top-up", func(t *testing.T) {
		f := newFixture(t)
		w := newFenceWatch(f)
		pool := f.pool("p", 1)
		clk := newFakeClock()
		a1 := w.alloc(allocator.WithClock(clk))
		f.claim("c", "p", 2)
		w.fresh(a1, pool, "a1 gives c the only pod")
		require.Equal(t, []string{"p-0"}, f.held("c"))
		lagging := cloneInput(w.input(pool))

		f.podNamed("p", "p-1")
		w.until(a1, pool, "a1 tops c up with the new pod", func() bool { return len(f.held("c")) == 2 })
		held := f.held("c")
		require.Equal(t, []string{"p-0", "p-1"}, held)

		a2 := w.alloc(allocator.WithClock(clk))
		w.round(a2, lagging, "a2's first round, on the lagging listing")
		w.fresh(a2, pool, "a2's second round, on a fresh listing")
		w.settle(a2, clk, []types.NamespacedName{pool}, map[string]int{"c": 2})
		require.Equal(t, held, f.held("c"))
	})
}

// ---------------------------------------------------------------------------
// Scenario 3.

// A claim's pool changed while no allocator ran: x held p1's pods, now
// references p2, and z arrived in p1. Whichever pool's round runs first, no
// pod is in two records at any time, x gets pods in p2, and x's old pods are
// recycled before z gets them.
func TestFencingClaimMovedWhileNoAllocatorRan(t *testing.T) {
	for _, newFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "old-pool-first", true: "new-pool-first"}[newFirst], func(t *testing.T) {
			f := newFixture(t)
			w := newFenceWatch(f)
			p1, p2 := f.pool("p1", 2), f.pool("p2", 2)
			a0 := w.alloc()
			f.claim("x", "p1", 2)
			w.fresh(a0, p1, "a0 serves x in p1")
			old := f.held("x")
			require.Equal(t, []string{"p1-0", "p1-1"}, old)

			// a0 stops. Meanwhile x moves to p2 and z arrives in p1.
			f.movePool("x", "p2")
			f.claim("z", "p1", 2)
			w.markUncertain("x", old...)

			clk := newFakeClock()
			a := w.alloc(allocator.WithClock(clk), allocator.WithRecycler(w.recycler(allocator.RecycleNoop)))
			pools := []types.NamespacedName{p1, p2}
			if newFirst {
				pools = []types.NamespacedName{p2, p1}
			}
			for i := range 3 {
				for _, p := range pools {
					w.fresh(a, p, fmt.Sprintf("round %d of pool %s", i+1, p.Name))
				}
			}
			w.settle(a, clk, pools, map[string]int{"x": 2, "z": 2})
			require.Equal(t, old, f.held("z"))
			for _, p := range old {
				require.Positive(t, w.recycledCount(p), "x's old pod %s was handed to z without being recycled", p)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Scenario 4.

// A pod is a name and a UID: a pod recreated under the name of one being
// recycled (deleted) is a new, clean pod. It is not deleted again, and it is
// handed out.
func TestFencingPodRecreatedUnderTheSameNameIsANewPod(t *testing.T) {
	f := newFixture(t)
	w := newFenceWatch(f)
	pool := f.pool("p", 1)
	clk := newFakeClock()
	a := w.alloc(allocator.WithClock(clk), allocator.WithRecycler(w.recycler(allocator.RecycleDelete(w.c))))
	f.claim("c", "p", 1)
	w.fresh(a, pool, "c gets p-0")
	require.Equal(t, []string{"p-0"}, f.held("c"))
	oldUID := f.getPod("p-0").UID

	f.scale("c", 0)
	for i := 0; i < 3; i++ {
		if pod := f.getPod("p-0"); pod == nil || pod.DeletionTimestamp != nil {
			break
		}
		w.fresh(a, pool, "c gives p-0 back; the recycler deletes it")
	}
	if pod := f.getPod("p-0"); pod != nil {
		require.NotNil(t, pod.DeletionTimestamp, "the recycler was asked to delete p-0")
		// No kubelet: finish the deletion as it would.
		require.NoError(t, client.IgnoreNotFound(f.c.Delete(f.ctx, pod, client.GracePeriodSeconds(0))))
	}
	require.Eventually(t, func() bool { return f.getPod("p-0") == nil }, 30*time.Second, 100*time.Millisecond)

	// The pool controller creates a fresh p-0 (fixed names) before the
	// allocator's next round. Until the allocator records the old p-0's
	// release, c's record names p-0 while the fresh pod carries no mark.
	w.setExempt("c")
	fresh := f.podNamed("p", "p-0")
	require.NotEqual(t, oldUID, fresh.UID)
	f.claim("d", "p", 1)
	for i := range 2 {
		w.fresh(a, pool, fmt.Sprintf("round %d after p-0 was recreated", i+1))
		got := f.getPod("p-0")
		require.NotNil(t, got, "the fresh p-0 was deleted")
		require.Equal(t, fresh.UID, got.UID, "the fresh p-0 was deleted and replaced")
		require.Nil(t, got.DeletionTimestamp, "the fresh p-0 (uid %s) is being deleted: it was taken for the old one", fresh.UID)
	}
	w.setExempt()
	w.settle(a, clk, []types.NamespacedName{pool}, map[string]int{"c": 0, "d": 1})
	require.Equal(t, fresh.UID, f.getPod("p-0").UID)
}

// ---------------------------------------------------------------------------
// Scenario 5.

// inPlace is a faulty strategy: it reorders the candidates it is given, in
// place, then plans with algorithm.Packed.
type inPlace struct {
	name    string
	reorder func([]algorithm.Candidate)
}

func (s inPlace) Plan(in algorithm.Input) (algorithm.Action, error) {
	s.reorder(in.Candidates)
	return algorithm.Packed{}.Plan(in)
}

// A strategy that modifies its input must not make the allocator hand one
// pod to two claims, nor leave it in an error spiral.
func TestFencingMutatingStrategyNeverHandsOutAHeldPod(t *testing.T) {
	for _, s := range []inPlace{
		{"reverse", slices.Reverse[[]algorithm.Candidate]},
		{"sort-descending", func(c []algorithm.Candidate) {
			slices.SortFunc(c, func(x, y algorithm.Candidate) int { return strings.Compare(y.Name, x.Name) })
		}},
	} {
		t.Run(s.name, func(t *testing.T) {
			f := newFixture(t)
			w := newFenceWatch(f)
			pool := f.pool("p", 6)
			clk := newFakeClock()
			a := w.alloc(allocator.WithClock(clk), allocator.WithAlgorithm(s))
			expect := map[string]int{}
			for i := range 6 {
				name := fmt.Sprintf("c%d", i)
				f.claim(name, "p", 1)
				expect[name] = 1
				w.fresh(a, pool, "claim "+name+" arrives")
			}
			// Churn: pods go back to the pool and out again.
			for _, n := range []string{"c1", "c4"} {
				f.scale(n, 0)
				w.fresh(a, pool, n+" gives its pod back")
				f.scale(n, 1)
				w.fresh(a, pool, n+" wants a pod again")
			}
			w.settle(a, clk, []types.NamespacedName{pool}, expect)
			_, err := w.fresh(a, pool, "a round once settled")
			require.NoError(t, err, "no error spiral")
		})
	}
}

// ---------------------------------------------------------------------------
// Scenario 6.

// Records listing pods that carry no mark (written without pod marks, or by
// OpenSandbox's controller), then an allocator with marks and without
// WithPodMarkMigration: a pod such a record lists is of uncertain ownership
// and is recycled before another claim gets it (I13).
func TestFencingUnmarkedPodsInRecordsAreRecycledBeforeReuse(t *testing.T) {
	t.Run("written-without-pod-marks", func(t *testing.T) {
		f := newFixture(t)
		w := newFenceWatch(f)
		pool := f.pool("p", 2)
		w.setExempt("a") // its record is written without marks on purpose
		a0 := w.alloc(allocator.WithPodMarks(false))
		f.claim("a", "p", 2)
		w.fresh(a0, pool, "a0, without marks, gives a both pods")
		require.Equal(t, []string{"p-0", "p-1"}, f.held("a"))
		require.Empty(t, f.marks("p"))
		f.claimWithPriority("b", "p", 2, 10)
		w.markUncertain("a", "p-0", "p-1")

		clk := newFakeClock()
		a1 := w.alloc(allocator.WithClock(clk), allocator.WithRecycler(w.recycler(allocator.RecycleNoop)))
		for i := range 3 {
			w.fresh(a1, pool, fmt.Sprintf("a1 (marks on) round %d", i+1))
		}
		w.setExempt()
		w.settle(a1, clk, []types.NamespacedName{pool}, map[string]int{"a": 0, "b": 2})
	})
	t.Run("opensandbox-records", func(t *testing.T) {
		f := newFixture(t)
		f.keys = syncer.OpenSandboxKeys()
		w := newFenceWatch(f)
		pool := f.pool("p", 2)
		w.setExempt("sbx")
		c := testenv.NewClaim(f.ns, "sbx", "p", 2)
		c.Annotations = map[string]string{"sandbox.opensandbox.io/alloc-status": `{"pods":["p-0","p-1"]}`}
		c.Finalizers = []string{"pool.sandbox.opensandbox.io/pool-allocation"}
		require.NoError(t, f.c.Create(f.ctx, c))
		f.claimWithPriority("b", "p", 2, 10)
		w.markUncertain("sbx", "p-0", "p-1")

		clk := newFakeClock()
		a := w.alloc(allocator.WithKeys(syncer.OpenSandboxKeys()), allocator.WithClock(clk),
			allocator.WithRecycler(w.recycler(allocator.RecycleNoop)))
		for i := range 3 {
			w.fresh(a, pool, fmt.Sprintf("round %d", i+1))
		}
		w.setExempt()
		w.settle(a, clk, []types.NamespacedName{pool}, map[string]int{"sbx": 0, "b": 2})
	})
}

// ---------------------------------------------------------------------------
// Scenario 7.

// What a claim's editor writes on their own claim concerns that claim only:
// a malformed release request does not stop the pool, and a record naming a
// pod that does not exist reserves nothing.
func TestFencingOwnerInputConfinedToItsClaim(t *testing.T) {
	t.Run("malformed-release", func(t *testing.T) {
		f := newFixture(t)
		w := newFenceWatch(f)
		pool := f.pool("p", 3)
		clk := newFakeClock()
		a := w.alloc(allocator.WithClock(clk))
		f.claim("good", "p", 1)
		mallory := f.attacker()
		require.NoError(t, mallory.Create(f.ctx, testenv.NewClaim(f.ns, "mine", "p", 1)))
		w.fresh(a, pool, "good and mine get a pod each")
		good, mine := f.held("good"), f.held("mine")
		require.Len(t, good, 1)
		require.Len(t, mine, 1)

		f.annotateAs(mallory, "mine", f.keys.Release, `not json`)
		f.claim("other", "p", 1)
		res, err := w.fresh(a, pool, "round with mine's malformed release request")
		require.NoError(t, err, "one owner's request is no error of the round, and does not block the pool")
		warned := errors.Join(res.Warnings...)
		require.ErrorIs(t, warned, allocator.ErrInvalidRelease, "the malformed request is reported")
		var ce *allocator.ClaimError
		require.ErrorAs(t, warned, &ce)
		for _, ce := range claimErrors(warned) {
			require.Equal(t, "mine", ce.Claim.Name, "the warning concerns mine only: %v", warned)
		}
		require.Len(t, grantsTo(res, "other"), 1, "other claims of the pool are served")
		require.Len(t, f.held("other"), 1)
		require.Equal(t, good, f.held("good"))
		require.Equal(t, mine, f.held("mine"), "nothing held is released on a guess")
		w.settle(a, clk, []types.NamespacedName{pool}, map[string]int{"good": 1, "mine": 1, "other": 1})
	})
	t.Run("record-names-absent-pod", func(t *testing.T) {
		f := newFixture(t)
		w := newFenceWatch(f)
		pool := f.pool("p", 1)
		mallory := f.attacker()
		require.NoError(t, mallory.Create(f.ctx, testenv.NewClaim(f.ns, "r", "p", 1)))
		// r's editor lists a pod that does not exist (yet) as allocated.
		f.annotateAs(mallory, "r", f.keys.Allocated, `{"pods":["p-1"]}`)
		w.setExempt("r")

		clk := newFakeClock()
		a := w.alloc(allocator.WithClock(clk))
		// The name reserves nothing: r is served from the pods that exist.
		w.settle(a, clk, []types.NamespacedName{pool}, map[string]int{"r": 1})
		require.Equal(t, []string{"p-0"}, f.held("r"))

		// A pod of that name appears: it is a free pod, not r's.
		w.setExempt()
		f.claim("o", "p", 1)
		f.podNamed("p", "p-1")
		w.settle(a, clk, []types.NamespacedName{pool}, map[string]int{"r": 1, "o": 1})
		require.Equal(t, []string{"p-0"}, f.held("r"))
		require.Equal(t, []string{"p-1"}, f.held("o"))
	})
}

// ---------------------------------------------------------------------------
// Scenario 8.

// observedStore is a user's store: it wraps the in-memory one, counts the
// calls the allocator makes, and checks on the server that an allocation
// is recorded in the store only once its record is durable (I4). It embeds
// store.AllocationStore so that it keeps compiling when the interface is
// split into a reader and a writer half; if the reader half gains read
// methods, count them here too.
type observedStore struct {
	store.AllocationStore
	f *fixture

	reads, allocates, frees atomic.Int64
	mu                      sync.Mutex
	violations              []string
}

func (s *observedStore) violate(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
}

func (s *observedStore) serverHeld(uid types.UID) ([]string, bool) {
	claims, err := serverClaims(context.Background(), s.f.c, s.f.ns, s.f.keys)
	if err != nil {
		s.violate("%v", err)
		return nil, false
	}
	for _, c := range claims {
		if c.UID == uid {
			return c.Held, true
		}
	}
	return nil, false
}

func (s *observedStore) Allocate(pool types.NamespacedName, h store.Holder, pods []string) error {
	s.allocates.Add(1)
	held, ok := s.serverHeld(h.UID)
	for _, p := range pods {
		if !ok || !slices.Contains(held, p) {
			s.violate("store.Allocate(%s, %s) before the claim's record on the server held it (record holds %v)", p, h.Claim.Name, held)
		}
	}
	return s.AllocationStore.Allocate(pool, h, pods)
}

func (s *observedStore) Free(pool types.NamespacedName, uid types.UID, pods []string) error {
	s.frees.Add(1)
	if held, ok := s.serverHeld(uid); ok {
		for _, p := range pods {
			if slices.Contains(held, p) {
				s.violate("store.Free(%s) while the claim's record on the server still holds it", p)
			}
		}
	}
	return s.AllocationStore.Free(pool, uid, pods)
}

func (s *observedStore) HolderOf(pool types.NamespacedName, pod string) (store.Holder, bool, error) {
	s.reads.Add(1)
	return s.AllocationStore.HolderOf(pool, pod)
}

func (s *observedStore) Held(pool types.NamespacedName, uid types.UID) ([]string, error) {
	s.reads.Add(1)
	return s.AllocationStore.Held(pool, uid)
}

func (s *observedStore) Holders(pool types.NamespacedName) ([]store.Holder, error) {
	s.reads.Add(1)
	return s.AllocationStore.Holders(pool)
}

func (s *observedStore) Snapshot(pool types.NamespacedName) (map[string]store.Holder, error) {
	s.reads.Add(1)
	return s.AllocationStore.Snapshot(pool)
}

func (s *observedStore) Pools() ([]types.NamespacedName, error) {
	s.reads.Add(1)
	return s.AllocationStore.Pools()
}

// recordsOf maps each pod the records of ns hold to its claim's name.
func recordsOf(t *testing.T, f *fixture) map[string]string {
	t.Helper()
	claims, err := serverClaims(f.ctx, f.c, f.ns, f.keys)
	require.NoError(t, err)
	out := map[string]string{}
	for _, c := range claims {
		for _, p := range c.Held {
			out[p] = c.Name
		}
	}
	return out
}

func snapshotNames(t *testing.T, r interface {
	Snapshot(types.NamespacedName) (map[string]store.Holder, error)
}, pool types.NamespacedName) map[string]string {
	t.Helper()
	snap, err := r.Snapshot(pool)
	require.NoError(t, err)
	out := map[string]string{}
	for p, h := range snap {
		out[p] = h.Claim.Name
	}
	return out
}

// The store is the allocator's one index of holdings, not a mirror of one
// it keeps itself: Store() gives no way to change holdings, and a store
// given with WithStore is what the allocator reads and writes.
func TestFencingStoreIsTheIndex(t *testing.T) {
	t.Run("Store-is-read-only", func(t *testing.T) {
		// Allocator.Store returns store.Reader; this checks that the type
		// it returns has no writer half, whatever it is declared as.
		m, ok := reflect.TypeFor[allocator.Allocator]().MethodByName("Store")
		require.True(t, ok)
		ret := m.Type.Out(0)
		for _, writer := range []string{"Allocate", "Free", "DeletePool"} {
			if _, has := ret.MethodByName(writer); has {
				t.Errorf("Allocator.Store returns %s, which has %s: a caller can change holdings behind the allocator's back (want the read-only store.Reader)", ret, writer)
			}
		}

		f := newFixture(t)
		w := newFenceWatch(f)
		pool := f.pool("p", 3)
		a := w.alloc()
		c := f.claim("c", "p", 1)
		w.fresh(a, pool, "c gets a pod")
		held := f.held("c")
		require.Len(t, held, 1)

		// Whatever Store returns, even asserted to a writer, it must not
		// change what the allocator holds.
		type writer interface {
			Allocate(types.NamespacedName, store.Holder, []string) error
			Free(types.NamespacedName, types.UID, []string) error
		}
		if wr, ok := any(a.Store()).(writer); ok {
			var free string
			for _, p := range []string{"p-0", "p-1", "p-2"} {
				if p != held[0] {
					free = p
					break
				}
			}
			intruder := store.Holder{UID: "intruder", Claim: types.NamespacedName{Namespace: f.ns, Name: "intruder"}}
			_ = wr.Allocate(pool, intruder, []string{free})
			_ = wr.Free(pool, c.UID, held)
		}
		require.Equal(t, recordsOf(t, f), snapshotNames(t, a.Store(), pool), "the store agrees with the records")
		f.claim("d", "p", 2)
		w.fresh(a, pool, "d gets the two free pods")
		require.Len(t, f.held("d"), 2)
		require.Equal(t, held, f.held("c"))
		require.Equal(t, recordsOf(t, f), snapshotNames(t, a.Store(), pool), "the store agrees with the records")
	})
	t.Run("WithStore-is-the-index", func(t *testing.T) {
		f := newFixture(t)
		w := newFenceWatch(f)
		pool := f.pool("p", 3)
		obs := &observedStore{AllocationStore: store.NewInMemory(), f: f}
		a := w.alloc(allocator.WithStore(obs))
		f.claim("c", "p", 2)
		w.fresh(a, pool, "c gets two pods")
		f.claim("d", "p", 1)
		w.fresh(a, pool, "d gets the third")
		f.scale("c", 1)
		w.fresh(a, pool, "c gives one back")
		f.release("d", f.held("d")...)
		w.fresh(a, pool, "d gives its pod back and gets another")
		w.fresh(a, pool, "a quiet round")

		reads, allocates, frees := obs.reads.Load(), obs.allocates.Load(), obs.frees.Load()
		obs.mu.Lock()
		violations := slices.Clone(obs.violations)
		obs.mu.Unlock()
		require.Empty(t, violations, "the store shows only what the records hold (I4)")
		require.Positive(t, allocates, "the allocator records hand-outs in the user's store")
		require.Positive(t, frees, "the allocator records releases in the user's store")
		require.Positive(t, reads, "the allocator never read who holds what from the user's store: it keeps its own index and only mirrors it into the store")
		require.Equal(t, recordsOf(t, f), snapshotNames(t, obs, pool), "the user's store agrees with the records")
		require.Equal(t, snapshotNames(t, obs, pool), snapshotNames(t, a.Store(), pool), "Store() shows the user's store")
	})
}
