package allocator

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/syncer"
)

// Decide, then act (docs/design.md §10).
//
// A round never calls the API server, or a Recycler, while it decides.
// Each step of a round decides on what the pool knows, and returns the
// calls it needs as an effects value; an executor makes those calls,
// concurrently; the step then takes their outcomes in, one at a time,
// through the pool's transition function (pool.setState). The executor
// holds no part of the pool (no *pool, *round, *podInfo or *claimInfo
// reaches it), so the calls it makes cannot change what the round
// decided on, and two calls in flight cannot race on pool state. It is
// the only code of the allocator that talks to the API server or calls a
// Recycler: grep for cfg.client, cfg.podReader, cfg.syncer.Get,
// cfg.syncer.Write and cfg.recycle.

// effects is the batch of calls one step of a round decided on. The
// executor fills in each call's outcome; the step reads them in order.
type effects struct {
	podReads   []*podGet
	claimReads []*claimGet
	patches    []*podPatch
	recycles   []*recycleCall
	writes     []*recordWrite
}

func (e *effects) len() int {
	return len(e.podReads) + len(e.claimReads) + len(e.patches) + len(e.recycles) + len(e.writes)
}

// podGet is a live read of one pod of the pool.
type podGet struct {
	name string

	pod corev1.Pod
	err error
}

// claimGet is a live read of one claim. A claim of the same name with
// another UID is a different claim: the read is then NotFound.
type claimGet struct {
	uid  types.UID
	base client.Object // the version known, or an empty object of the claim's type

	obj client.Object
	err error
}

// podPatch is a merge patch of a pod's annotations and labels guarded by
// the pod's resourceVersion: a string value sets a key, nil removes it.
// With owners (a MarkHook's owner references) it is a strategic merge
// patch, which merges the pod's owner references by UID.
type podPatch struct {
	name        string
	rv          string
	annotations map[string]any
	labels      map[string]any
	owners      []any

	newRV string // the pod's resourceVersion after the patch
	mark  string // its mark after the patch
	// newLabels are its labels after a patch that changed labels.
	newLabels map[string]string
	err       error
}

// recycleCall is one pod offered to the Recycler. With pod marks, fence is
// the patch that proves and stamps the pod's mark first (see
// round.fenceRecycle); the Recycler is called only if it succeeds, with
// the version it made.
type recycleCall struct {
	fence *podPatch
	req   RecycleRequest

	done bool
	err  error
}

// recordWrite is one claim's record write. If the write fails in a way
// that does not prove it did not land, or the syncer returns no claim, the
// claim is read back (readBack) so that the round can tell.
type recordWrite struct {
	uid  types.UID
	name types.NamespacedName
	base client.Object
	rec  syncer.Record
	fin  bool

	obj      client.Object
	err      error
	readBack *claimGet
}

// executor makes a round's calls. It is built per call of the round and
// holds only what the calls need.
type executor struct {
	ctx      context.Context
	pool     types.NamespacedName
	client   client.Client
	pods     client.Reader
	syncer   syncer.AllocationSyncer
	recycler Recycler
	markKey  string
	limit    int
}

// executor returns the executor of r's calls.
func (r *round) executor() *executor {
	cfg := r.a.cfg
	return &executor{
		ctx: r.ctx, pool: r.p.name, client: cfg.client, pods: cfg.podReader,
		syncer: cfg.syncer, recycler: cfg.recycle, markKey: cfg.markKey, limit: cfg.writers,
	}
}

// exec makes the calls of e (see executor.run).
func (r *round) exec(e *effects) { r.executor().run(e) }

// run makes every call of e, at most limit at once, and returns when all
// are done. A panic in a call (a plugin's) is raised again in the caller's
// goroutine once the others finish, where the round's guard fails the pool
// closed.
func (x *executor) run(e *effects) {
	calls := x.calls(e)
	parallel(x.limit, len(calls), func(i int) { calls[i]() })
}

// pipeline makes the calls of every group, at most limit at once; once
// the calls of group g and of every group before it are done, then(g) is
// called on the caller's goroutine, in the order of the groups, and the
// calls it returns (nil for none) are made too, before those of groups
// not started yet. It returns when all are done. So a step whose calls
// rest on earlier ones (a record on its pods' marks) takes the earlier
// outcomes in one at a time, in a fixed order, as run's callers do, while
// the calls of later groups are still in flight. A panic in a call is
// raised again in the caller's goroutine once the calls in flight finish;
// then is not called after it.
func (x *executor) pipeline(groups []*effects, then func(g int) *effects) {
	type queued struct {
		g int // -1 for a call then returned
		f func()
	}
	var first, follow []queued
	left := make([]int, len(groups))
	for g, e := range groups {
		for _, f := range x.calls(e) {
			first = append(first, queued{g, f})
			left[g]++
		}
	}
	type outcome struct {
		g        int
		panicked *any
	}
	done := make(chan outcome)
	var panicked *any
	running, taken := 0, 0
	for {
		for panicked == nil && taken < len(groups) && left[taken] == 0 {
			if e := then(taken); e != nil {
				for _, f := range x.calls(e) {
					follow = append(follow, queued{-1, f})
				}
			}
			taken++
		}
		for panicked == nil && running < max(1, x.limit) && len(follow)+len(first) > 0 {
			var q queued
			if len(follow) > 0 {
				q, follow = follow[0], follow[1:]
			} else {
				q, first = first[0], first[1:]
			}
			running++
			go func() {
				var p *any
				defer func() {
					if v := recover(); v != nil {
						p = &v
					}
					done <- outcome{q.g, p}
				}()
				q.f()
			}()
		}
		if running == 0 {
			break
		}
		o := <-done
		running--
		if o.g >= 0 {
			left[o.g]--
		}
		if o.panicked != nil && panicked == nil {
			panicked = o.panicked
		}
	}
	if panicked != nil {
		panic(*panicked)
	}
}

// calls returns the calls of e, each recording its outcome in e.
func (x *executor) calls(e *effects) []func() {
	calls := make([]func(), 0, e.len())
	for _, c := range e.podReads {
		calls = append(calls, func() { x.readPod(c) })
	}
	for _, c := range e.claimReads {
		calls = append(calls, func() { x.readClaim(c) })
	}
	for _, c := range e.patches {
		calls = append(calls, func() { x.patch(c) })
	}
	for _, c := range e.recycles {
		calls = append(calls, func() { x.recycle(c) })
	}
	for _, c := range e.writes {
		calls = append(calls, func() { x.write(c) })
	}
	return calls
}

func (x *executor) readPod(c *podGet) {
	c.err = x.pods.Get(x.ctx, client.ObjectKey{Namespace: x.pool.Namespace, Name: c.name}, &c.pod)
}

func (x *executor) readClaim(c *claimGet) {
	if c.base == nil {
		c.err = errNoProto
		return
	}
	obj, err := x.syncer.Get(x.ctx, c.base)
	switch {
	case err != nil:
		c.err = err
	case obj.GetUID() != c.uid:
		gr := obj.GetObjectKind().GroupVersionKind().GroupKind()
		c.err = apierrors.NewNotFound(schema.GroupResource{Group: gr.Group, Resource: gr.Kind}, c.base.GetName())
	default:
		c.obj = obj
	}
}

func (x *executor) patch(c *podPatch) {
	meta := map[string]any{"resourceVersion": c.rv, "annotations": c.annotations}
	if c.labels != nil {
		meta["labels"] = c.labels
	}
	pt := types.MergePatchType
	if c.owners != nil {
		meta["ownerReferences"] = c.owners
		pt = types.StrategicMergePatchType
	}
	body, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		c.err = err
		return
	}
	pod := &corev1.Pod{}
	pod.Namespace, pod.Name = x.pool.Namespace, c.name
	if c.err = x.client.Patch(x.ctx, pod, client.RawPatch(pt, body)); c.err != nil {
		return
	}
	c.newRV, c.mark = pod.ResourceVersion, pod.Annotations[x.markKey]
	if c.labels != nil {
		c.newLabels = pod.Labels
		if c.newLabels == nil {
			c.newLabels = map[string]string{}
		}
	}
}

func (x *executor) recycle(c *recycleCall) {
	if c.fence != nil {
		if x.patch(c.fence); c.fence.err != nil {
			return
		}
		c.req.ResourceVersion = c.fence.newRV
	}
	c.done, c.err = safeRecycle(x.ctx, x.recycler, c.req)
}

func (x *executor) write(c *recordWrite) {
	c.obj, c.err = x.syncer.Write(x.ctx, c.base, c.rec, c.fin)
	if c.err == nil && !nilObject(c.obj) || c.err != nil && definite(c.err) {
		return
	}
	if c.err == nil {
		// What the write did is unknown: read back.
		c.err = fmt.Errorf("claim %s: write record: the syncer returned no claim (AllocationSyncer.Write must return the claim as stored)", c.name)
	}
	c.readBack = &claimGet{uid: c.uid, base: c.base}
	x.readClaim(c.readBack)
}

// parallel runs f(0..n-1) with at most limit at once. A panic in f is
// raised again in the caller's goroutine once the others finish.
func parallel(limit, n int, f func(i int)) {
	if n == 0 {
		return
	}
	limit = max(1, min(limit, n))
	var wg sync.WaitGroup
	var panicked atomic.Pointer[any]
	next := make(chan int)
	for range limit {
		wg.Go(func() {
			defer func() {
				if v := recover(); v != nil {
					panicked.CompareAndSwap(nil, &v)
					for range next { // let the sender finish
					}
				}
			}()
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if v := panicked.Load(); v != nil {
		panic(*v)
	}
}
