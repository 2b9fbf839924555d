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

// TestPropertyMultiFake runs the multi-allocator state machine (see
// property_multi_test.go) on controller-runtime's fake client, with a
// global resourceVersion counter and patches that change nothing kept at
// their version (serverNoops), as on a real API server: by default 1,000
// histories of at least 30 steps each (200 of 15 with -short). More:
//
//	go test ./allocator -run TestPropertyMultiFake -rapid.checks=20000 -rapid.steps=100
//
// It also runs under -race. A failing history is shrunk and saved under
// testdata/rapid/; rerun it with the -rapid.failfile=... line the failure
// prints.
func TestPropertyMultiFake(t *testing.T) {
	steps := propertyBudget(t, 1000, 30)
	scheme, err := testenv.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	runMultiProperty(t, func(context.Context, int) (mmWorld, error) {
		// Every history gets its own fake API server. A plain object
		// tracker: the default one keeps managed fields, which costs
		// most of the run and is not needed here.
		tracker := clienttesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())
		c := serverNoops(fake.NewClientBuilder().WithScheme(scheme).WithObjectTracker(tracker).
			WithGlobalResourceVersionCounter().
			WithStatusSubresource(&corev1.Pod{}, &testenv.Claim{}).Build())
		return mmWorld{raw: c, base: c, ns: "ns", fakeUIDs: true, cleanup: func() {}}, nil
	}, steps, true)
}
