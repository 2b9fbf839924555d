package allocator_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clienttesting "k8s.io/client-go/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/internal/testenv"
)

// TestPropertyFake runs the allocator's state machine (see
// property_machine_test.go) on controller-runtime's fake client: by default
// 1,000 histories of at least 50 steps each (200 of 25 with -short). More:
//
//	go test ./allocator -run TestPropertyFake -rapid.checks=100000 -rapid.steps=200
//
// A failing history is shrunk and saved under testdata/rapid/; rerun it
// with the -rapid.failfile=... line the failure prints.
func TestPropertyFake(t *testing.T) {
	steps := propertyBudget(t, 1000, 50)
	scheme, err := testenv.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{fakeUIDs: true}
	b.namespaces = func(context.Context, int) ([2]string, func(), error) {
		// Every history gets its own fake API server.
		// A plain object tracker: the default one keeps managed fields,
		// which costs most of the run and is not needed here.
		tracker := clienttesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())
		c := serverNoops(fake.NewClientBuilder().WithGlobalResourceVersionCounter().WithScheme(scheme).WithObjectTracker(tracker).
			WithStatusSubresource(&corev1.Pod{}, &testenv.Claim{}).Build())
		b.raw, b.base = c, c
		return [2]string{"ns-a", "ns-b"}, func() {}, nil
	}
	runProperty(t, b, steps, true)
}
