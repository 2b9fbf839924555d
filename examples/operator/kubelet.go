package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
)

// FakeKubelet stands in for the kubelets of a real cluster, for the
// embedded API server only: it has no nodes, no scheduler and no kubelet,
// so a pod would stay Pending for ever. It is NOT part of the operator.
//
// Every Interval it lists the pool pods (PoolLabel set) of Namespace and
//   - marks Ready (testenv.SetPodReady) those older than StartDelay that are
//     not Ready yet, as a kubelet does once the containers run;
//   - finishes the deletion of pods that are terminating, as a kubelet
//     confirms a pod stopped. The operator's pods are bound to no node and
//     have no finalizers, so the API server deletes them at once and this
//     never happens to them; pods bound to a node (testenv.CreatePods) wait
//     for it.
type FakeKubelet struct {
	Client    client.Client
	Namespace string
	// Interval between passes; default 200ms.
	Interval time.Duration
	// StartDelay is how long a new pod takes to become Ready.
	StartDelay time.Duration

	finished atomic.Int64 // deletions finished, see Finished
	started  atomic.Int64 // pods made Ready, for their zones
}

// Finished returns how many pod deletions the fake kubelet had to finish.
func (k *FakeKubelet) Finished() int64 { return k.finished.Load() }

// Run runs passes until ctx ends; it returns nil then. A failed pass is
// retried at the next tick; Run returns an error only when passes keep
// failing for a minute.
func (k *FakeKubelet) Run(ctx context.Context) error {
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
func (k *FakeKubelet) pass(ctx context.Context) error {
	var pods corev1.PodList
	if err := k.Client.List(ctx, &pods, client.InNamespace(k.Namespace), client.HasLabels{PoolLabel}); err != nil {
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
		case !testenv.IsPodReady(pod) && time.Since(pod.CreationTimestamp.Time) >= k.StartDelay:
			if err := k.placeInZone(ctx, pod); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := testenv.SetPodReady(ctx, k.Client, pod, true); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// demoZones are the zones the fake kubelet puts pods in, in turn.
var demoZones = []string{"zone-a", "zone-b", "zone-c"}

// placeInZone labels a pod that has no zone label with the next of
// demoZones, as if it were scheduled there (the allocator reads a pod's
// zone from allocator.ZoneLabel; a real cluster's admission or the
// operator's pod template sets it).
func (k *FakeKubelet) placeInZone(ctx context.Context, pod *corev1.Pod) error {
	if pod.Labels[allocator.ZoneLabel] != "" {
		return nil
	}
	zone := demoZones[(k.started.Add(1)-1)%int64(len(demoZones))]
	patch := []byte(`{"metadata":{"labels":{"` + allocator.ZoneLabel + `":"` + zone + `"}}}`)
	if err := k.Client.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("fake kubelet: zone of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}
