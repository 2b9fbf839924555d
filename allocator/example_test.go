package allocator_test

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/syncer"
)

func ExampleNew() {
	ctx := context.Background()
	scheme, err := testenv.NewScheme()
	if err != nil {
		fmt.Println(err)
		return
	}
	c := fake.NewClientBuilder().WithGlobalResourceVersionCounter().WithScheme(scheme).
		WithStatusSubresource(&corev1.Pod{}, &testenv.Claim{}).Build()

	// A pool of three Ready pods, runners-0 to runners-2, and two claims
	// that want two pods each.
	pool := types.NamespacedName{Namespace: "ci", Name: "runners"}
	pods, err := testenv.CreatePods(ctx, c, pool.Namespace, pool.Name, 3, true)
	if err != nil {
		fmt.Println(err)
		return
	}
	build := testenv.NewClaim(pool.Namespace, "build", pool.Name, 2)
	lint := testenv.NewClaim(pool.Namespace, "lint", pool.Name, 2)
	build.UID, lint.UID = "uid-build", "uid-lint" // the fake client assigns none
	for _, claim := range []client.Object{build, lint} {
		if err := c.Create(ctx, claim); err != nil {
			fmt.Println(err)
			return
		}
	}

	a, err := allocator.New(c)
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := a.Round(ctx, allocator.Input{
		Pool: pool,
		Pods: pods,
		Claims: []allocator.Claim{
			{Object: build, Want: int(build.Spec.Replicas)},
			{Object: lint, Want: int(lint.Spec.Replicas)},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, g := range res.Allocated {
		fmt.Println(g.Claim.Name, "gets", g.Pods)
	}
	fmt.Println("idle:", res.Idle, "shortfall:", res.Shortfall)

	// The hand-out is recorded on the claim, with a finalizer that keeps
	// the claim until its pods are released.
	var stored testenv.Claim
	if err := c.Get(ctx, client.ObjectKeyFromObject(build), &stored); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(stored.Annotations[syncer.DefaultKeys().Allocated], stored.Finalizers)

	// Output:
	// build gets [runners-0 runners-1]
	// lint gets [runners-2]
	// idle: [] shortfall: 1
	// {"pods":["runners-0","runners-1"]} [poolalloc.io/allocation]
}

// A pod handed to a claim is labelled with the claim's name, for a Service
// that routes to the claim's pods, in the same write that marks it.
func ExampleWithMarkHook() {
	ctx := context.Background()
	scheme, err := testenv.NewScheme()
	if err != nil {
		fmt.Println(err)
		return
	}
	c := fake.NewClientBuilder().WithGlobalResourceVersionCounter().WithScheme(scheme).
		WithStatusSubresource(&corev1.Pod{}, &testenv.Claim{}).Build()
	pool := types.NamespacedName{Namespace: "ci", Name: "runners"}
	pods, err := testenv.CreatePods(ctx, c, pool.Namespace, pool.Name, 1, true)
	if err != nil {
		fmt.Println(err)
		return
	}
	build := testenv.NewClaim(pool.Namespace, "build", pool.Name, 1)
	build.UID = "uid-build"
	if err := c.Create(ctx, build); err != nil {
		fmt.Println(err)
		return
	}

	a, err := allocator.New(c, allocator.WithMarkHook(func(p allocator.MarkedPod) allocator.PodChange {
		return allocator.PodChange{Labels: map[string]string{"example.com/claim": p.Claim.Claim.Name}}
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := a.Round(ctx, allocator.Input{Pool: pool, Pods: pods, Claims: []allocator.Claim{{Object: build, Want: 1}}}); err != nil {
		fmt.Println(err)
		return
	}
	var pod corev1.Pod
	if err := c.Get(ctx, client.ObjectKeyFromObject(&pods[0]), &pod); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(pod.Annotations[allocator.DefaultPodMarkKey], pod.Labels["example.com/claim"])

	// Output:
	// build/uid-build build
}
