// Package world turns what a test pool looks like on the API server into
// allocator input, the way an operator's reconciler would: list the pool's
// pods and the claims that reference it, and read each claim's wants from
// its spec. It serves the tests, the property tests and the examples.
package world

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
)

// Input lists pool's pods (by testenv.PoolLabel) and the test claims whose
// spec.poolRef names it, as typed testenv.Claim objects.
func Input(ctx context.Context, c client.Reader, pool types.NamespacedName) (allocator.Input, error) {
	in := allocator.Input{Pool: pool}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(pool.Namespace), client.MatchingLabels{testenv.PoolLabel: pool.Name}); err != nil {
		return in, fmt.Errorf("list pods of pool %s: %w", pool, err)
	}
	in.Pods = pods.Items
	var claims testenv.ClaimList
	if err := c.List(ctx, &claims, client.InNamespace(pool.Namespace)); err != nil {
		return in, fmt.Errorf("list claims of pool %s: %w", pool, err)
	}
	for i := range claims.Items {
		cl := &claims.Items[i]
		if cl.Spec.PoolRef != pool.Name {
			continue
		}
		in.Claims = append(in.Claims, allocator.Claim{Object: cl, Want: int(cl.Spec.Replicas), Priority: cl.Spec.Priority, Placement: cl.Spec.Placement()})
	}
	return in, nil
}

// UnstructuredInput is Input with the claims read as
// *unstructured.Unstructured, as an operator without Go types would.
func UnstructuredInput(ctx context.Context, c client.Reader, pool types.NamespacedName) (allocator.Input, error) {
	in, err := Input(ctx, c, pool)
	if err != nil {
		return in, err
	}
	var list unstructured.UnstructuredList
	list.SetGroupVersionKind(testenv.ClaimListGVK)
	if err := c.List(ctx, &list, client.InNamespace(pool.Namespace)); err != nil {
		return in, fmt.Errorf("list claims of pool %s: %w", pool, err)
	}
	in.Claims = in.Claims[:0]
	for i := range list.Items {
		u := &list.Items[i]
		ref, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef")
		if ref != pool.Name {
			continue
		}
		var spec testenv.ClaimSpec
		if m, ok := u.Object["spec"].(map[string]any); ok {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &spec); err != nil {
				return in, fmt.Errorf("claim %s/%s: spec: %w", u.GetNamespace(), u.GetName(), err)
			}
		}
		in.Claims = append(in.Claims, allocator.Claim{Object: u, Want: int(spec.Replicas), Priority: spec.Priority, Placement: spec.Placement()})
	}
	return in, nil
}

// Round lists the pool with Input and runs one round of a on it.
func Round(ctx context.Context, a allocator.Allocator, c client.Reader, pool types.NamespacedName) (allocator.Result, error) {
	in, err := Input(ctx, c, pool)
	if err != nil {
		return allocator.Result{Pool: pool}, err
	}
	return a.Round(ctx, in)
}

// Holdings returns, for every claim of the pool, the pods its record on the
// server says it holds, keyed by claim name.
func Holdings(ctx context.Context, c client.Reader, pool types.NamespacedName, read func(client.Object) ([]string, error)) (map[string][]string, error) {
	in, err := Input(ctx, c, pool)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]string, len(in.Claims))
	for _, cl := range in.Claims {
		held, err := read(cl.Object)
		if err != nil {
			return nil, err
		}
		out[cl.Object.GetName()] = held
	}
	return out, nil
}
