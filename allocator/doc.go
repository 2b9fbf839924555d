// Package allocator hands the pods of warm pools to the claims that ask for
// them and records every hand-out on the claim itself, so that nothing is
// lost or handed out twice when the operator restarts.
//
// It composes three parts, each replaceable through an Option: an
// algorithm.Algorithm that plans (default algorithm.Packed), a
// syncer.AllocationSyncer that reads and writes claims' records (default:
// annotations under syncer.DefaultKeys, or WithKeys(syncer.OpenSandboxKeys())
// to read and write what OpenSandbox's controller does), and a
// store.AllocationStore that indexes pool → pod → claim in memory. The
// store is the allocator's one index of holdings: it reads who holds what
// from it and keeps no copy of its own, so WithStore swaps the index.
//
// # A round
//
// The caller lists a pool's pods and claims (a claim is any client.Object,
// typed or *unstructured.Unstructured, with the number of pods it wants)
// and calls Allocator.Round. A round:
//
//   - takes in the listing: which pods are present and Ready (PodReady, or
//     WithReadiness), which claims changed, which are being deleted;
//   - plans with the algorithm: free Ready pods go to live claims that
//     want more; pods a claim's owner listed in its release annotation, and
//     pods beyond what a claim wants, go back; a terminating claim gets
//     nothing new and gives back everything it holds;
//   - recycles pods given back through the Recycler (WithRecycler:
//     RecycleNoop by default, RecycleDelete, or your own), also the pods of
//     claims that disappeared without releasing them;
//   - commits: each changed claim's record and the allocation finalizer are
//     written in one request guarded by the claim's resourceVersion. Only
//     then does the store show the hand-out, and a pod is freed only once
//     its release is written. When a terminating claim holds nothing any
//     more its finalizer is removed and the claim goes.
//
// A Claim may carry a Placement (a label selector, a class, a topology
// layout, all or nothing; see package algorithm and docs/design.md §6): a
// claim is never handed a pod its selector does not match (by the labels
// the listing shows), nor part of a gang, whatever the strategy.
//
// The Result says what was allocated and released in this round, which pods
// are idle, recycling or lost, and the Shortfall: how many pods the pool
// must create to meet the demand of its live claims (by class in
// ShortfallByClass). Rounds on one pool are
// serialized by the allocator; rounds on different pools run in parallel.
//
// A caller that follows its pools through informer events can pass just
// what changed to Allocator.Update after a pool's first Round: the cost of
// such a round grows with the changes and the claims still waiting, not
// with the pool. Round itself diffs its listing against what it saw last,
// so an unchanged claim's record is never decoded again either way. A
// claim that is settled (it holds what it wants and has nothing pending)
// keeps no copy of its object: a later write that the input does not
// bring a new version for reads the claim live, and writes only if it is
// still the version known (otherwise it waits for the input, as after a
// conflict).
//
// # Pod marks
//
// Pod marks are on by default (WithPodMarks(false) turns them off). The
// allocator marks each pod it hands out with its claim (an annotation
// written under the pod's resourceVersion before the claim's record,
// removed after the pod's release is recorded). Marks cost a pod write per
// hand-out and per release, and make safe what records alone cannot: a
// claim force-deleted while no allocator ran (its pods are recycled after
// the restart), a record edited by hand (a pod is believed to be a claim's
// only where its mark says so), and several allocators on one pool at
// once, through failovers and listings that lag by less than a quarantine
// (with one limit: records name pods, not UIDs; see WithPodMarks).
//
// The rules every allocator follows are set out in fence.go and
// docs/design.md; in short: a
// newer record is taken in, filtered by the marks; a write keeps only pods
// the version it replaces lists and that are marked for the claim, and adds
// a pod only under a mark newer than that version; a pod whose holder is
// uncertain (listed without a mark, or marked without being listed) is
// recycled for the claim that names it before anyone else gets it; a mark
// goes only once a newer record no longer lists the pod; and before any
// recycler runs, the pod's mark is proven on the API server at the
// resourceVersion the allocator knows. This rests on
// resourceVersions that order writes across pods and claims, as the API
// server's do; build controller-runtime's fake client with
// WithGlobalResourceVersionCounter in tests.
//
// WithMarkHook lets the caller's own change to a pod at hand-out (labels
// for routing, annotations, owner references) ride the patch that marks
// it, and the patch that removes the mark take it off again: an operator
// that labels the pods it hands out pays one pod write per hand-out, not
// two. A change that would touch what the pod carries already, the
// allocator's own annotations, or the claim's selector is refused
// (ErrPodChange) before anything is written.
//
// # Recovery
//
// The first Round of a pool after New rebuilds the pool's allocation from
// the claims' records and the pods' marks, so a new allocator on the same
// API server continues where the last one stopped. It changes nothing
// unless every record of the pool can be read (without pod marks, also no
// pod may be listed by two claims). A claim deleted meanwhile is still
// there, kept by the finalizer, so its pods are recycled before they are
// handed out again; one whose finalizer was removed by hand leaves no
// record, but its pods' marks remain, and they are recycled too (without
// pod marks they look free).
//
// A record entry for a pod that does not exist is not believed (a pod
// created later under the name is a new pod), and a pod marked for a claim
// whose record does not list it is settled: recycled for that claim and
// recorded as released, after a quarantine if the mark is newer than the
// record (a hand-out may still be in flight).
//
// Recovery takes the listing in one pass. The pods' and claims' entries
// are made and the records decoded on several goroutines at once, so the
// readiness rule (WithReadiness) and the syncer's Read may be called
// concurrently; the pods each record lists that are marked for its claim
// are given to it in one store write (store.BulkWriter, where the store
// has it); and a claim that then holds what it wants, with nothing
// pending, is not planned in that round and keeps no copy of its object,
// as a settled claim does.
//
// # Failures
//
// The package never exits or panics on bad input; every failure is an error
// wrapped with the pool and claim it concerns, matching one of the
// sentinels with errors.Is, and a *ClaimError (errors.As) when it concerns
// one claim:
//
//   - ErrInvalidOption: New was given an unusable option.
//   - ErrInvalidInput: the round's input is unusable; nothing changed.
//   - ErrPoolBlocked: a claim's record cannot be trusted (malformed, a pod
//     listed by two claims). The pool fails closed: nothing in it is
//     allocated or released until the record is fixed. Other pools go on.
//   - ErrPlan: the algorithm failed, panicked or broke its contract;
//     nothing was committed.
//   - ErrWrite: a claim's record, or a pod's mark, could not be written;
//     the claim and the store are as they were, and the next round
//     retries. A write whose outcome is unknown keeps its pods out of the
//     pool until it is settled.
//   - ErrRecycle: the recycler failed (or panicked) for a pod; it stays
//     held and is offered again next round.
//   - ErrRead: a live read of a pod or claim failed; what depended on it
//     waits for the next round.
//   - ErrStore: the store could not say who holds what, or refused a
//     write; nothing was decided on a guess. The pool failed closed: the
//     next Round rebuilds it from the records and marks.
//   - ErrInconsistent: the pool's state broke its own rules (a pod asked
//     to make a move its state diagram does not have, a failed self-check
//     with WithInvariantChecks, a panic in a plugin other than the
//     algorithm and the recycler). The pool failed closed, as for
//     ErrStore.
//   - context.Canceled, context.DeadlineExceeded: ctx ended (see Round).
//
// A Round that returns an error still returns a valid Result; run another
// round later. What a round dealt with itself is not an error: it is in
// Result.Warnings, each matching its sentinel:
//
//   - ErrUntrustedRecord: a record lists pods the claim does not hold (not
//     marked for it, absent, or unmarked and so recycled first); they are
//     not handed to it and the record is written again.
//   - ErrInvalidRelease: a claim's release list cannot be read; it is
//     ignored for that claim alone and the pool goes on.
//   - ErrWrite: a mark's removal lost a race with another write of the
//     pod and is retried next round.
//
// Errors name the pool, then the claim or pod, once, then the sentinel and
// the cause: "pool ns/p: claim ns/c: record write failed: ...". Match them
// with errors.Is; use errors.As with *ClaimError for the claim.
//
// # Example
//
//	a, err := allocator.New(mgr.GetClient(),
//		allocator.WithAPIReader(mgr.GetAPIReader()),
//		allocator.WithRecycler(allocator.RecycleDelete(mgr.GetClient())))
//	if err != nil {
//		return err
//	}
//	res, err := a.Round(ctx, allocator.Input{
//		Pool:   types.NamespacedName{Namespace: "ci", Name: "runners"},
//		Pods:   pods.Items,
//		Claims: []allocator.Claim{{Object: job, Want: 2}},
//	})
//	// create res.Shortfall - res.Starting more pods; on error, requeue
package allocator
