package allocator

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Errors returned by New and by Allocator methods, wrapped with the object
// they concern. Match them with errors.Is; use errors.As with *ClaimError
// for the claim's name.
var (
	// ErrInvalidOption: New was given an option it cannot use (a nil
	// option; nil given to WithStore, WithSyncer, WithAPIReader,
	// WithClaimType, WithAlgorithm, WithReadiness, WithRecycler or
	// WithClock; a non-positive write concurrency; keys together with a
	// custom syncer, ...).
	ErrInvalidOption = errors.New("invalid option")
	// ErrInvalidInput: a round's input is unusable as a whole: an empty
	// pool name, a nil claim object, a claim or pod of another namespace,
	// a claim or pod listed twice, a negative Want. Nothing was changed.
	ErrInvalidInput = errors.New("invalid round input")
	// ErrPoolBlocked: the pool fails closed because a claim's record
	// cannot be trusted (see the wrapped *ClaimError). No pod of the pool
	// is allocated or released until the record is fixed; other pools are
	// not affected.
	ErrPoolBlocked = errors.New("pool blocked")
	// ErrPlan: the algorithm returned an error or an action that breaks its
	// contract (a pod that is not a candidate, a pod twice, a release of a
	// pod the claim does not hold). Nothing was committed.
	ErrPlan = errors.New("algorithm plan rejected")
	// ErrWrite: a claim's record, or a pod's mark, could not be written.
	// Its pods are as they were on the API server and in the store; the
	// next round retries.
	ErrWrite = errors.New("record write failed")
	// ErrRecycle: the recycle hook failed for a pod. The pod stays held by
	// its claim and is offered to the hook again next round.
	ErrRecycle = errors.New("recycle failed")
	// ErrUntrustedRecord: a claim's record differs from what the allocator
	// knows the claim holds: it lists pods the allocator never gave it, or
	// misses pods it holds (edited by hand, or, with pod marks, pods not
	// marked for it at recovery). Pods it lists wrongly are not handed to
	// it, pods it misses stay held, and the next write of its record puts
	// it right. Reported in Result.Warnings, not as an error of the round.
	ErrUntrustedRecord = errors.New("record differs from what the claim holds")
	// ErrInvalidRelease: a claim's release list (its owner's request to
	// give pods back) cannot be read. It is taken as empty for that claim
	// alone; the claim keeps its pods and the pool goes on. Reported in
	// Result.Warnings, not as an error of the round.
	ErrInvalidRelease = errors.New("release request unreadable")
	// ErrRead: a live read of a pod or claim (WithAPIReader, else the
	// client) failed. What depended on it waits for the next round;
	// nothing was decided on a guess.
	ErrRead = errors.New("live read failed")
	// ErrStore: the store (WithStore), the index of holdings, failed to
	// answer. A pod whose holder it cannot tell counts as held: nothing is
	// handed out or released on a guess, and the next round tries again.
	ErrStore = errors.New("store failed")
	// ErrPodChange: a MarkHook's change to a pod was refused (see
	// WithMarkHook: a label the pod carries, the allocator's own
	// annotation, an invalid key or value, a controller owner reference)
	// or the hook panicked. Nothing was written to the pod: at hand-out it
	// is not handed out in that round, at release it stays marked; the
	// next round tries again.
	ErrPodChange = errors.New("pod change refused")
	// ErrInconsistent: the pool's state broke one of its invariants (a
	// pod moved between states in a way docs/design.md does not allow, or
	// the self-check found the pool's indexes disagreeing): a bug. The
	// pool failed closed: what it knew was dropped, nothing more was
	// decided on it, and the next Round rebuilds it from the records and
	// marks, as after a restart (Update returns ErrInvalidInput until
	// then).
	ErrInconsistent = errors.New("pool state inconsistent")
)

// ClaimError is an error about one claim. It matches the sentinel in Err.
type ClaimError struct {
	Pool  types.NamespacedName
	Claim types.NamespacedName
	UID   types.UID
	Err   error
}

func (e *ClaimError) Error() string {
	// The errors wrapped may name the claim themselves (the syncer's do):
	// it is named once, here.
	msg := strings.ReplaceAll(e.Err.Error(), "claim "+e.Claim.String()+": ", "")
	return fmt.Sprintf("pool %s: claim %s: %s", e.Pool, e.Claim, msg)
}

func (e *ClaimError) Unwrap() error { return e.Err }

// storeErr wraps an error of the store's writer with ErrStore, once.
func storeErr(err error) error {
	if errors.Is(err, ErrStore) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStore, err)
}
