package syncer

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
)

// Keys names the annotations that hold a claim's record and the finalizer
// that keeps a claim until its pods are released.
type Keys struct {
	// Allocated is the annotation listing the pods handed to the claim.
	Allocated string
	// Release is the annotation where the claim's owner lists pods it
	// gives back.
	Release string
	// Released is the annotation listing pods whose recycling finished.
	Released string
	// Finalizer keeps the claim while it holds pods.
	Finalizer string
	// Touched is the annotation AnnotationSyncer.Write sets, to the
	// resourceVersion the write replaces, when the write would change
	// nothing else: an API server keeps the resourceVersion of a patch
	// that changes nothing, and every write must make a new version of
	// the claim (see AllocationSyncer.Write). Nothing reads it.
	Touched string
}

// DefaultKeys returns the keys of poolalloc's own domain.
func DefaultKeys() Keys {
	return Keys{
		Allocated: "poolalloc.io/allocated",
		Release:   "poolalloc.io/release",
		Released:  "poolalloc.io/released",
		Finalizer: "poolalloc.io/allocation",
		Touched:   "poolalloc.io/touched",
	}
}

// OpenSandboxKeys returns the keys OpenSandbox's Kubernetes controller
// uses. With them an operator that ran that controller keeps its live
// allocations when it switches to poolalloc.
func OpenSandboxKeys() Keys {
	return Keys{
		Allocated: "sandbox.opensandbox.io/alloc-status",
		Release:   "sandbox.opensandbox.io/alloc-release",
		Released:  "sandbox.opensandbox.io/alloc-released",
		Finalizer: "pool.sandbox.opensandbox.io/pool-allocation",
		// OpenSandbox has no such annotation; it ignores this one.
		Touched: "poolalloc.io/touched",
	}
}

// Validate checks that all five keys are set and are qualified names (the
// form the API server requires of annotation keys and finalizers, such as
// "example.com/name"), and that the four annotations differ. The error
// matches ErrInvalidKeys and names the field at fault.
func (k Keys) Validate() error {
	fields := [...]struct{ name, value string }{
		{"Allocated", k.Allocated},
		{"Release", k.Release},
		{"Released", k.Released},
		{"Touched", k.Touched},
		{"Finalizer", k.Finalizer},
	}
	for _, f := range fields {
		if f.value == "" {
			return fmt.Errorf("%w: %s is empty", ErrInvalidKeys, f.name)
		}
		if msgs := content.IsLabelKey(f.value); len(msgs) > 0 {
			return fmt.Errorf("%w: %s %q: %s", ErrInvalidKeys, f.name, f.value, strings.Join(msgs, "; "))
		}
	}
	annotations := fields[:4]
	for i := range annotations {
		for j := i + 1; j < len(annotations); j++ {
			if annotations[i].value == annotations[j].value {
				return fmt.Errorf("%w: %s and %s are both %q", ErrInvalidKeys, annotations[i].name, annotations[j].name, annotations[i].value)
			}
		}
	}
	return nil
}
