package allocator_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

// OpenSandbox's annotations and finalizer, spelled out: these tests check
// the records against them, not against the syncer's keys.
const (
	osAllocStatus   = "sandbox.opensandbox.io/alloc-status"
	osAllocRelease  = "sandbox.opensandbox.io/alloc-release"
	osAllocReleased = "sandbox.opensandbox.io/alloc-released"
	osFinalizer     = "pool.sandbox.opensandbox.io/pool-allocation"
)

// osList is a list as OpenSandbox's controller writes it (json.Marshal of
// a struct with one field "pods").
func osList(pods ...string) string {
	b := []byte(`{"pods":[`)
	for i, p := range pods {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, p)
	}
	return string(append(b, "]}"...))
}

// osFixture is a fixture whose records are OpenSandbox's, with a pool "p"
// of n ready pods.
func osFixture(t *testing.T, n int) (*fixture, types.NamespacedName) {
	f := newFixture(t)
	f.keys = syncer.OpenSandboxKeys()
	return f, f.pool("p", n)
}

// osClaim creates a claim as OpenSandbox's controller leaves it: with
// these annotations and its finalizer.
func (f *fixture) osClaim(name, pool string, replicas int32, ann map[string]string) {
	f.t.Helper()
	c := testenv.NewClaim(f.ns, name, pool, replicas)
	c.Annotations = ann
	c.Finalizers = []string{osFinalizer}
	require.NoError(f.t, f.c.Create(f.ctx, c))
}

// osRecord is a claim's record annotations and whether it carries
// OpenSandbox's finalizer.
type osRecord struct {
	status, released string
	finalizer        bool
}

func (f *fixture) osRecord(name string) osRecord {
	f.t.Helper()
	c := f.get(name)
	return osRecord{
		status:    c.Annotations[osAllocStatus],
		released:  c.Annotations[osAllocReleased],
		finalizer: slices.Contains(c.Finalizers, osFinalizer),
	}
}

// settle runs rounds until one changes nothing, at most n.
func (f *fixture) settle(a allocator.Allocator, pool types.NamespacedName, n int) allocator.Result {
	f.t.Helper()
	var all allocator.Result
	for range n {
		res := f.round(a, pool)
		all.Allocated = append(all.Allocated, res.Allocated...)
		all.Released = append(all.Released, res.Released...)
		if len(res.Allocated) == 0 && len(res.Released) == 0 && len(res.Recycling) == 0 {
			return all
		}
	}
	f.t.Fatalf("pool %s did not settle in %d rounds", pool, n)
	return all
}

func TestOpenSandboxModeRecordsAsOpenSandboxWritesThem(t *testing.T) {
	for _, marks := range []bool{true, false} {
		t.Run("marks="+strconv.FormatBool(marks), func(t *testing.T) {
			f, pool := osFixture(t, 5)
			a := f.alloc(allocator.WithOpenSandbox(), allocator.WithPodMarks(marks))
			f.claim("sbx", "p", 2)

			res := f.settle(a, pool, 3)
			first := grantsTo(res, "sbx")
			require.Len(t, first, 2)
			require.Equal(t, osRecord{status: osList(first...), finalizer: true}, f.osRecord("sbx"),
				"pods listed in the order handed out")

			// The owner gives one back, as OpenSandbox's sandbox
			// controller writes it.
			f.setAnnotation("sbx", osAllocRelease, osList(first[0]))
			res = f.settle(a, pool, 4)
			require.Empty(t, res.Allocated, "replicas bound the claim's lifetime: a released pod is not refilled")
			require.Equal(t, osRecord{status: osList(first...), released: osList(first[0]), finalizer: true}, f.osRecord("sbx"),
				"the released pod stays in alloc-status")
			require.Equal(t, []string{first[1]}, f.held("sbx"))

			// Lowering replicas gives nothing back.
			f.scale("sbx", 1)
			f.settle(a, pool, 3)
			require.Equal(t, []string{first[1]}, f.held("sbx"))

			// Raising them past what the record lists hands out more,
			// never the released pod, appended.
			f.scale("sbx", 4)
			res = f.settle(a, pool, 3)
			more := grantsTo(res, "sbx")
			require.Len(t, more, 2, "4 over the lifetime, 2 listed")
			require.NotContains(t, more, first[0], "a released pod is not handed back: the format cannot say so")
			require.Equal(t, osRecord{status: osList(slices.Concat(first, more)...), released: osList(first[0]), finalizer: true},
				f.osRecord("sbx"))

			// The owner releases everything it holds: the finalizer stays
			// while the claim lives.
			f.setAnnotation("sbx", osAllocRelease, osList(slices.Sorted(slices.Values(slices.Concat(first, more)))...))
			f.settle(a, pool, 4)
			got := f.osRecord("sbx")
			require.True(t, got.finalizer, "a live claim keeps the finalizer")
			require.Equal(t, osList(slices.Concat(first, more)...), got.status)
			require.Empty(t, f.held("sbx"))
			s, err := syncer.NewAnnotationSyncer(f.c, f.keys, syncer.WithOpenSandboxFormat())
			require.NoError(t, err)
			rec, err := s.Read(f.get("sbx"))
			require.NoError(t, err)
			require.Equal(t, first[0], rec.Released[0], "released in the order recycled")
			require.ElementsMatch(t, slices.Concat(first, more), rec.Released)

			// Deleted, it goes once nothing is left to release.
			require.NoError(t, f.c.Delete(f.ctx, f.get("sbx")))
			f.settle(a, pool, 3)
			require.True(t, f.gone("sbx"))
			require.Empty(t, f.snapshot(a, pool))
		})
	}
}

func TestOpenSandboxModeTakesOverRecordsWithRepeats(t *testing.T) {
	// What OpenSandbox's controller writes after a noop-recycled release
	// and a replicas increase that handed the same pod back: p-0 twice in
	// alloc-status and once in alloc-released.
	setup := func(t *testing.T) (*fixture, types.NamespacedName) {
		f, pool := osFixture(t, 4)
		f.osClaim("sbx", "p", 3, map[string]string{
			osAllocStatus:   osList("p-0", "p-0", "p-2"),
			osAllocRelease:  osList("p-0"),
			osAllocReleased: osList("p-0"),
		})
		return f, pool
	}
	t.Run("open-sandbox-mode", func(t *testing.T) {
		f, pool := setup(t)
		a := f.alloc(allocator.WithOpenSandbox(), allocator.WithPodMarkMigration(true))
		res := f.settle(a, pool, 3)
		got := grantsTo(res, "sbx")
		require.Len(t, got, 1, "3 over the lifetime: p-2 held, p-0 released, one more")
		require.NotEqual(t, "p-0", got[0])
		require.Equal(t, osRecord{status: osList("p-0", "p-0", "p-2", got[0]), released: osList("p-0"), finalizer: true}, f.osRecord("sbx"),
			"the record as OpenSandbox would go on writing it, repeat kept")
		require.Equal(t, map[string]string{"p-2": "sbx", got[0]: "sbx"}, f.snapshot(a, pool),
			"a repeat is one pod, and a released pod is not held however often it is listed")
	})
	t.Run("open-sandbox-mode-without-marks", func(t *testing.T) {
		f, pool := setup(t)
		a := f.alloc(allocator.WithOpenSandbox(), allocator.WithPodMarks(false))
		res := f.settle(a, pool, 3)
		got := grantsTo(res, "sbx")
		require.Len(t, got, 1)
		require.NotEqual(t, "p-0", got[0])
		require.Equal(t, osRecord{status: osList("p-0", "p-0", "p-2", got[0]), released: osList("p-0"), finalizer: true}, f.osRecord("sbx"))
		require.Equal(t, map[string]string{"p-2": "sbx", got[0]: "sbx"}, f.snapshot(a, pool))
		require.Empty(t, f.marks("p"), "no marks written")
	})
	t.Run("default-format-refuses-repeats", func(t *testing.T) {
		f, pool := setup(t)
		a := f.alloc(allocator.WithKeys(syncer.OpenSandboxKeys()), allocator.WithPodMarkMigration(true))
		_, err := world.Round(f.ctx, a, f.c, pool)
		require.ErrorIs(t, err, syncer.ErrMalformedRecord)
		require.ErrorContains(t, err, "listed twice")
	})
}

func TestOpenSandboxRollbackAndReturn(t *testing.T) {
	// poolalloc hands a pod to s1 and marks it; the operator rolls back to
	// OpenSandbox's controller, which knows nothing of marks: s1 gives
	// the pod back, the controller recycles it (noop) and hands it to a
	// new sandbox s2. Then poolalloc returns, with migration on.
	f, pool := osFixture(t, 3)
	a1 := f.alloc(allocator.WithOpenSandbox())
	f.claim("s1", "p", 1)
	res := f.settle(a1, pool, 3)
	pods := grantsTo(res, "s1")
	require.Len(t, pods, 1)
	x := pods[0]
	s1 := f.get("s1")
	require.Equal(t, "s1/"+string(s1.UID), f.marks("p")[x])

	// OpenSandbox's era, as its controllers write it.
	f.setAnnotation("s1", osAllocRelease, osList(x))
	f.setAnnotation("s1", osAllocReleased, osList(x))
	f.osClaim("s2", "p", 1, map[string]string{osAllocStatus: osList(x)})

	a2 := f.alloc(allocator.WithOpenSandbox(), allocator.WithPodMarkMigration(true))
	res = f.settle(a2, pool, 6)
	require.Empty(t, res.Released, "nothing is taken from s2: its record is newer than the mark")
	require.Empty(t, grantsTo(res, "s2"), "s2 keeps its pod and wants no other")
	require.Empty(t, grantsTo(res, "s1"))
	require.Equal(t, map[string]string{x: "s2"}, f.snapshot(a2, pool))
	require.Equal(t, "s2/"+string(f.get("s2").UID), f.marks("p")[x], "re-marked for the claim whose record is newer")
	require.Equal(t, osRecord{status: osList(x), finalizer: true}, f.osRecord("s2"))
	require.Equal(t, osRecord{status: osList(x), released: osList(x), finalizer: true}, f.osRecord("s1"))
}

// osView is what OpenSandbox's controller makes of a claim's records when
// it takes a pool back: the pods the sandbox holds (the set of alloc-status
// minus the set of alloc-released) and how many more it would hand out
// (replicas less the length of alloc-status).
func osView(t *testing.T, f *fixture, name string) (held []string, supplement int32) {
	t.Helper()
	s, err := syncer.NewAnnotationSyncer(f.c, syncer.OpenSandboxKeys(), syncer.WithOpenSandboxFormat())
	require.NoError(t, err)
	c := f.get(name)
	rec, err := s.Read(c)
	require.NoError(t, err)
	held = rec.Held()
	slices.Sort(held)
	return held, max(0, c.Spec.Replicas-int32(len(rec.Allocated)))
}

func TestOpenSandboxModeRecyclingAndHandBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		// recycler returns the recycler, given the fixture; done says
		// after how many calls a pod is recycled.
		recycler func(f *fixture) allocator.Recycler
	}{
		{"noop", func(*fixture) allocator.Recycler { return allocator.RecycleNoop }},
		{"delete", func(f *fixture) allocator.Recycler {
			// RecycleDelete, with no grace period: no kubelet confirms a
			// graceful deletion here.
			return func(ctx context.Context, req allocator.RecycleRequest) (bool, error) {
				pod := &corev1.Pod{}
				pod.Namespace, pod.Name = req.Pool.Namespace, req.Pod
				err := f.c.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &req.UID})
				if apierrors.IsNotFound(err) {
					err = nil
				}
				return false, err // done once it has left the listing
			}
		}},
		{"restart", func(*fixture) allocator.Recycler {
			// A restart takes two rounds: the first starts it.
			var mu sync.Mutex
			calls := map[string]int{}
			return func(_ context.Context, req allocator.RecycleRequest) (bool, error) {
				mu.Lock()
				defer mu.Unlock()
				calls[req.Pod]++
				return calls[req.Pod] > 1, nil
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, pool := osFixture(t, 3)
			a := f.alloc(allocator.WithOpenSandbox(), allocator.WithRecycler(tc.recycler(f)))
			f.claim("sbx", "p", 2)
			first := grantsTo(f.settle(a, pool, 3), "sbx")
			require.Len(t, first, 2)

			f.setAnnotation("sbx", osAllocRelease, osList(first[1]))
			res := f.round(a, pool)
			if tc.name == "restart" {
				require.Equal(t, []string{first[1]}, res.Recycling)
				require.Equal(t, osRecord{status: osList(first...), finalizer: true}, f.osRecord("sbx"),
					"not released before the restart is done")
			}
			f.settle(a, pool, 4)
			require.Equal(t, osRecord{status: osList(first...), released: osList(first[1]), finalizer: true}, f.osRecord("sbx"))
			if tc.name == "delete" {
				require.True(t, f.podGone(first[1]), "the delete recycler deleted it")
			}

			// Scale up past the lifetime bound: one more pod, never the
			// released one (a deleted pod's name would do for a fresh pod
			// under it: not here, the pool creates none).
			f.scale("sbx", 3)
			more := grantsTo(f.settle(a, pool, 3), "sbx")
			require.Len(t, more, 1)
			require.NotEqual(t, first[1], more[0])
			require.Equal(t, osRecord{status: osList(first[0], first[1], more[0]), released: osList(first[1]), finalizer: true}, f.osRecord("sbx"))

			// Handed back to OpenSandbox's controller: it sees what
			// poolalloc holds, and nothing to hand out.
			held, supplement := osView(t, f, "sbx")
			require.Equal(t, f.held("sbx"), held)
			require.Equal(t, []string{first[0], more[0]}, sortedStrings(mapKeys(f.snapshot(a, pool))))
			require.Zero(t, supplement, "OpenSandbox would hand out nothing more")
		})
	}
}

func sortedStrings(s []string) []string { slices.Sort(s); return s }

func (f *fixture) podGone(name string) bool {
	err := f.c.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, &corev1.Pod{})
	return apierrors.IsNotFound(err)
}

func TestOpenSandboxReleasedPodGoesToAnotherClaim(t *testing.T) {
	// s1, served first, released p-0 and may get one more pod; p-0 is the
	// only free pod. The strategy offers it to s1, which cannot take it
	// back: it goes to s2 instead, not nowhere.
	f, pool := osFixture(t, 1)
	a := f.alloc(allocator.WithOpenSandbox())
	f.claim("s1", "p", 1)
	require.Equal(t, []string{"p-0"}, grantsTo(f.settle(a, pool, 3), "s1"))
	f.setAnnotation("s1", osAllocRelease, osList("p-0"))
	f.settle(a, pool, 4)
	f.scale("s1", 2)
	f.claim("s2", "p", 1)
	res := f.settle(a, pool, 3)
	require.Empty(t, grantsTo(res, "s1"))
	require.Equal(t, []string{"p-0"}, grantsTo(res, "s2"))
	require.Equal(t, osRecord{status: osList("p-0"), finalizer: true}, f.osRecord("s2"))
	require.Equal(t, osRecord{status: osList("p-0"), released: osList("p-0"), finalizer: true}, f.osRecord("s1"))
}

func TestOpenSandboxDetachedSandboxDoesNotGetTheFinalizerBack(t *testing.T) {
	// OpenSandbox's pause detaches a pooled sandbox: it empties
	// spec.poolRef and takes the pool finalizer off itself. The pool
	// gives its pods back and must not put the finalizer back on, or
	// the sandbox could never be deleted: no pool lists it any more.
	f, pool := osFixture(t, 2)
	a := f.alloc(allocator.WithOpenSandbox(), allocator.WithClaimPool(claimPoolRef))
	f.claim("sbx", "p", 1)
	got := grantsTo(f.settle(a, pool, 3), "sbx")
	require.Len(t, got, 1)
	f.movePool("sbx", "", func(c *testenv.Claim) {
		c.Finalizers = slices.DeleteFunc(c.Finalizers, func(s string) bool { return s == osFinalizer })
	})
	res := f.settle(a, pool, 3)
	require.Len(t, res.Released, 1)
	require.Equal(t, osRecord{status: osList(got...), released: osList(got...)}, f.osRecord("sbx"))
	require.NoError(t, f.c.Delete(f.ctx, f.get("sbx")))
	require.True(t, f.gone("sbx"))
}
