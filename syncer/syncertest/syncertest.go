package syncertest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/syncer"
)

// Names the suite puts on claims to stand for other controllers and users.
const (
	otherFinalizer  = "example.com/other-controller"
	otherAnnotation = "example.com/note"
	touchLabel      = "syncertest.poolalloc.io/touched"
)

// NewSyncerFunc returns the syncer under test, a client on the same API
// server, and a factory for claims. newClaim(name) must return a new
// object named name, not yet created, in a namespace where the client may
// create it, with no annotations or finalizers of its own. The suite
// creates the claims it needs with the client and removes their
// finalizers and deletes them when the subtest ends.
//
// It is called once per subtest, possibly from several goroutines at once.
type NewSyncerFunc = func(t *testing.T) (s syncer.AllocationSyncer, c client.Client, newClaim func(name string) client.Object)

// Run checks that the syncers made by newSyncer keep the contract of
// syncer.AllocationSyncer: a record written reads back the same; the
// allocation finalizer comes and goes as asked; finalizers and annotations
// of others survive; a write from a stale object is a Conflict that
// changes nothing; every write makes a new version of the claim, even one
// that writes what the claim holds already; a record over the size limit is refused before it is
// sent; Get reads the live object and reports a deleted claim as
// NotFound; a malformed record read back is a *syncer.RecordError naming
// the claim and the annotation; no method modifies the claim it is given;
// the syncer is safe for concurrent use.
//
// The malformed-record subtest finds the annotations the syncer writes by
// writing a record and comparing the claim before and after; it skips if
// the syncer keeps its record somewhere else.
func Run(t *testing.T, newSyncer NewSyncerFunc) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, e *env)
	}{
		{"RoundTrip", testRoundTrip},
		{"Finalizer", testFinalizer},
		{"FinalizerLetsDeletedClaimGo", testFinalizerDeletion},
		{"OthersSurvive", testOthersSurvive},
		{"StaleWriteConflicts", testStaleWrite},
		{"EveryWriteMakesANewVersion", testNewVersion},
		{"ConcurrentWritesFromOneObject", testConcurrentSameObject},
		{"CallerObjectNotMutated", testNotMutated},
		{"TooLargeRefused", testTooLarge},
		{"LargeRecordWithinLimit", testLargeWithinLimit},
		{"Get", testGet},
		{"MalformedRecord", testMalformed},
		{"ConcurrentUse", testConcurrentUse},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, c, newClaim := newSyncer(t)
			require.NotNil(t, s, "newSyncer returned a nil syncer")
			require.NotNil(t, c, "newSyncer returned a nil client")
			require.NotNil(t, newClaim, "newSyncer returned a nil newClaim")
			tc.fn(t, &env{s: s, c: c, newClaim: newClaim})
		})
	}
}

// env is what one subtest works with.
type env struct {
	s        syncer.AllocationSyncer
	c        client.Client
	newClaim func(name string) client.Object
}

// create creates a claim, with the given finalizers and annotations, and
// arranges its removal. It returns the claim as created.
func (e *env) create(t *testing.T, name string, finalizers []string, annotations map[string]string) client.Object {
	t.Helper()
	obj := e.newClaim(name)
	require.NotNil(t, obj, "newClaim(%q) returned nil", name)
	if len(finalizers) > 0 {
		obj.SetFinalizers(finalizers)
	}
	if len(annotations) > 0 {
		obj.SetAnnotations(annotations)
	}
	require.NoError(t, e.c.Create(t.Context(), obj), "create claim %s", name)
	t.Cleanup(func() { e.remove(t, obj) })
	return obj
}

// remove drops all finalizers of the claim and deletes it.
func (e *env) remove(t *testing.T, obj client.Object) {
	// t.Context() is already canceled when cleanups run.
	ctx := context.Background()
	live, err := e.fetchErrCtx(ctx, obj)
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("cleanup: get %s: %v", obj.GetName(), err)
		return
	}
	if len(live.GetFinalizers()) > 0 {
		cp := live.DeepCopyObject().(client.Object)
		cp.SetFinalizers(nil)
		if err := e.c.Patch(ctx, cp, client.MergeFrom(live)); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cleanup: remove finalizers of %s: %v", obj.GetName(), err)
		}
	}
	if err := e.c.Delete(ctx, live); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("cleanup: delete %s: %v", obj.GetName(), err)
	}
}

// fetch reads the claim from the server with the client, into a new object.
func (e *env) fetch(t *testing.T, obj client.Object) client.Object {
	t.Helper()
	live, err := e.fetchErr(t, obj)
	require.NoError(t, err, "get claim %s", obj.GetName())
	return live
}

func (e *env) fetchErr(t *testing.T, obj client.Object) (client.Object, error) {
	return e.fetchErrCtx(t.Context(), obj)
}

func (e *env) fetchErrCtx(ctx context.Context, obj client.Object) (client.Object, error) {
	live, err := newEmpty(obj)
	if err != nil {
		return nil, err
	}
	return live, e.c.Get(ctx, client.ObjectKeyFromObject(obj), live)
}

// touch changes a label of the claim on the server, as another writer
// would, and returns the claim as the server stored it.
func (e *env) touch(t *testing.T, obj client.Object, value string) client.Object {
	t.Helper()
	cp := obj.DeepCopyObject().(client.Object)
	labels := map[string]string{}
	for k, v := range cp.GetLabels() {
		labels[k] = v
	}
	labels[touchLabel] = value
	cp.SetLabels(labels)
	require.NoError(t, e.c.Patch(t.Context(), cp, client.MergeFrom(obj)), "touch claim %s", obj.GetName())
	return cp
}

// setAnnotation sets one annotation of the claim on the server.
func (e *env) setAnnotation(t *testing.T, obj client.Object, key, value string) client.Object {
	t.Helper()
	cp := obj.DeepCopyObject().(client.Object)
	ann := map[string]string{}
	for k, v := range cp.GetAnnotations() {
		ann[k] = v
	}
	ann[key] = value
	cp.SetAnnotations(ann)
	require.NoError(t, e.c.Patch(t.Context(), cp, client.MergeFrom(obj)), "annotate claim %s", obj.GetName())
	return cp
}

// write calls Write and checks that neither the claim nor rec changed.
func (e *env) write(t *testing.T, claim client.Object, rec syncer.Record, finalizer bool) (client.Object, error) {
	t.Helper()
	check := unchanged(t, claim)
	recBefore := syncer.Record{
		Allocated: slices.Clone(rec.Allocated),
		Release:   slices.Clone(rec.Release),
		Released:  slices.Clone(rec.Released),
	}
	out, err := e.s.Write(t.Context(), claim, rec, finalizer)
	check("Write")
	require.Equal(t, recBefore, rec, "Write modified the record passed in")
	if err == nil {
		require.NotNil(t, out, "Write returned no object and no error")
		require.Equal(t, reflect.TypeOf(claim), reflect.TypeOf(out), "Write returned another type")
	}
	return out, err
}

// mustWrite writes and requires success.
func (e *env) mustWrite(t *testing.T, claim client.Object, rec syncer.Record, finalizer bool) client.Object {
	t.Helper()
	out, err := e.write(t, claim, rec, finalizer)
	require.NoError(t, err, "Write %+v", rec)
	return out
}

// read calls Read and checks that the claim did not change.
func (e *env) read(t *testing.T, claim client.Object) (syncer.Record, error) {
	t.Helper()
	check := unchanged(t, claim)
	rec, err := e.s.Read(claim)
	check("Read")
	return rec, err
}

// get calls Get and checks that the claim did not change.
func (e *env) get(t *testing.T, claim client.Object) (client.Object, error) {
	t.Helper()
	check := unchanged(t, claim)
	out, err := e.s.Get(t.Context(), claim)
	check("Get")
	if err == nil {
		require.NotNil(t, out, "Get returned no object and no error")
		require.Equal(t, reflect.TypeOf(claim), reflect.TypeOf(out), "Get returned another type")
	}
	return out, err
}

// requireRecord checks that claim holds want's Allocated and Released (in
// any order) and an empty Release.
func (e *env) requireRecord(t *testing.T, claim client.Object, want syncer.Record) {
	t.Helper()
	got, err := e.read(t, claim)
	require.NoError(t, err, "Read")
	require.ElementsMatch(t, want.Allocated, got.Allocated, "Allocated")
	require.ElementsMatch(t, want.Released, got.Released, "Released")
	require.Empty(t, got.Release, "Release")
}

// unchanged snapshots obj and returns a check that it is still equal.
func unchanged(t *testing.T, obj client.Object) func(method string) {
	t.Helper()
	before := obj.DeepCopyObject()
	return func(method string) {
		t.Helper()
		require.Equal(t, before, obj, "%s modified the claim passed in", method)
	}
}

func testRoundTrip(t *testing.T, e *env) {
	claim := e.create(t, "roundtrip", nil, nil)
	e.requireRecord(t, claim, syncer.Record{})

	steps := []syncer.Record{
		{Allocated: []string{"pod-a", "pod-b", "pod-c"}},
		{Allocated: []string{"pod-a", "pod-b", "pod-c"}, Released: []string{"pod-b"}},
		{Allocated: []string{"pod-a", "pod-b", "pod-c", "pod-d.x"}, Released: []string{"pod-b", "pod-c"}},
		// A pod released but not allocated is kept as given.
		{Allocated: []string{"pod-a"}, Released: []string{"pod-z"}},
		// Release belongs to the owner: it is not written.
		{Allocated: []string{"pod-a"}, Release: []string{"pod-a"}},
		{},
	}
	for i, rec := range steps {
		out := e.mustWrite(t, claim, rec, false)
		want := syncer.Record{Allocated: rec.Allocated, Released: rec.Released}
		e.requireRecord(t, out, want)

		live, err := e.get(t, claim)
		require.NoError(t, err, "step %d: Get", i)
		require.Equal(t, out.GetResourceVersion(), live.GetResourceVersion(),
			"step %d: Write did not return the object as stored", i)
		e.requireRecord(t, live, want)
		claim = out
	}
}

func testFinalizer(t *testing.T, e *env) {
	claim := e.create(t, "finalizer", nil, nil)
	require.False(t, e.s.HasFinalizer(claim), "new claim has the finalizer")
	before := len(claim.GetFinalizers())

	rec := syncer.Record{Allocated: []string{"pod-a", "pod-b"}}
	out := e.mustWrite(t, claim, rec, true)
	require.True(t, e.s.HasFinalizer(out), "returned claim lacks the finalizer")
	live := e.fetch(t, claim)
	require.True(t, e.s.HasFinalizer(live), "claim on the server lacks the finalizer")
	require.Len(t, live.GetFinalizers(), before+1, "finalizers on the server")
	e.requireRecord(t, live, rec)

	// Writing it again does not add it twice.
	out = e.mustWrite(t, out, rec, true)
	require.Len(t, e.fetch(t, claim).GetFinalizers(), before+1, "finalizer added twice")

	rec.Released = []string{"pod-a", "pod-b"}
	out = e.mustWrite(t, out, rec, false)
	require.False(t, e.s.HasFinalizer(out), "returned claim keeps the finalizer")
	live = e.fetch(t, claim)
	require.False(t, e.s.HasFinalizer(live), "claim on the server keeps the finalizer")
	require.Len(t, live.GetFinalizers(), before, "finalizers on the server")
	e.requireRecord(t, live, rec)

	// Removing it when absent is fine.
	e.mustWrite(t, out, rec, false)
}

func testFinalizerDeletion(t *testing.T, e *env) {
	claim := e.create(t, "deleted", nil, nil)
	out := e.mustWrite(t, claim, syncer.Record{Allocated: []string{"pod-a"}}, true)

	require.NoError(t, e.c.Delete(t.Context(), e.fetch(t, claim)), "delete claim")
	live := e.fetch(t, claim)
	require.NotNil(t, live.GetDeletionTimestamp(), "claim with the finalizer is gone or not terminating")
	require.True(t, e.s.HasFinalizer(live))

	// A write from the object before the delete is stale.
	_, err := e.write(t, out, syncer.Record{Allocated: []string{"pod-a"}, Released: []string{"pod-a"}}, false)
	require.True(t, apierrors.IsConflict(err), "write from before the delete: want Conflict, got %v", err)

	_, err = e.write(t, live, syncer.Record{Allocated: []string{"pod-a"}, Released: []string{"pod-a"}}, false)
	require.NoError(t, err, "release the last pod and drop the finalizer")
	_, err = e.get(t, claim)
	require.True(t, apierrors.IsNotFound(err), "claim without finalizers should be gone, Get: %v", err)
}

func testOthersSurvive(t *testing.T, e *env) {
	claim := e.create(t, "others", []string{otherFinalizer}, map[string]string{otherAnnotation: "keep me"})

	check := func(obj client.Object, step string) {
		t.Helper()
		require.Contains(t, obj.GetFinalizers(), otherFinalizer, "%s: other finalizer lost", step)
		require.Equal(t, "keep me", obj.GetAnnotations()[otherAnnotation], "%s: other annotation lost", step)
	}
	out := e.mustWrite(t, claim, syncer.Record{Allocated: []string{"pod-a"}}, true)
	check(out, "add")
	check(e.fetch(t, claim), "add, on the server")
	require.True(t, e.s.HasFinalizer(out))

	// Someone else edits the claim; the next write starts from a fresh read.
	live := e.setAnnotation(t, out, "example.com/later", "also keep me")
	out = e.mustWrite(t, live, syncer.Record{Allocated: []string{"pod-a"}, Released: []string{"pod-a"}}, false)
	check(out, "remove")
	live = e.fetch(t, claim)
	check(live, "remove, on the server")
	require.Equal(t, "also keep me", live.GetAnnotations()["example.com/later"])
	require.False(t, e.s.HasFinalizer(live))
}

func testStaleWrite(t *testing.T, e *env) {
	claim := e.create(t, "stale", []string{otherFinalizer}, nil)
	current := e.touch(t, claim, "1")
	serverBefore := e.fetch(t, claim)
	require.Equal(t, current.GetResourceVersion(), serverBefore.GetResourceVersion())

	for _, finalizer := range []bool{true, false} {
		_, err := e.write(t, claim, syncer.Record{Allocated: []string{"pod-a"}}, finalizer)
		require.Error(t, err, "write from a stale object succeeded")
		require.True(t, apierrors.IsConflict(err), "want Conflict, got %v", err)
		require.Equal(t, serverBefore, e.fetch(t, claim), "a refused write changed the claim on the server")
	}

	// From the current object it works.
	out := e.mustWrite(t, current, syncer.Record{Allocated: []string{"pod-a"}}, true)
	require.Contains(t, out.GetFinalizers(), otherFinalizer)
	require.Equal(t, "1", out.GetLabels()[touchLabel])
}

// testNewVersion writes what the claim holds already, again and again: an
// API server keeps the resourceVersion of a patch that changes nothing, so
// a syncer that sends only the record would return the claim unchanged.
func testNewVersion(t *testing.T, e *env) {
	claim := e.create(t, "new-version", nil, nil)
	rec := syncer.Record{Allocated: []string{"pod-a", "pod-b"}, Released: []string{"pod-b"}}
	first := e.mustWrite(t, claim, rec, true)
	seen := map[string]bool{claim.GetResourceVersion(): true, first.GetResourceVersion(): true}
	require.Len(t, seen, 2, "a write that changes the record kept the resourceVersion")
	prev := first
	for i := range 3 {
		out := e.mustWrite(t, prev, rec, true)
		require.False(t, seen[out.GetResourceVersion()],
			"write %d of what the claim holds returned resourceVersion %s, seen before", i+1, out.GetResourceVersion())
		seen[out.GetResourceVersion()] = true
		live := e.fetch(t, claim)
		require.Equal(t, out.GetResourceVersion(), live.GetResourceVersion(), "write %d: not the object as stored", i+1)
		e.requireRecord(t, live, rec)
		require.True(t, e.s.HasFinalizer(live), "write %d: finalizer gone", i+1)
		require.Len(t, live.GetFinalizers(), len(first.GetFinalizers()), "write %d: finalizers", i+1)
		prev = out
	}
	// Such a write from a stale object is still a conflict.
	_, err := e.write(t, first, rec, true)
	require.True(t, apierrors.IsConflict(err), "stale write of what the claim holds: want a Conflict, got %v", err)
	require.Equal(t, prev.GetResourceVersion(), e.fetch(t, claim).GetResourceVersion(), "the stale write changed the claim")
}

func testConcurrentSameObject(t *testing.T, e *env) {
	claim := e.create(t, "race", nil, nil)
	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, errs[i] = e.s.Write(t.Context(), claim, syncer.Record{Allocated: []string{fmt.Sprintf("pod-%d", i)}}, true)
		})
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		if err == nil {
			require.Equal(t, -1, won, "two writes from the same object both succeeded")
			won = i
			continue
		}
		require.True(t, apierrors.IsConflict(err), "writer %d: want Conflict, got %v", i, err)
	}
	require.NotEqual(t, -1, won, "no write succeeded")
	e.requireRecord(t, e.fetch(t, claim), syncer.Record{Allocated: []string{fmt.Sprintf("pod-%d", won)}})
}

func testNotMutated(t *testing.T, e *env) {
	claim := e.create(t, "immutable", []string{otherFinalizer}, map[string]string{otherAnnotation: "x"})

	// Every method, on success and on error, through the checking helpers.
	_, err := e.read(t, claim)
	require.NoError(t, err)
	_ = e.s.HasFinalizer(claim)
	out := e.mustWrite(t, claim, syncer.Record{Allocated: []string{"pod-a", "pod-b"}}, true)
	_, err = e.write(t, claim, syncer.Record{Allocated: []string{"pod-c"}}, true) // stale now
	require.True(t, apierrors.IsConflict(err), "want Conflict, got %v", err)
	_, err = e.write(t, out, syncer.Record{Allocated: []string{"pod-a", "pod-a"}}, true)
	require.Error(t, err, "write of a pod listed twice")
	_, err = e.write(t, out, syncer.Record{Allocated: bigPods(1100)}, true)
	require.Error(t, err, "write of a record over the limit")
	_, err = e.get(t, claim)
	require.NoError(t, err)

	// The returned object is the caller's to change: doing so changes
	// neither the server nor a later Get.
	out.SetAnnotations(map[string]string{"example.com/scribble": "x"})
	out.SetFinalizers(nil)
	live, err := e.get(t, claim)
	require.NoError(t, err)
	require.True(t, e.s.HasFinalizer(live))
	require.Contains(t, live.GetFinalizers(), otherFinalizer)
	e.requireRecord(t, live, syncer.Record{Allocated: []string{"pod-a", "pod-b"}})
}

func testTooLarge(t *testing.T, e *env) {
	claim := e.create(t, "toolarge", nil, map[string]string{otherAnnotation: "x"})
	claim = e.mustWrite(t, claim, syncer.Record{Allocated: []string{"pod-a"}}, true)
	serverBefore := e.fetch(t, claim)

	for _, rec := range []syncer.Record{
		{Allocated: bigPods(1100)},
		{Allocated: []string{"pod-a"}, Released: bigPods(1100)},
		// Each list fits; together they do not.
		{Allocated: bigPods(600), Released: bigPods(600)},
	} {
		_, err := e.write(t, claim, rec, true)
		require.Error(t, err, "record of %d+%d pods was written", len(rec.Allocated), len(rec.Released))
		require.True(t, errors.Is(err, syncer.ErrRecordTooLarge), "want ErrRecordTooLarge, got %v", err)
		require.False(t, apierrors.IsInvalid(err), "the record reached the API server: %v", err)
		require.Equal(t, serverBefore, e.fetch(t, claim), "a refused write changed the claim on the server")
	}
}

func testLargeWithinLimit(t *testing.T, e *env) {
	claim := e.create(t, "large", nil, nil)
	rec := syncer.Record{Allocated: bigPods(900)}
	out := e.mustWrite(t, claim, rec, true)
	e.requireRecord(t, out, rec)
	e.requireRecord(t, e.fetch(t, claim), rec)
}

func testGet(t *testing.T, e *env) {
	claim := e.create(t, "get", nil, nil)
	touched := e.touch(t, claim, "2")

	live, err := e.get(t, claim)
	require.NoError(t, err, "Get")
	require.Equal(t, claim.GetName(), live.GetName())
	require.Equal(t, claim.GetNamespace(), live.GetNamespace())
	require.Equal(t, touched.GetResourceVersion(), live.GetResourceVersion(), "Get did not return the live object")
	require.Equal(t, "2", live.GetLabels()[touchLabel])

	require.NoError(t, e.c.Delete(t.Context(), live), "delete claim")
	_, err = e.get(t, claim)
	require.True(t, apierrors.IsNotFound(err), "Get of a deleted claim: want NotFound, got %v", err)
	_, err = e.write(t, live, syncer.Record{Allocated: []string{"pod-a"}}, true)
	require.True(t, apierrors.IsNotFound(err), "Write to a deleted claim: want NotFound, got %v", err)
}

func testMalformed(t *testing.T, e *env) {
	claim := e.create(t, "malformed", nil, nil)
	allocKey, allocVal := changedAnnotation(t, claim,
		e.mustWrite(t, claim, syncer.Record{Allocated: []string{"pod-a", "pod-b"}}, false))
	claim = e.fetch(t, claim)
	releasedKey, releasedVal := changedAnnotation(t, claim,
		e.mustWrite(t, claim, syncer.Record{Allocated: []string{"pod-a", "pod-b"}, Released: []string{"pod-a", "pod-b"}}, false))
	if allocKey == "" || releasedKey == "" {
		t.Skip("the syncer keeps its record outside annotations; nothing to corrupt")
	}

	for _, target := range []struct{ key, good string }{{allocKey, allocVal}, {releasedKey, releasedVal}} {
		bad := map[string]string{
			"truncated":       target.good[:len(target.good)/2],
			"garbage":         "\x00 not a record",
			"pod twice":       strings.ReplaceAll(target.good, "pod-b", "pod-a"),
			"invalid name":    strings.ReplaceAll(target.good, "pod-b", "Pod_B!"),
			"whitespace only": " ",
		}
		for what, value := range bad {
			live := e.setAnnotation(t, e.fetch(t, claim), target.key, value)
			_, err := e.read(t, live)
			require.Error(t, err, "%s %s %q: Read accepted it", target.key, what, value)
			var re *syncer.RecordError
			require.True(t, errors.As(err, &re), "%s %s: want *syncer.RecordError, got %T: %v", target.key, what, err, err)
			require.Equal(t, client.ObjectKeyFromObject(claim), re.Claim, "%s %s: RecordError.Claim", target.key, what)
			require.Equal(t, target.key, re.Key, "%s %s: RecordError.Key", target.key, what)
			require.NotEmpty(t, re.Reason, "%s %s: RecordError.Reason", target.key, what)
			require.True(t, errors.Is(err, syncer.ErrMalformedRecord), "%s %s: want ErrMalformedRecord, got %v", target.key, what, err)
		}
		e.setAnnotation(t, e.fetch(t, claim), target.key, target.good)
	}
}

func testConcurrentUse(t *testing.T, e *env) {
	const n = 8
	claims := make([]client.Object, n)
	for i := range claims {
		claims[i] = e.create(t, fmt.Sprintf("concurrent-%d", i), nil, nil)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, claim := range claims {
		wg.Go(func() {
			errs[i] = func() error {
				ctx := t.Context()
				obj := claim
				for round := range 3 {
					rec := syncer.Record{Allocated: []string{fmt.Sprintf("pod-%d-%d", i, round)}}
					out, err := e.s.Write(ctx, obj, rec, round < 2)
					if err != nil {
						return fmt.Errorf("round %d: Write: %w", round, err)
					}
					got, err := e.s.Read(out)
					if err != nil {
						return fmt.Errorf("round %d: Read: %w", round, err)
					}
					if !slices.Equal(got.Allocated, rec.Allocated) {
						return fmt.Errorf("round %d: read %v, wrote %v", round, got.Allocated, rec.Allocated)
					}
					if obj, err = e.s.Get(ctx, obj); err != nil {
						return fmt.Errorf("round %d: Get: %w", round, err)
					}
					_ = e.s.HasFinalizer(obj)
				}
				return nil
			}()
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "claim %d", i)
	}
}

// changedAnnotation returns the one annotation that differs between before
// and after, or "" if none does.
func changedAnnotation(t *testing.T, before, after client.Object) (key, value string) {
	t.Helper()
	old := before.GetAnnotations()
	for k, v := range after.GetAnnotations() {
		if ov, ok := old[k]; !ok || ov != v {
			require.Empty(t, key, "one write changed annotations %q and %q", key, k)
			key, value = k, v
		}
	}
	return key, value
}

// bigPods returns n distinct valid pod names of 252 bytes each.
func bigPods(n int) []string {
	prefix := strings.Repeat(strings.Repeat("a", 63)+".", 3)
	pods := make([]string, n)
	for i := range pods {
		pods[i] = fmt.Sprintf("%sp%059d", prefix, i)
	}
	return pods
}

// newEmpty returns a new object of obj's Go type to read into.
func newEmpty(obj client.Object) (client.Object, error) {
	if _, ok := obj.(*unstructured.Unstructured); ok {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(obj.GetObjectKind().GroupVersionKind())
		return u, nil
	}
	typ := reflect.TypeOf(obj)
	if typ.Kind() != reflect.Pointer || typ.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("claim type %T is not a pointer to a struct", obj)
	}
	out, ok := reflect.New(typ.Elem()).Interface().(client.Object)
	if !ok {
		return nil, fmt.Errorf("new %T is not a client.Object", obj)
	}
	if gvk := obj.GetObjectKind().GroupVersionKind(); !gvk.Empty() {
		out.GetObjectKind().SetGroupVersionKind(gvk)
	}
	return out, nil
}
