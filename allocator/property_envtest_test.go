package allocator_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestPropertyEnvtest runs the allocator's state machine (see
// property_machine_test.go) against the real API server of the package's
// env (lifecycle_test.go's TestMain), each history in two fresh
// namespaces, faults injected by an interceptor around a client of its
// own: by default 60 histories of at least 30 steps (12 of 15 with
// -short). More:
//
//	go test ./allocator -run TestPropertyEnvtest -rapid.checks=500 -rapid.steps=60
func TestPropertyEnvtest(t *testing.T) {
	steps := propertyBudget(t, 60, 30)
	base, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{raw: env.Client, base: base}
	b.namespaces = func(ctx context.Context, id int) ([2]string, func(), error) {
		var out [2]string
		var made []*corev1.Namespace
		cleanup := func() {
			for _, ns := range made {
				if err := env.Client.Delete(context.WithoutCancel(ctx), ns); err != nil && !apierrors.IsNotFound(err) {
					t.Logf("delete namespace %s: %v", ns.Name, err)
				}
			}
		}
		for i := range out {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: fmt.Sprintf("property-%d-%c-", id, 'a'+i)}}
			if err := env.Client.Create(ctx, ns); err != nil {
				cleanup()
				return out, nil, fmt.Errorf("create namespace: %w", err)
			}
			made = append(made, ns)
			out[i] = ns.Name
		}
		return out, cleanup, nil
	}
	runProperty(t, b, steps, false)
}
