package follow

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// PodEvents returns a controller-runtime event handler for pods: it hands
// each event to OnPod and enqueues the pools it concerns. Use it in place of
// a handler that maps pods to pools:
//
//	Watches(&corev1.Pod{}, f.PodEvents())
//
// The event is kept before the pool is enqueued, so the reconcile it
// triggers sees it. A delete whose final state was missed (a relist found
// the pod gone) is taken as a delete of the last state known.
func (f *Follower) PodEvents() handler.EventHandler {
	return events(func(old, obj client.Object) []types.NamespacedName {
		return f.OnPod(asPod(old), asPod(obj))
	})
}

// ClaimEvents is PodEvents for claims, handing events to OnClaim.
func (f *Follower) ClaimEvents() handler.EventHandler {
	return events(f.OnClaim)
}

// asPod returns o as a pod, nil when it is nil or not a pod.
func asPod(o client.Object) *corev1.Pod {
	pod, _ := o.(*corev1.Pod)
	return pod
}

// events adapts an On function to controller-runtime's handler.
func events(on func(old, obj client.Object) []types.NamespacedName) handler.EventHandler {
	enqueue := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], pools []types.NamespacedName) {
		for _, p := range pools {
			q.Add(reconcile.Request{NamespacedName: p})
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.Object != nil {
				enqueue(q, on(nil, e.Object))
			}
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.ObjectNew != nil {
				enqueue(q, on(e.ObjectOld, e.ObjectNew))
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.Object != nil {
				enqueue(q, on(e.Object, nil))
			}
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.Object != nil {
				enqueue(q, on(nil, e.Object))
			}
		},
	}
}
