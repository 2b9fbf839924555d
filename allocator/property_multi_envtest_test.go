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

// TestPropertyMultiEnvtest runs the multi-allocator state machine (see
// property_multi_test.go) against the real API server of the package's
// env (lifecycle_test.go's TestMain), each history in a fresh namespace:
// by default 60 histories of at least 20 steps (12 of 10 with -short).
// More:
//
//	go test ./allocator -run TestPropertyMultiEnvtest -rapid.checks=500 -rapid.steps=60
func TestPropertyMultiEnvtest(t *testing.T) {
	steps := propertyBudget(t, 60, 20)
	base, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	runMultiProperty(t, func(ctx context.Context, id int) (mmWorld, error) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: fmt.Sprintf("multi-%d-", id)}}
		if err := env.Client.Create(ctx, ns); err != nil {
			return mmWorld{}, fmt.Errorf("create namespace: %w", err)
		}
		cleanup := func() {
			if err := env.Client.Delete(context.WithoutCancel(ctx), ns); err != nil && !apierrors.IsNotFound(err) {
				t.Logf("delete namespace %s: %v", ns.Name, err)
			}
		}
		return mmWorld{raw: env.Client, base: base, ns: ns.Name, cleanup: cleanup}, nil
	}, steps, false)
}
