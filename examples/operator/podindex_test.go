package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/poolalloc/poolalloc/allocator"
)

func indexPod(name, pool, class string, ready, marked bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{PoolLabel: pool}}}
	if class != "" {
		p.Labels[ClassLabel] = class
	}
	if ready {
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	if marked {
		p.Annotations = map[string]string{allocator.DefaultPodMarkKey: "c/uid"}
	}
	return p
}

// TestPodIndexCountsFromEvents feeds the index's handler adds, updates
// (readiness, a mark, a move to another pool) and deletes, and checks the
// counts and that each event still reaches the next handler.
func TestPodIndexCountsFromEvents(t *testing.T) {
	x := newPodIndex()
	var passed int
	next := handler.Funcs{
		CreateFunc: func(_ context.Context, _ event.CreateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			passed++
		},
		UpdateFunc: func(_ context.Context, _ event.UpdateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			passed++
		},
		DeleteFunc: func(_ context.Context, _ event.DeleteEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			passed++
		},
	}
	h := indexedPods(x, next)
	ctx := t.Context()
	p := types.NamespacedName{Namespace: "ns", Name: "p"}
	q := types.NamespacedName{Namespace: "ns", Name: "q"}

	a := indexPod("a", "p", "large", false, false) // starting, of class large
	b := indexPod("b", "p", "", true, false)       // ready
	c := indexPod("c", "p", "large", false, true)  // marked: not starting
	for _, pod := range []*corev1.Pod{a, b, c} {
		h.Create(ctx, event.CreateEvent{Object: pod}, nil)
	}
	got := x.counts(p)
	require.Equal(t, podCounts{pods: 3, live: 3, ready: 1, starting: map[string]int{"large": 1}}, got)
	require.True(t, x.has(p, "a"))
	require.False(t, x.has(q, "a"))

	// a turns Ready; b moves to pool q; c is deleted.
	aReady := indexPod("a", "p", "large", true, false)
	h.Update(ctx, event.UpdateEvent{ObjectOld: a, ObjectNew: aReady}, nil)
	bMoved := indexPod("b", "q", "", true, false)
	h.Update(ctx, event.UpdateEvent{ObjectOld: b, ObjectNew: bMoved}, nil)
	h.Delete(ctx, event.DeleteEvent{Object: c, DeleteStateUnknown: true}, nil)
	require.Equal(t, podCounts{pods: 1, live: 1, ready: 1, starting: map[string]int{}}, x.counts(p))
	require.Equal(t, podCounts{pods: 1, live: 1, ready: 1, starting: map[string]int{}}, x.counts(q))
	require.False(t, x.has(p, "b"))
	require.True(t, x.has(q, "b"))

	// A terminating pod is not live; the last pod's delete empties the pool.
	gone := aReady.DeepCopy()
	now := metav1.Now()
	gone.DeletionTimestamp = &now
	h.Update(ctx, event.UpdateEvent{ObjectOld: aReady, ObjectNew: gone}, nil)
	require.Equal(t, 0, x.counts(p).live)
	h.Delete(ctx, event.DeleteEvent{Object: gone}, nil)
	require.Equal(t, podCounts{starting: map[string]int{}}, x.counts(p))
	require.Empty(t, x.pools[p])
	require.Equal(t, 8, passed, "every event reaches the next handler")
}
