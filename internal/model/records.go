package model

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/syncer"
)

// Record is a claim as read from the API server (or as the allocator is
// about to write it): its identity, spec and decoded record.
type Record struct {
	UID  types.UID
	Name types.NamespacedName
	// Pool is spec.poolRef in the claim's namespace.
	Pool types.NamespacedName
	// Want is spec.replicas.
	Want int
	// RV is the resourceVersion.
	RV          string
	Terminating bool
	// Finalizer is whether the allocation finalizer is present; Finalizers
	// counts all finalizers.
	Finalizer  bool
	Finalizers int
	// Held is allocated minus released, sorted; Released and Release are
	// as stored, sorted.
	Held, Released, Release []string
}

// Records are records keyed by claim UID.
type Records map[types.UID]Record

// Decode reads obj, a *testenv.Claim or an *unstructured.Unstructured
// claim, with the default keys of package syncer.
func Decode(obj client.Object) (Record, error) {
	keys := syncer.DefaultKeys()
	ann := obj.GetAnnotations()
	var lists [3][]string
	for i, k := range [...]string{keys.Allocated, keys.Released, keys.Release} {
		pods, err := syncer.DecodePods(ann[k])
		if err != nil {
			return Record{}, fmt.Errorf("claim %s/%s: %s: %w", obj.GetNamespace(), obj.GetName(), k, err)
		}
		lists[i] = pods
	}
	r := Record{
		UID:         obj.GetUID(),
		Name:        client.ObjectKeyFromObject(obj),
		RV:          obj.GetResourceVersion(),
		Terminating: obj.GetDeletionTimestamp() != nil,
		Finalizer:   slices.Contains(obj.GetFinalizers(), keys.Finalizer),
		Finalizers:  len(obj.GetFinalizers()),
		Held:        syncer.Record{Allocated: lists[0], Released: lists[1]}.Held(),
		Released:    slices.Clone(lists[1]),
		Release:     slices.Clone(lists[2]),
	}
	slices.Sort(r.Held)
	slices.Sort(r.Released)
	slices.Sort(r.Release)
	r.Pool.Namespace = obj.GetNamespace()
	switch o := obj.(type) {
	case *testenv.Claim:
		r.Pool.Name, r.Want = o.Spec.PoolRef, int(o.Spec.Replicas)
	case *unstructured.Unstructured:
		r.Pool.Name, _, _ = unstructured.NestedString(o.Object, "spec", "poolRef")
		want, _, _ := unstructured.NestedInt64(o.Object, "spec", "replicas")
		r.Want = int(want)
	default:
		return Record{}, fmt.Errorf("claim %s: unsupported type %T", r.Name, obj)
	}
	return r, nil
}

// ReadRecords lists the test claims of the namespaces and decodes them.
func ReadRecords(ctx context.Context, c client.Reader, namespaces ...string) (Records, error) {
	out := make(Records)
	for _, ns := range namespaces {
		var list testenv.ClaimList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return nil, fmt.Errorf("list claims in %s: %w", ns, err)
		}
		for i := range list.Items {
			r, err := Decode(&list.Items[i])
			if err != nil {
				return nil, err
			}
			out[r.UID] = r
		}
	}
	return out, nil
}
