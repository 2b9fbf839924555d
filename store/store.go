package store

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
)

// Holder identifies the claim that holds a pod. Claims are known by UID: a
// claim deleted and recreated under the same name is a different holder.
type Holder struct {
	UID   types.UID
	Claim types.NamespacedName
}

func (h Holder) String() string { return fmt.Sprintf("%s (uid %s)", h.Claim, h.UID) }

// AllocationStore is the index pool → pod → claim. It makes no API calls
// and knows no claim types; the allocator writes to it only after the
// matching record is durable on the API server, so the store shows what the
// API server holds.
//
// It is a Reader and a Writer. Hand out the Reader half to code that must
// see holdings but must not change them; only the allocator writes.
//
// Pools are independent: an implementation must let calls on different
// pools proceed in parallel and must be safe for concurrent use. Every
// method returns an error, so that an implementation backed by something
// that can fail fits the interface; an in-memory one fails only on invalid
// arguments. Slices and maps returned belong to the caller; slices passed in
// are not retained or modified.
type AllocationStore interface {
	Reader
	Writer
}

// Reader is the read half of an AllocationStore.
//
// No Reader method returns a sentinel error: an in-memory implementation
// never fails a read, and one backed by something that can fail returns its
// own wrapped error. A read of a pool the store does not know, or of a
// claim holding nothing, is not an error: it reads as empty.
type Reader interface {
	// HolderOf returns the claim holding pod in pool; ok is false when the
	// pod is held by no claim.
	HolderOf(pool types.NamespacedName, pod string) (h Holder, ok bool, err error)

	// Held returns the pods the claim with uid holds in pool, sorted by
	// name; empty when it holds none. The slice belongs to the caller.
	Held(pool types.NamespacedName, uid types.UID) ([]string, error)

	// Count returns how many pods the claim with uid holds in pool: the
	// length of what Held would return, without building it. It is meant
	// for hot paths and should not allocate.
	Count(pool types.NamespacedName, uid types.UID) (int, error)

	// Holders returns the claims holding at least one pod in pool, sorted
	// by namespace, name, then UID. The slice belongs to the caller.
	Holders(pool types.NamespacedName) ([]Holder, error)

	// Snapshot returns a copy of pool's index, pod name → holder. The map
	// belongs to the caller.
	Snapshot(pool types.NamespacedName) (map[string]Holder, error)

	// Pools returns the pools with at least one held pod, sorted by
	// namespace, then name. The slice belongs to the caller.
	Pools() ([]types.NamespacedName, error)
}

// Writer is the write half of an AllocationStore. Writers neither modify
// nor retain the pods slice they are given.
type Writer interface {
	// Allocate records that h holds pods in pool. It is all or nothing: if
	// any pod is already held (by h or by another claim) it changes nothing
	// and returns a *HeldError (matching ErrPodHeld). An empty pod name, an
	// empty h.UID or a pod listed twice is ErrInvalidArgument, and also
	// changes nothing.
	Allocate(pool types.NamespacedName, h Holder, pods []string) error

	// Free records that the claim with uid no longer holds pods in pool. It
	// is all or nothing: if any pod is not held by that claim it changes
	// nothing and returns an error matching ErrNotHeld. An empty pod name,
	// an empty uid or a pod listed twice is ErrInvalidArgument, and also
	// changes nothing.
	Free(pool types.NamespacedName, uid types.UID, pods []string) error

	// DeletePool forgets everything about pool; a later Allocate starts it
	// empty. Deleting an unknown pool is not an error. It returns no
	// sentinel error.
	DeletePool(pool types.NamespacedName) error
}

// Allocation is one allocation of BulkWriter.AllocateAll: Holder holds
// Pods.
type Allocation struct {
	Holder Holder
	Pods   []string
}

// BulkWriter is what a store may offer beyond Writer: many allocations in
// one call, as a pool's recovery makes them, one per claim. The allocator
// uses it when its store implements it, Allocate otherwise. storetest
// checks it where it is implemented.
type BulkWriter interface {
	// AllocateAll makes allocs in order, each as Allocate(pool,
	// a.Holder, a.Pods) would at its turn (a pod of one may not be in an
	// earlier one). It stops at the first that fails, which changes
	// nothing, and returns its index and the error Allocate would return;
	// those before it are made. When all are made it returns len(allocs)
	// and nil. It neither modifies nor retains allocs or their pods.
	AllocateAll(pool types.NamespacedName, allocs []Allocation) (int, error)
}

// Errors returned by AllocationStore implementations, wrapped with the pool
// and pod they concern. Match them with errors.Is.
var (
	// ErrPodHeld: Allocate was asked for a pod that a claim already holds.
	ErrPodHeld = errors.New("pod is already held")
	// ErrNotHeld: Free was asked for a pod the claim does not hold.
	ErrNotHeld = errors.New("pod is not held by the claim")
	// ErrInvalidArgument: an empty name or UID, or a pod listed twice.
	ErrInvalidArgument = errors.New("invalid argument")
)

// HeldError reports which claim holds a pod that Allocate was asked for.
// It matches ErrPodHeld.
type HeldError struct {
	Pool   types.NamespacedName
	Pod    string
	Holder Holder
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("pool %s: pod %s: %v by claim %s", e.Pool, e.Pod, ErrPodHeld, e.Holder)
}

// Is makes errors.Is(err, ErrPodHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrPodHeld }
