// Package allocator hands the pods of warm pools to the claims that ask for
// them and records every hand-out on the claim itself, so that nothing is
// lost or handed out twice when the operator restarts.
//
// It composes three parts, each replaceable through an Option: an
// algorithm.Algorithm that plans (default algorithm.Packed), a
// syncer.AllocationSyncer that reads and writes claims' records (default:
// annotations under syncer.DefaultKeys, or WithKeys(syncer.OpenSandboxKeys())
// to read and write what OpenSandbox's controller does), and a
// store.AllocationStore that indexes pool → pod → claim in memory.
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
// The Result says what was allocated and released in this round, which pods
// are idle, recycling or lost, and the Shortfall: how many pods the pool
// must create to meet the demand of its live claims. Rounds on one pool are
// serialized by the allocator; rounds on different pools run in parallel.
//
// A caller that follows its pools through informer events can pass just
// what changed to Allocator.Update after a pool's first Round: the cost of
// such a round grows with the changes and the claims still waiting, not
// with the pool. Round itself diffs its listing against what it saw last,
// so an unchanged claim's record is never decoded again either way.
//
// # Pod marks
//
// WithPodMarks makes the allocator also mark each pod it hands out with its
// claim (an annotation written under the pod's resourceVersion before the
// claim's record, removed after the pod's release). Marks cost a pod write
// per hand-out and per release, and make three things safe that records
// alone cannot: a claim force-deleted while no allocator ran (its pods are
// recycled after the restart), a record forged before a restart (a pod
// marked for one claim is never believed to be another's), and two
// allocators running on one pool at once (only one can mark a pod).
//
// # Recovery
//
// The first Round of a pool after New rebuilds the pool's allocation from
// the claims' records, so a new allocator on the same API server continues
// where the last one stopped. It changes nothing unless every record of the
// pool can be read and no pod is claimed twice. A claim deleted meanwhile
// is still there, kept by the finalizer, so its pods are recycled before
// they are handed out again. A claim whose finalizer was removed by hand
// while no allocator ran leaves no record: without pod marks its pods look
// free; with them they are recycled.
//
// After recovery the allocator's own index is the truth: a record edited
// by hand (pods added, removed or marked released) is written again as the
// allocator knows it, and pods it lists that the claim does not hold are
// not handed to it.
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
//   - ErrPlan: the algorithm failed or broke its contract; nothing was
//     committed.
//   - ErrWrite: a claim's record could not be written; the claim and the
//     store are as they were, and the next round retries. A write whose
//     outcome is unknown keeps its pods out of the pool until it is settled.
//   - ErrRecycle: the recycler failed for a pod; it stays held and is
//     offered again next round.
//   - ErrUntrustedRecord: a record differs from what the claim holds (pods
//     the allocator never gave it, or held pods missing); the pods are not
//     handed to it and the record is written again.
//
// A Round that returns an error still returns a valid Result; run another
// round later.
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
//	// create res.Shortfall more pods; on error, requeue
package allocator
