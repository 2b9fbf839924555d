package main

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/poolalloc/poolalloc/allocator"
)

// podIndex keeps, per pool, what sizing a pool and writing its status
// need of its pods (live, ready, starting by class), kept up to date from
// the pods' events, so that a reconcile needs no listing of the pool. It
// is fed by the same events as the allocator's follow.Follower, before
// them (indexedPods).
type podIndex struct {
	mu    sync.Mutex
	pools map[types.NamespacedName]*poolPods // guarded by mu
}

// poolPods is one pool's pods and their counts.
type poolPods struct {
	pods map[string]podFacts
	// live, ready and starting (by class, "" for none) count pods as
	// podFacts says.
	live, ready int
	starting    map[string]int
}

// podFacts is what the operator needs of one pod.
type podFacts struct {
	live, ready bool
	// starting: live, not Ready, unmarked, made for a class (class set).
	starting bool
	class    string
}

func factsOf(p *corev1.Pod) podFacts {
	_, marked := p.Annotations[allocator.DefaultPodMarkKey]
	f := podFacts{live: podLive(p), ready: allocator.PodReady(p), class: p.Labels[ClassLabel]}
	f.starting = f.live && !f.ready && !marked && f.class != ""
	return f
}

func newPodIndex() *podIndex {
	return &podIndex{pools: map[types.NamespacedName]*poolPods{}}
}

// set records pod as the newest state of its name in pool (nil: gone).
func (x *podIndex) set(pool types.NamespacedName, name string, pod *corev1.Pod) {
	x.mu.Lock()
	defer x.mu.Unlock()
	pp := x.pools[pool]
	if pp == nil {
		if pod == nil {
			return
		}
		pp = &poolPods{pods: map[string]podFacts{}, starting: map[string]int{}}
		x.pools[pool] = pp
	}
	if old, ok := pp.pods[name]; ok {
		pp.count(old, -1)
		delete(pp.pods, name)
	}
	if pod != nil {
		f := factsOf(pod)
		pp.pods[name] = f
		pp.count(f, 1)
	}
	if len(pp.pods) == 0 {
		delete(x.pools, pool)
	}
}

func (pp *poolPods) count(f podFacts, d int) {
	if f.live {
		pp.live += d
	}
	if f.ready {
		pp.ready += d
	}
	if f.starting {
		pp.starting[f.class] += d
		if pp.starting[f.class] == 0 {
			delete(pp.starting, f.class)
		}
	}
}

// podCounts is a copy of a pool's counts.
type podCounts struct {
	pods, live, ready int
	starting          map[string]int
}

// counts returns a copy of pool's counts.
func (x *podIndex) counts(pool types.NamespacedName) podCounts {
	x.mu.Lock()
	defer x.mu.Unlock()
	pp := x.pools[pool]
	if pp == nil {
		return podCounts{starting: map[string]int{}}
	}
	c := podCounts{pods: len(pp.pods), live: pp.live, ready: pp.ready, starting: make(map[string]int, len(pp.starting))}
	for class, n := range pp.starting {
		c.starting[class] = n
	}
	return c
}

// has reports whether pool has a pod named name.
func (x *podIndex) has(pool types.NamespacedName, name string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.pools[pool].podsOrNil()[name]
	return ok
}

func (pp *poolPods) podsOrNil() map[string]podFacts {
	if pp == nil {
		return nil
	}
	return pp.pods
}

// poolOf is a pod's pool (PoolLabel in its namespace), zero for none.
func poolOf(p *corev1.Pod) types.NamespacedName {
	if name := p.Labels[PoolLabel]; name != "" {
		return types.NamespacedName{Namespace: p.Namespace, Name: name}
	}
	return types.NamespacedName{}
}

// indexedPods is the pods' event handler: it records each event in the
// index, then hands it to next (the Follower's handler, which keeps it
// for the allocator and enqueues the pool).
func indexedPods(x *podIndex, next handler.EventHandler) handler.EventHandler {
	observe := func(old, pod *corev1.Pod) {
		if old != nil {
			if from := poolOf(old); from.Name != "" && (pod == nil || poolOf(pod) != from) {
				x.set(from, old.Name, nil)
			}
		}
		if pod != nil {
			if to := poolOf(pod); to.Name != "" {
				x.set(to, pod.Name, pod)
			}
		}
	}
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q queue) {
			observe(nil, asPod(e.Object))
			next.Create(ctx, e, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) {
			observe(asPod(e.ObjectOld), asPod(e.ObjectNew))
			next.Update(ctx, e, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q queue) {
			observe(asPod(e.Object), nil)
			next.Delete(ctx, e, q)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q queue) {
			observe(nil, asPod(e.Object))
			next.Generic(ctx, e, q)
		},
	}
}

// asPod returns o as a pod, nil if it is none.
func asPod(o any) *corev1.Pod {
	p, _ := o.(*corev1.Pod)
	return p
}
