package syncer_test

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/syncer"
)

// A ConfigMap stands in for a claim: any client.Object will do.
func Example() {
	ctx := context.Background()
	c := fake.NewClientBuilder().WithObjects(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sandbox-1"}},
	).Build()
	s, err := syncer.NewAnnotationSyncer(c, syncer.OpenSandboxKeys())
	if err != nil {
		panic(err)
	}

	claim, err := s.Get(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sandbox-1"}})
	if err != nil {
		panic(err)
	}
	rec, err := s.Read(claim)
	if err != nil {
		panic(err)
	}
	rec.Allocated = append(rec.Allocated, "pool-x7k2p", "pool-9qz4m")
	stored, err := s.Write(ctx, claim, rec, true)
	if err != nil {
		panic(err)
	}
	fmt.Println(stored.GetAnnotations()[syncer.OpenSandboxKeys().Allocated])
	fmt.Println("finalizer:", s.HasFinalizer(stored), "- caller's copy:", s.HasFinalizer(claim))

	// claim is stale now: writing from it again changes nothing.
	_, err = s.Write(ctx, claim, syncer.Record{}, false)
	fmt.Println("conflict:", apierrors.IsConflict(err))
	// Output:
	// {"pods":["pool-x7k2p","pool-9qz4m"]}
	// finalizer: true - caller's copy: false
	// conflict: true
}

func ExampleAnnotationSyncer_Read() {
	s, err := syncer.NewAnnotationSyncer(fake.NewClientBuilder().Build(), syncer.DefaultKeys())
	if err != nil {
		panic(err)
	}
	claim := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace: "default", Name: "sandbox-2",
		Annotations: map[string]string{"poolalloc.io/allocated": `{"pods":["pod-a","pod-a"]}`},
	}}
	_, err = s.Read(claim)
	fmt.Println(err)
	var re *syncer.RecordError
	if errors.As(err, &re) {
		fmt.Println(re.Claim, re.Key, errors.Is(err, syncer.ErrMalformedRecord))
	}
	// Output:
	// claim default/sandbox-2: record poolalloc.io/allocated: pod "pod-a" listed twice: malformed record
	// default/sandbox-2 poolalloc.io/allocated true
}

func ExampleDecodePods() {
	pods, err := syncer.DecodePods(`{"pods":["pool-x7k2p","pool-9qz4m"]}`)
	fmt.Println(pods, err)
	_, err = syncer.DecodePods(`{"pods":"pool-x7k2p"}`)
	fmt.Println(err)
	// Output:
	// [pool-x7k2p pool-9qz4m] <nil>
	// "pods" must be a list of pod names or null, got a string: malformed record
}
