package allocator_test

// WithMarkHook (issue 24): the caller's change to a pod rides the patch
// that marks it, and the patch that unmarks it takes the change off; bad
// changes are refused before anything is written. On the real API server
// and the fake client, counting writes.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

// writeLog counts the writes that reach the server through a client, by
// the kind of object written.
type writeLog struct {
	mu     sync.Mutex
	counts map[string]int // "pod", "claim", "other"
}

func (w *writeLog) add(c client.Client, obj client.Object) {
	kind := "other"
	switch obj.(type) {
	case *corev1.Pod:
		kind = "pod"
	case *testenv.Claim:
		kind = "claim"
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.counts == nil {
		w.counts = map[string]int{}
	}
	w.counts[kind]++
}

// take returns the counts since the last take and starts again.
func (w *writeLog) take() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.counts
	w.counts = nil
	if out == nil {
		out = map[string]int{}
	}
	return out
}

// funcs are interceptor functions that count every write, on the object,
// its status or any other subresource.
func (w *writeLog) funcs() interceptor.Funcs {
	return interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			w.add(c, obj)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			w.add(c, obj)
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			w.add(c, obj)
			return c.Patch(ctx, obj, patch, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			w.add(c, obj)
			return c.Delete(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			w.add(c, obj)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			w.add(c, obj)
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	}
}

// onBothCounted runs test on the real API server and on the fake client,
// each behind a client that counts writes in the writeLog it is given
// (for the allocator), and a plain one (for the test's own writes).
func onBothCounted(t *testing.T, test func(t *testing.T, counted, plain client.Client, ns string, w *writeLog)) {
	t.Run("apiserver", func(t *testing.T) {
		w := &writeLog{}
		base, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
		require.NoError(t, err)
		test(t, interceptor.NewClient(base, w.funcs()), env.Client, env.Namespace(context.Background(), t), w)
	})
	t.Run("fake", func(t *testing.T) {
		w := &writeLog{}
		plain := newFakeClient(t, nil)
		test(t, interceptor.NewClient(plain.(client.WithWatch), w.funcs()), plain, "ns", w)
	})
}

// routeLabel is the label the tests' hooks route by.
const routeLabel = "example.com/claim"

// routeHook labels a pod with its claim's name, annotates it and makes
// the claim one of its owners.
func routeHook(p allocator.MarkedPod) allocator.PodChange {
	return allocator.PodChange{
		Labels:      map[string]string{routeLabel: p.Claim.Claim.Name},
		Annotations: map[string]string{"example.com/handed-out": "yes"},
		Owners: []metav1.OwnerReference{{
			APIVersion: testenv.GroupVersion.String(), Kind: "Claim", Name: p.Claim.Claim.Name, UID: p.Claim.UID,
		}},
	}
}

func getPod(t *testing.T, c client.Client, ns, name string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{}
	require.NoError(t, c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, p))
	return p
}

// TestMarkHookRidesTheMarkingWrite: a claim handed two pods costs two pod
// writes and one claim write with the hook as without it, and each pod
// carries the hook's labels, annotations and owner reference beside its
// mark; when the claim gives a pod back, the one patch that removes its
// mark takes them off again, and the pods the claim holds keep them.
func TestMarkHookRidesTheMarkingWrite(t *testing.T) {
	onBothCounted(t, func(t *testing.T, counted, plain client.Client, ns string, w *writeLog) {
		ctx := context.Background()
		pool, _ := poolIn(t, plain, ns, 3)
		cl := newClaimIn(t, plain, ns, "c", 2)
		require.NoError(t, plain.Get(ctx, client.ObjectKeyFromObject(cl), cl))
		a, err := allocator.New(counted, allocator.WithMarkHook(routeHook))
		require.NoError(t, err)

		res, err := world.Round(ctx, a, plain, pool)
		require.NoError(t, err)
		require.Len(t, res.Allocated, 1)
		require.Equal(t, map[string]int{"pod": 2, "claim": 1}, w.take(), "one write per pod and one per claim")
		held := recordIn(t, plain, ns, "c").Held()
		require.Len(t, held, 2)
		for _, name := range held {
			p := getPod(t, plain, ns, name)
			require.Equal(t, "c/"+string(cl.UID), p.Annotations[allocator.DefaultPodMarkKey])
			require.Equal(t, "c", p.Labels[routeLabel])
			require.Equal(t, "p", p.Labels[testenv.PoolLabel], "the pool label is kept")
			require.Equal(t, "yes", p.Annotations["example.com/handed-out"])
			require.Len(t, p.OwnerReferences, 1)
			require.Equal(t, cl.UID, p.OwnerReferences[0].UID)
		}

		// Nothing changes: no write.
		_, err = world.Round(ctx, a, plain, pool)
		require.NoError(t, err)
		require.Empty(t, w.take())

		// The claim gives one pod back.
		kept, gone := held[0], held[1]
		releaseIn(t, plain, ns, "c", gone)
		for range 3 {
			_, err = world.Round(ctx, a, plain, pool)
			require.NoError(t, err)
		}
		// The mark of its replacement and the unmark (RecycleNoop needs
		// no fence): two pod writes, and one claim write for the release
		// and the replacement; as many as without the hook.
		require.Equal(t, map[string]int{"pod": 2, "claim": 1}, w.take())
		p := getPod(t, plain, ns, gone)
		require.NotContains(t, p.Annotations, allocator.DefaultPodMarkKey)
		require.NotContains(t, p.Labels, routeLabel)
		require.Equal(t, "p", p.Labels[testenv.PoolLabel])
		require.NotContains(t, p.Annotations, "example.com/handed-out")
		require.Empty(t, p.OwnerReferences)
		now := recordIn(t, plain, ns, "c").Held()
		require.Contains(t, now, kept)
		require.NotContains(t, now, gone)
		for _, name := range now {
			p = getPod(t, plain, ns, name)
			require.Equal(t, "c", p.Labels[routeLabel])
			require.Len(t, p.OwnerReferences, 1)
		}
		require.NoError(t, allocator.CheckInvariants(a))
	})
}

func snapshotOf(t *testing.T, a allocator.Allocator, pool types.NamespacedName) map[string]string {
	t.Helper()
	snap, err := a.Store().Snapshot(pool)
	require.NoError(t, err)
	out := map[string]string{}
	for pod, h := range snap {
		out[pod] = h.Claim.Name
	}
	return out
}

// releaseIn sets claim name's release list to pods.
func releaseIn(t *testing.T, c client.Client, ns, name string, pods ...string) {
	t.Helper()
	f := &fixture{t: t, ctx: context.Background(), c: c, ns: ns, keys: syncer.DefaultKeys()}
	f.release(name, pods...)
}

// TestMarkHookBadChangeRefused: a change the allocator cannot write safely
// is refused before any write, with an error matching ErrPodChange that
// names the pod; the claim is not served and no pod is marked, and once
// the hook is right the next round serves it.
func TestMarkHookBadChangeRefused(t *testing.T) {
	yes := true
	cases := []struct {
		name   string
		change func(p allocator.MarkedPod) allocator.PodChange
		want   string
	}{
		{"the pool label", func(allocator.MarkedPod) allocator.PodChange {
			return allocator.PodChange{Labels: map[string]string{testenv.PoolLabel: "other"}}
		}, "carries it already"},
		{"the pool label, same value", func(allocator.MarkedPod) allocator.PodChange {
			return allocator.PodChange{Labels: map[string]string{testenv.PoolLabel: "p"}}
		}, "carries it already"},
		{"the mark", func(p allocator.MarkedPod) allocator.PodChange {
			return allocator.PodChange{Annotations: map[string]string{allocator.DefaultPodMarkKey: "x/y"}}
		}, "the allocator's own"},
		{"the recycling stamp", func(p allocator.MarkedPod) allocator.PodChange {
			return allocator.PodChange{Annotations: map[string]string{allocator.DefaultPodMarkKey + "-recycling": "x"}}
		}, "the allocator's own"},
		{"an invalid label value", func(allocator.MarkedPod) allocator.PodChange {
			return allocator.PodChange{Labels: map[string]string{routeLabel: "not a value"}}
		}, "value"},
		{"an invalid annotation key", func(allocator.MarkedPod) allocator.PodChange {
			return allocator.PodChange{Annotations: map[string]string{"a b": "x"}}
		}, "annotation key"},
		{"a controller owner", func(p allocator.MarkedPod) allocator.PodChange {
			return allocator.PodChange{Owners: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u", Controller: &yes}}}
		}, "controller"},
		{"an owner without a UID", func(p allocator.MarkedPod) allocator.PodChange {
			return allocator.PodChange{Owners: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x"}}}
		}, "uid"},
		{"a panic", func(allocator.MarkedPod) allocator.PodChange { panic("boom") }, "panicked: boom"},
	}
	onBothCounted(t, func(t *testing.T, counted, plain client.Client, ns string, w *writeLog) {
		ctx := context.Background()
		pool, _ := poolIn(t, plain, ns, 1)
		newClaimIn(t, plain, ns, "c", 1)
		var bad atomic.Pointer[func(allocator.MarkedPod) allocator.PodChange]
		a, err := allocator.New(counted, allocator.WithMarkHook(func(p allocator.MarkedPod) allocator.PodChange {
			if f := bad.Load(); f != nil {
				return (*f)(p)
			}
			return routeHook(p)
		}))
		require.NoError(t, err)
		for _, tc := range cases {
			bad.Store(&tc.change)
			res, err := world.Round(ctx, a, plain, pool)
			require.ErrorIs(t, err, allocator.ErrPodChange, tc.name)
			require.ErrorContains(t, err, "pod p-0", tc.name)
			require.ErrorContains(t, err, tc.want, tc.name)
			var ce *allocator.ClaimError
			require.True(t, errors.As(err, &ce), tc.name)
			require.Equal(t, "c", ce.Claim.Name)
			require.Empty(t, res.Allocated, tc.name)
			require.Empty(t, snapshotOf(t, a, pool), tc.name)
			require.Empty(t, w.take(), "%s: nothing written", tc.name)
			require.Empty(t, getPod(t, plain, ns, "p-0").Annotations, tc.name)
			require.NoError(t, allocator.CheckInvariants(a))
		}
		bad.Store(nil)
		res, err := world.Round(ctx, a, plain, pool)
		require.NoError(t, err)
		require.Len(t, res.Allocated, 1)
		require.Equal(t, "c", getPod(t, plain, ns, "p-0").Labels[routeLabel])
	})
}

// TestMarkHookKeepsTheClaimsSelector: a gang one of whose pods' changes
// is refused gets none of its pods; a label that would make the pod fall
// out of its claim's selector is refused.
func TestMarkHookKeepsTheClaimsSelector(t *testing.T) {
	onBothCounted(t, func(t *testing.T, counted, plain client.Client, ns string, w *writeLog) {
		ctx := context.Background()
		pool, pods := poolIn(t, plain, ns, 2)
		gang := testenv.NewClaim(ns, "g", "p", 2)
		gang.UID = "uid-g"
		gang.Spec.Gang = true
		require.NoError(t, plain.Create(ctx, gang))
		var busy atomic.Bool
		a, err := allocator.New(counted, allocator.WithMarkHook(func(p allocator.MarkedPod) allocator.PodChange {
			if busy.Load() {
				return allocator.PodChange{Labels: map[string]string{"busy": "yes"}}
			}
			if p.Pod == pods[1].Name {
				return allocator.PodChange{Labels: map[string]string{testenv.PoolLabel: "x"}}
			}
			return routeHook(p)
		}))
		require.NoError(t, err)
		res, err := world.Round(ctx, a, plain, pool)
		require.ErrorIs(t, err, allocator.ErrPodChange)
		require.ErrorContains(t, err, "pod "+pods[1].Name)
		require.Empty(t, res.Allocated, "a gang gets all or nothing")
		require.Empty(t, w.take())

		// A claim that selects pods without the label the hook adds.
		busy.Store(true)
		sel, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "busy", Operator: metav1.LabelSelectorOpDoesNotExist},
		}})
		require.NoError(t, err)
		newClaimIn(t, plain, ns, "c", 1)
		in, err := world.Input(ctx, plain, pool)
		require.NoError(t, err)
		for i := range in.Claims {
			if in.Claims[i].Object.GetName() == "c" {
				in.Claims[i].Placement.Selector = sel
			} else {
				in.Claims[i].Want = 0 // the gang asks for nothing now
			}
		}
		res, err = a.Round(ctx, in)
		require.ErrorIs(t, err, allocator.ErrPodChange)
		require.ErrorContains(t, err, "no longer matches its claim's selector")
		require.Empty(t, res.Allocated)
		require.Empty(t, w.take())
	})
}

// TestMarkHookRefusedAtReleaseKeepsTheMark: a change refused when the mark
// goes keeps the pod marked (it does not go back to the pool with the
// claim's labels); once the hook is right, the unmark takes the change off.
func TestMarkHookRefusedAtReleaseKeepsTheMark(t *testing.T) {
	onBothCounted(t, func(t *testing.T, counted, plain client.Client, ns string, w *writeLog) {
		ctx := context.Background()
		pool, _ := poolIn(t, plain, ns, 1)
		newClaimIn(t, plain, ns, "c", 1)
		var broken atomic.Bool
		a, err := allocator.New(counted, allocator.WithMarkHook(func(p allocator.MarkedPod) allocator.PodChange {
			if broken.Load() {
				panic("broken")
			}
			return routeHook(p)
		}))
		require.NoError(t, err)
		_, err = world.Round(ctx, a, plain, pool)
		require.NoError(t, err)
		require.Equal(t, "c", getPod(t, plain, ns, "p-0").Labels[routeLabel])
		broken.Store(true)
		releaseIn(t, plain, ns, "c", "p-0")
		var last error
		for range 3 {
			_, last = world.Round(ctx, a, plain, pool)
		}
		require.ErrorIs(t, last, allocator.ErrPodChange)
		require.ErrorContains(t, last, "pod p-0")
		p := getPod(t, plain, ns, "p-0")
		require.Contains(t, p.Annotations, allocator.DefaultPodMarkKey, "still marked")
		require.Equal(t, "c", p.Labels[routeLabel])
		require.Empty(t, recordIn(t, plain, ns, "c").Held(), "its release is recorded")

		broken.Store(false)
		w.take()
		res, err := world.Round(ctx, a, plain, pool)
		require.NoError(t, err)
		require.Equal(t, map[string]int{"pod": 1}, w.take(), "one unmark")
		p = getPod(t, plain, ns, "p-0")
		require.NotContains(t, p.Annotations, allocator.DefaultPodMarkKey)
		require.NotContains(t, p.Labels, routeLabel)
		require.Empty(t, p.OwnerReferences)
		_ = res
		require.NoError(t, allocator.CheckInvariants(a))
	})
}

func TestWithMarkHookNeedsPodMarks(t *testing.T) {
	c := newFakeClient(t, nil)
	_, err := allocator.New(c, allocator.WithMarkHook(routeHook), allocator.WithPodMarks(false))
	require.ErrorIs(t, err, allocator.ErrInvalidOption)
	require.True(t, strings.Contains(err.Error(), "WithMarkHook"))
	_, err = allocator.New(c, allocator.WithMarkHook(nil))
	require.ErrorIs(t, err, allocator.ErrInvalidOption)
}
