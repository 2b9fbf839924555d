package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/parallel"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/syncer"
)

// The write-cost mode (-write-cost N) measures what each kind of write the
// allocator and its caller make per hand-out costs the API server: instead
// of the burst, it makes N writes of one kind, -write-concurrency at once,
// and divides the CPU time the embedded kube-apiserver and etcd spent
// meanwhile by N; then the next kind. The informer cache of the burst runs
// throughout, so each write's watch event is delivered as in the burst,
// and the CPU of this process (client and cache) is reported too. Each
// kind is measured -write-cost-reps times, the kinds interleaved, and the
// medians are reported.
//
// The writes are made as the allocator makes them: pod patches are JSON
// merge patches of the pod's annotations (and labels) guarded by its
// resourceVersion, record writes go through syncer.AnnotationSyncer, and
// an event is what the events library creates for a new event.

// labelKey is the label the hook-shaped writes put on a pod, as an
// operator that routes to claimed pods would.
const labelKey = "poolalloc.io/claimed-by"

// costKind is one kind of write.
type costKind struct {
	name string
	// write makes the i-th write of the kind.
	write func(ctx context.Context, i int) error
}

// costRun is what one kind's N writes cost.
type costRun struct {
	plane, apiserver, etcd, self, wall time.Duration
}

// writeCost runs the write-cost mode: n writes of every kind, reps times.
func (t *test) writeCost(ctx context.Context, n, reps int) error {
	if !t.embedded {
		return fmt.Errorf("-write-cost reads the control plane's CPU from /proc: it needs the embedded API server (unset KUBECONFIG)")
	}
	var pods corev1.PodList
	if err := t.c.List(ctx, &pods, client.InNamespace(t.pool.Namespace), client.MatchingLabels{testenv.PoolLabel: t.pool.Name}); err != nil {
		return fmt.Errorf("write cost: list pods: %w", err)
	}
	if len(pods.Items) < n {
		return fmt.Errorf("write cost: %d pods, want at least -write-cost %d", len(pods.Items), n)
	}
	slices.SortFunc(pods.Items, func(x, y corev1.Pod) int { return strings.Compare(x.Name, y.Name) })
	s, err := syncer.NewAnnotationSyncer(t.c, syncer.DefaultKeys())
	if err != nil {
		return err
	}
	w := &costWorld{t: t, s: s, pods: pods.Items[:n], rv: make([]string, n), claims: make([]*testenv.Claim, n)}
	for i := range w.pods {
		w.rv[i] = w.pods[i].ResourceVersion
	}
	kinds := w.kinds()
	runs := make([][]costRun, len(kinds))
	for rep := range reps {
		w.rep = rep
		for k, kind := range kinds {
			r, err := t.costOf(ctx, n, kind)
			if err != nil {
				return fmt.Errorf("write cost: %s: %w", kind.name, err)
			}
			runs[k] = append(runs[k], r)
		}
	}
	fmt.Printf("\nwrite cost: %d writes of each kind, %d at once, median of %d repetitions (kinds interleaved); per write:\n", n, t.f.writers, reps)
	fmt.Printf("  %-40s %14s %10s %10s %13s %10s\n", "kind", "control plane", "apiserver", "etcd", "this process", "wall")
	per := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(n)/1e6) }
	for k, kind := range kinds {
		m := medianRun(runs[k])
		fmt.Printf("  %-40s %14s %10s %10s %13s %10s\n", kind.name, per(m.plane), per(m.apiserver), per(m.etcd), per(m.self), per(m.wall))
	}
	return nil
}

// costOf makes n writes of kind and returns what they cost.
func (t *test) costOf(ctx context.Context, n int, kind costKind) (costRun, error) {
	before := t.controlPlaneCPU()
	selfBefore, err := cpuTime()
	if err != nil {
		return costRun{}, err
	}
	start := time.Now()
	if err := parallel.Do(ctx, n, t.f.writers, kind.write); err != nil {
		return costRun{}, err
	}
	wall := time.Since(start)
	selfAfter, err := cpuTime()
	if err != nil {
		return costRun{}, err
	}
	r := costRun{wall: wall, self: selfAfter - selfBefore}
	for _, p := range diffCPU(before, t.controlPlaneCPU()) {
		r.plane += p.cpu
		switch p.name {
		case "kube-apiserver":
			r.apiserver = p.cpu
		case "etcd":
			r.etcd = p.cpu
		}
	}
	return r, nil
}

// medianRun is the run of median control plane CPU.
func medianRun(rs []costRun) costRun {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(x, y costRun) int { return int(x.plane - y.plane) })
	return s[len(s)/2]
}

// costWorld is the objects the write-cost mode writes: the first n pods of
// the pool, with the resourceVersion each had after its last write, and
// one claim per pod, made anew in each repetition.
type costWorld struct {
	t      *test
	s      *syncer.AnnotationSyncer
	pods   []corev1.Pod
	rv     []string
	claims []*testenv.Claim
	rep    int
}

// kinds are the kinds of write, in the order they are made: each leaves
// the pods and claims as the next one needs them, and the last leaves the
// pods as they were.
func (w *costWorld) kinds() []costKind {
	markKey, stampKey := allocator.DefaultPodMarkKey, allocator.DefaultPodMarkKey+"-recycling"
	mark := func(i int) string { return w.claims[i].Name + "/" + string(w.claims[i].UID) }
	podPatch := func(meta bool, annotations func(i int) map[string]any, labels func(i int) map[string]any) func(context.Context, int) error {
		return func(ctx context.Context, i int) error {
			return w.patchPod(ctx, i, types.MergePatchType, meta, annotations, labels, nil)
		}
	}
	none := func(int) map[string]any { return nil }
	marked := func(i int) map[string]any { return map[string]any{markKey: mark(i)} }
	unmarked := func(int) map[string]any { return map[string]any{markKey: nil, stampKey: nil} }
	labelled := func(i int) map[string]any { return map[string]any{labelKey: w.claims[i].Name} }
	unlabelled := func(int) map[string]any { return map[string]any{labelKey: nil} }
	owned := func(add bool) func(context.Context, int) error {
		return func(ctx context.Context, i int) error {
			cl := w.claims[i]
			ref := map[string]any{"uid": string(cl.UID)}
			if add {
				ref = map[string]any{"apiVersion": testenv.GroupVersion.String(), "kind": "Claim", "name": cl.Name, "uid": string(cl.UID)}
				return w.patchPod(ctx, i, types.StrategicMergePatchType, false, marked, none, []any{ref})
			}
			ref["$patch"] = "delete"
			return w.patchPod(ctx, i, types.StrategicMergePatchType, false, unmarked, none, []any{ref})
		}
	}
	return []costKind{
		{name: "claim create (the load test's own)", write: w.createClaim},
		{name: "record: hand-out (+ finalizer)", write: func(ctx context.Context, i int) error {
			return w.writeRecord(ctx, i, syncer.Record{Allocated: []string{w.pods[i].Name}}, true)
		}},
		{name: "event: Allocated (WithEvents)", write: w.createEvent},
		{name: "pod mark", write: podPatch(false, marked, none)},
		{name: "pod recycle fence (mark + stamp)", write: podPatch(false, func(i int) map[string]any {
			return map[string]any{markKey: mark(i), stampKey: string(w.claims[i].UID) + "@" + w.rv[i]}
		}, none)},
		{name: "pod unmark", write: podPatch(false, unmarked, none)},
		{name: "pod mark + label (one patch)", write: podPatch(false, marked, labelled)},
		{name: "pod unmark + unlabel (one patch)", write: podPatch(false, unmarked, unlabelled)},
		{name: "pod mark + owner ref (strategic merge)", write: owned(true)},
		{name: "pod unmark - owner ref (strategic merge)", write: owned(false)},
		{name: "pod label alone (a second patch)", write: podPatch(false, none, labelled)},
		{name: "pod unlabel alone", write: podPatch(false, none, unlabelled)},
		{name: "pod mark, metadata-only response", write: podPatch(true, marked, none)},
		{name: "pod unmark, metadata-only response", write: podPatch(true, unmarked, none)},
		{name: "record: release (- finalizer)", write: func(ctx context.Context, i int) error {
			return w.writeRecord(ctx, i, syncer.Record{Released: []string{w.pods[i].Name}}, false)
		}},
	}
}

func (w *costWorld) createClaim(ctx context.Context, i int) error {
	cl := testenv.NewClaim(w.t.pool.Namespace, fmt.Sprintf("cost-%d-%05d", w.rep, i), "no-pool", 1)
	if err := w.t.c.Create(ctx, cl); err != nil {
		return fmt.Errorf("create claim %s: %w", cl.Name, err)
	}
	w.claims[i] = cl
	return nil
}

func (w *costWorld) writeRecord(ctx context.Context, i int, rec syncer.Record, fin bool) error {
	obj, err := w.s.Write(ctx, w.claims[i], rec, fin)
	if err != nil {
		return err
	}
	cl, ok := obj.(*testenv.Claim)
	if !ok {
		return fmt.Errorf("claim %s: syncer returned a %T", w.claims[i].Name, obj)
	}
	w.claims[i] = cl
	return nil
}

// createEvent creates the event the events library (a manager's
// GetEventRecorder) creates for a new Allocated event on a claim.
func (w *costWorld) createEvent(ctx context.Context, i int) error {
	cl := w.claims[i]
	now := metav1.NowMicro()
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: cl.Namespace,
			Name:      cl.Name + "." + strconv.FormatInt(now.UnixNano(), 16),
		},
		EventTime:           now,
		ReportingController: "poolalloc",
		ReportingInstance:   "poolalloc-loadtest",
		Action:              "Allocate",
		Reason:              allocator.EventAllocated,
		Regarding: corev1.ObjectReference{
			APIVersion: testenv.GroupVersion.String(), Kind: "Claim",
			Namespace: cl.Namespace, Name: cl.Name, UID: cl.UID, ResourceVersion: cl.ResourceVersion,
		},
		Note: "pods " + w.pods[i].Name,
		Type: corev1.EventTypeNormal,
	}
	if err := w.t.c.Create(ctx, ev); err != nil {
		return fmt.Errorf("create event %s: %w", ev.Name, err)
	}
	return nil
}

// patchPod makes a JSON merge patch of pod i's annotations and labels,
// guarded by its resourceVersion, as the allocator's executor does (a
// strategic merge patch, pt, for owner references, merged by UID); with
// meta the API server returns the pod's metadata only.
func (w *costWorld) patchPod(ctx context.Context, i int, pt types.PatchType, meta bool, annotations, labels func(int) map[string]any, owners []any) error {
	md := map[string]any{"resourceVersion": w.rv[i]}
	if a := annotations(i); a != nil {
		md["annotations"] = a
	}
	if l := labels(i); l != nil {
		md["labels"] = l
	}
	if owners != nil {
		md["ownerReferences"] = owners
	}
	body, err := json.Marshal(map[string]any{"metadata": md})
	if err != nil {
		return err
	}
	patch := client.RawPatch(pt, body)
	var obj client.Object
	if meta {
		pm := &metav1.PartialObjectMetadata{}
		pm.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
		obj = pm
	} else {
		obj = &corev1.Pod{}
	}
	obj.SetNamespace(w.pods[i].Namespace)
	obj.SetName(w.pods[i].Name)
	if err := w.t.c.Patch(ctx, obj, patch); err != nil {
		return fmt.Errorf("patch pod %s: %w", w.pods[i].Name, err)
	}
	w.rv[i] = obj.GetResourceVersion()
	return nil
}
