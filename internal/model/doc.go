// Package model is the reference model of poolalloc's property tests.
//
// A Model is a plain description of the world the allocator works in: which
// pods exist and are ready, which claims exist and what they want, what each
// claim's record on the API server says it holds, and which pods are dirty
// (handed to a claim and not yet both recycled and recorded released). The
// test harness feeds it what happens, in order: the records the allocator
// writes (seen through an interceptor), the recycler's answers, and the
// test's own changes to pods and claims. Model.Write and Model.Reconcile
// check, at each event, the invariants that concern a single change (I1,
// I2, I6, I8); Model.Recycle records what the recycler finished. The Check
// functions compare the
// allocator's store and round results with the model (I1, I3, I4, I5, I8,
// I9). Invariant names are those of the design document.
//
// The model knows nothing about how the allocator chooses pods; it only
// says which outcomes are allowed.
//
//	m := model.New()
//	m.AddPod(key, pool, true)
//	m.AddClaim(uid, name, pool, 2)
//	// ... the allocator writes a record ...
//	if err := m.Write(rec); err != nil { ... }
//	if err := model.CheckExclusive(stores, m); err != nil { ... }
package model
