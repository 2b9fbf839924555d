// Package fakekubelet stands in for the kubelets of a real cluster on an
// API server that has none (controller-runtime's envtest: no nodes, no
// scheduler, no kubelet), so that the operator example's pods become Ready
// in its demo and its tests. It is NOT part of the operator: a fork keeps
// it for its tests and drops it from its deployment.
//
//	k := &fakekubelet.Kubelet{Client: c, Namespace: "demo", StartDelay: 500 * time.Millisecond}
//	go k.Run(ctx)
package fakekubelet

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
)

// Kubelet plays the kubelets of a cluster without nodes, where a pod would
// stay Pending for ever.
//
// Every Interval it lists the pool pods (v1.PoolLabel set) of Namespace and
//   - puts those older than StartDelay that are not Ready yet in a zone
//     (placeInZone) and marks them Ready (SetPodReady), as a scheduler and
//     a kubelet do once the containers run;
//   - finishes the deletion of pods that are terminating, as a kubelet
//     confirms a pod stopped. The operator's pods are bound to no node and
//     have no finalizers, so the API server deletes them at once and this
//     never happens to them; pods bound to a node wait for it.
type Kubelet struct {
	Client    client.Client
	Namespace string
	// Interval between passes; default 200ms.
	Interval time.Duration
	// StartDelay is how long a new pod takes to become Ready.
	StartDelay time.Duration

	finished atomic.Int64 // deletions finished, see Finished
	started  atomic.Int64 // pods made Ready, for their zones
}

// Finished returns how many pod deletions the kubelet had to finish.
func (k *Kubelet) Finished() int64 { return k.finished.Load() }

// Run runs passes until ctx ends; it returns nil then. A failed pass is
// retried at the next tick; Run returns an error only when passes keep
// failing for a minute.
func (k *Kubelet) Run(ctx context.Context) error {
	interval := k.Interval
	if interval <= 0 {
		interval = 200 * time.Millisecond
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var failingSince time.Time
	for {
		err := k.pass(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			failingSince = time.Time{}
		case failingSince.IsZero():
			failingSince = time.Now()
		case time.Since(failingSince) > time.Minute:
			return fmt.Errorf("fake kubelet: failing for a minute: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// pass does one round over the namespace's pool pods.
func (k *Kubelet) pass(ctx context.Context) error {
	var pods corev1.PodList
	if err := k.Client.List(ctx, &pods, client.InNamespace(k.Namespace), client.HasLabels{v1.PoolLabel}); err != nil {
		return fmt.Errorf("fake kubelet: list pods of %s: %w", k.Namespace, err)
	}
	var errs []error
	for i := range pods.Items {
		pod := &pods.Items[i]
		switch {
		case pod.DeletionTimestamp != nil:
			uid := pod.UID
			err := k.Client.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &uid})
			switch {
			case err == nil:
				k.finished.Add(1)
			case !apierrors.IsNotFound(err) && !apierrors.IsConflict(err):
				errs = append(errs, fmt.Errorf("fake kubelet: finish deleting pod %s/%s: %w", pod.Namespace, pod.Name, err))
			}
		case !IsPodReady(pod) && time.Since(pod.CreationTimestamp.Time) >= k.StartDelay:
			if err := k.placeInZone(ctx, pod); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := SetPodReady(ctx, k.Client, pod, true); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// demoZones are the zones the fake kubelet puts pods in, in turn.
var demoZones = []string{"zone-a", "zone-b", "zone-c"}

// placeInZone labels a pod that has no zone label (topology.kubernetes.io/zone)
// with the next of demoZones, as if it were scheduled there (the allocator
// reads a pod's zone from that label, allocator.ZoneLabel; a real
// cluster's admission or the operator's pod template sets it).
func (k *Kubelet) placeInZone(ctx context.Context, pod *corev1.Pod) error {
	if pod.Labels[corev1.LabelTopologyZone] != "" {
		return nil
	}
	zone := demoZones[(k.started.Add(1)-1)%int64(len(demoZones))]
	patch := []byte(`{"metadata":{"labels":{"` + corev1.LabelTopologyZone + `":"` + zone + `"}}}`)
	if err := k.Client.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("fake kubelet: zone of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// IsPodReady reports whether pod has condition Ready=True.
func IsPodReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// SetPodReady sets pod's phase to Running and its Ready and ContainersReady
// conditions to ready (PodScheduled to true) through the status
// subresource, as a kubelet would, and updates pod to the stored object.
func SetPodReady(ctx context.Context, c client.Client, pod *corev1.Pod, ready bool) error {
	orig := pod.DeepCopy()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.ContainersReady, corev1.PodReady} {
		s := status
		if t == corev1.PodScheduled {
			s = corev1.ConditionTrue
		}
		setCondition(&pod.Status, corev1.PodCondition{Type: t, Status: s, LastTransitionTime: now})
	}
	if err := c.Status().Patch(ctx, pod, client.StrategicMergeFrom(orig)); err != nil {
		return fmt.Errorf("set pod %s/%s ready=%t: %w", pod.Namespace, pod.Name, ready, err)
	}
	return nil
}

// setCondition replaces the condition of the same type, keeping its
// transition time if the status did not change, or appends it.
func setCondition(s *corev1.PodStatus, cond corev1.PodCondition) {
	for i := range s.Conditions {
		if s.Conditions[i].Type != cond.Type {
			continue
		}
		if s.Conditions[i].Status == cond.Status {
			cond.LastTransitionTime = s.Conditions[i].LastTransitionTime
		}
		s.Conditions[i] = cond
		return
	}
	s.Conditions = append(s.Conditions, cond)
}
