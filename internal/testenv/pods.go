package testenv

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
	"github.com/poolalloc/poolalloc/examples/operator/fakekubelet"
	"github.com/poolalloc/poolalloc/internal/parallel"
)

// PoolLabel is the label CreatePods puts on a pool's pods; its value is the
// pool name (v1.PoolLabel of the operator example's API).
const PoolLabel = v1.PoolLabel

// PodImage is the image of the single container of pods from CreatePods.
// Nothing runs it: the test API server has no kubelet.
const PodImage = "registry.k8s.io/pause:3.10"

// createParallelism bounds the requests CreatePods has in flight.
const createParallelism = 8

// CreatePods creates n pods of pool in namespace ns, named <pool>-<i> for i
// in [0, n), labelled PoolLabel=pool and bound to node-<i%3> through
// spec.nodeName (there is no scheduler). With ready, each pod's status is
// then set to Running and Ready through the status subresource, as a
// kubelet would; otherwise the pod stays Pending. It returns the pods as
// stored, in index order.
func CreatePods(ctx context.Context, c client.Client, ns, pool string, n int, ready bool) ([]corev1.Pod, error) {
	pods := make([]corev1.Pod, n)
	err := parallel.Do(ctx, n, createParallelism, func(ctx context.Context, i int) error {
		pod := &pods[i]
		*pod = corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: ns,
				Name:      pool + "-" + strconv.Itoa(i),
				Labels:    map[string]string{PoolLabel: pool},
			},
			Spec: corev1.PodSpec{
				NodeName:   "node-" + strconv.Itoa(i%3),
				Containers: []corev1.Container{{Name: "main", Image: PodImage}},
			},
		}
		if err := c.Create(ctx, pod); err != nil {
			return fmt.Errorf("testenv: create pod %s/%s: %w", ns, pod.Name, err)
		}
		if ready {
			return SetPodReady(ctx, c, pod, true)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return pods, nil
}

// SetPodReady sets pod's phase to Running and its Ready and ContainersReady
// conditions to ready through the status subresource, as a kubelet would,
// and updates pod to the stored object (fakekubelet.SetPodReady).
func SetPodReady(ctx context.Context, c client.Client, pod *corev1.Pod, ready bool) error {
	if err := fakekubelet.SetPodReady(ctx, c, pod, ready); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return nil
}

// ListPods returns the pods of pool in namespace ns (by PoolLabel), sorted
// by name as the API server returns them.
func ListPods(ctx context.Context, c client.Client, ns, pool string) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{PoolLabel: pool}); err != nil {
		return nil, fmt.Errorf("testenv: list pods of pool %s/%s: %w", ns, pool, err)
	}
	return list.Items, nil
}

// IsPodReady reports whether pod has condition Ready=True
// (fakekubelet.IsPodReady).
func IsPodReady(pod *corev1.Pod) bool { return fakekubelet.IsPodReady(pod) }
