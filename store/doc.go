// Package store holds the allocation index of poolalloc: for each pool,
// which claim holds which pod.
//
// The allocator writes to a store only after the matching record is
// durable on the API server, and rebuilds it from those records after a
// restart, so the store shows what the API server holds. It makes no API
// calls and knows no claim types: a claim is a Holder, its UID and its
// namespaced name, and pods are names within a pool.
//
// AllocationStore is the interface the allocator uses. It is made of two
// role interfaces: Reader (HolderOf, Held, Count, Holders, Snapshot,
// Pools) and Writer (Allocate, Free, DeletePool). Hand the Reader half to
// code that must see holdings but must not change them; only the
// allocator writes. Failures are wrapped errors matching ErrPodHeld (with
// a *HeldError naming the holder), ErrNotHeld or ErrInvalidArgument.
//
// A store may also be a BulkWriter: AllocateAll makes many allocations in
// one call, as the allocator's recovery of a pool makes them (InMemory is
// one).
//
// Two implementations pass the same conformance suite, package storetest,
// which also checks other implementations. InMemory, the allocator's
// default, is locked per pool so that rounds on different pools run in
// parallel, and costs time per call proportional to the pods in the call.
// Sorted, written independently, keeps each pool as rows sorted by pod
// name; it is simpler and slower on large pools.
//
//	s := store.NewInMemory()
//	pool := types.NamespacedName{Namespace: "ci", Name: "runners"}
//	claim := store.Holder{UID: job.UID, Claim: types.NamespacedName{Namespace: "ci", Name: job.Name}}
//	if err := s.Allocate(pool, claim, []string{"runner-0", "runner-1"}); errors.Is(err, store.ErrPodHeld) {
//		// another claim holds one of them; nothing was recorded
//	}
//	pods, _ := s.Held(pool, claim.UID) // [runner-0 runner-1]
//
//	var r store.Reader = s // for code that only looks
//	n, _ := r.Count(pool, claim.UID) // 2
package store
