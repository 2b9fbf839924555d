// Package store holds the allocation index of poolalloc: for each pool,
// which claim holds which pod.
//
// The allocator writes to a store only after the matching record is
// durable on the API server, and rebuilds it from those records after a
// restart, so the store shows what the API server holds. It makes no API
// calls and knows no claim types: a claim is a Holder, its UID and its
// namespaced name, and pods are names within a pool.
//
// AllocationStore is the interface the allocator uses; InMemory is its
// implementation, locked per pool so that rounds on different pools run in
// parallel. Failures are wrapped errors matching ErrPodHeld (with a
// *HeldError naming the holder), ErrNotHeld or ErrInvalidArgument.
// Package storetest is a conformance suite for other implementations.
//
//	s := store.NewInMemory()
//	pool := types.NamespacedName{Namespace: "ci", Name: "runners"}
//	claim := store.Holder{UID: job.UID, Claim: types.NamespacedName{Namespace: "ci", Name: job.Name}}
//	if err := s.Allocate(pool, claim, []string{"runner-0", "runner-1"}); errors.Is(err, store.ErrPodHeld) {
//		// another claim holds one of them; nothing was recorded
//	}
//	pods, _ := s.Held(pool, claim.UID) // [runner-0 runner-1]
package store
