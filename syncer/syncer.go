package syncer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Record is what a claim carries about its pods.
//
// Allocated and Released are written by the allocator only; Release is
// written by the claim's owner only. A pod the claim holds is one in
// Allocated and not in Released.
type Record struct {
	// Allocated lists the pods handed to the claim.
	Allocated []string
	// Release lists pods the claim's owner gives back.
	Release []string
	// Released lists pods whose recycling finished: the pool may hand them
	// out again.
	Released []string
}

// Held returns the pods of Allocated that are not in Released, in the
// order of Allocated, each once: a record in OpenSandbox's format (see
// WithOpenSandboxFormat) may list a pod more than once, and a pod listed
// in Released is not held however often Allocated lists it. The result is
// a new slice.
func (r Record) Held() []string {
	if len(r.Allocated) == 0 {
		return nil
	}
	out := make([]string, 0, len(r.Allocated))
	if len(r.Released) == 0 && len(r.Allocated) <= dupScanLimit {
		for i, p := range r.Allocated {
			if !slices.Contains(r.Allocated[:i], p) {
				out = append(out, p)
			}
		}
		return out
	}
	skip := make(map[string]struct{}, len(r.Released)+len(r.Allocated))
	for _, p := range r.Released {
		skip[p] = struct{}{}
	}
	for _, p := range r.Allocated {
		if _, ok := skip[p]; !ok {
			out = append(out, p)
			skip[p] = struct{}{}
		}
	}
	return out
}

// AllocationSyncer reads and writes claims' records and the allocation
// finalizer on the API server.
//
// Implementations must be safe for concurrent use. They must never modify
// the claim passed in: a write works on a copy, and only the returned object
// shows the new state.
type AllocationSyncer interface {
	// Read decodes claim's record from the object as given. It makes no API
	// call. A record that cannot be trusted (malformed, a pod listed twice,
	// an invalid pod name, too large) is a *RecordError naming the claim,
	// the annotation and the reason. When only the owner's release list is
	// unreadable, the error matches ErrMalformedRelease and the Record
	// returned holds Allocated and Released (Release empty).
	Read(claim client.Object) (Record, error)

	// Write stores rec.Allocated and rec.Released on the claim and adds
	// (finalizer true) or removes (false) the allocation finalizer, in one
	// request guarded by the claim's resourceVersion: if the claim changed on
	// the server since, nothing is written and the error is a Conflict
	// (apierrors.IsConflict). rec.Release is not written: it belongs to the
	// owner. A record that would exceed the API server's annotation size
	// limit is refused before anything is sent, with an error matching
	// ErrRecordTooLarge; so is one that Read would refuse (an invalid pod
	// name, a pod listed twice), matching ErrMalformedRecord. Other
	// finalizers and annotations are kept. On success it returns the claim
	// as the server stored it, as a new object of the claim's Go type, at
	// a resourceVersion newer than claim's: every successful Write makes a
	// new version, even when rec and the finalizer are what claim holds
	// already (an API server keeps the resourceVersion of a patch that
	// changes nothing, so such a write must change something else, as
	// AnnotationSyncer does with Keys.Touched). The allocator relies on
	// it: the new version of a record that no longer lists a pod is what
	// lets the pod's mark go. The one exception: a write that removes the
	// last finalizer of a claim being deleted lets the claim go, and the
	// API server returns its last state at the resourceVersion replaced.
	//
	// Errors say whether the write landed. These mean it did not, for
	// certain: a *RecordError (ErrRecordTooLarge, ErrMalformedRecord), and
	// the API server's Conflict, NotFound, Invalid, Forbidden,
	// Unauthorized, BadRequest, RequestEntityTooLarge and
	// MethodNotSupported (apierrors.IsConflict, ...). Any other error (a
	// timeout, a dropped connection, an internal error, a cancelled
	// context) leaves the outcome unknown: the allocator then keeps the
	// pods the write named out of the pool (a quarantine) until it has
	// read the claim back and settled them. An implementation must not
	// turn an unknown outcome into one of the definite errors.
	Write(ctx context.Context, claim client.Object, rec Record, finalizer bool) (client.Object, error)

	// Get reads the claim's current state from the API server itself,
	// bypassing any cache, into a new object of the claim's Go type. It is
	// used to settle conflicts and writes whose outcome is unknown. A claim
	// that no longer exists is a NotFound error (apierrors.IsNotFound).
	Get(ctx context.Context, claim client.Object) (client.Object, error)

	// HasFinalizer reports whether claim carries the allocation finalizer.
	HasFinalizer(claim client.Object) bool
}

// Errors of this package. Match them with errors.Is.
var (
	// ErrMalformedRecord: an annotation holds something that is not a valid
	// record. Returned as a *RecordError.
	ErrMalformedRecord = errors.New("malformed record")
	// ErrMalformedRelease: the owner's release list cannot be read. It
	// also matches ErrMalformedRecord. Read returns it only when the rest
	// of the record is readable, together with that rest, so that a caller
	// can refuse the owner's request alone and keep the record.
	ErrMalformedRelease = fmt.Errorf("release list: %w", ErrMalformedRecord)
	// ErrRecordTooLarge: a record would exceed the API server's limit on
	// the total size of an object's annotations.
	ErrRecordTooLarge = errors.New("record too large")
	// ErrInvalidKeys: Keys with an empty or invalid annotation or finalizer
	// name, or two keys equal.
	ErrInvalidKeys = errors.New("invalid keys")
	// ErrInvalidOption: NewAnnotationSyncer was given a nil client, a nil
	// option or WithAPIReader(nil), as allocator.New refuses them.
	ErrInvalidOption = errors.New("invalid option")
)

// RecordError says which claim's record could not be used, in which
// annotation, and why. It matches ErrMalformedRecord, or ErrRecordTooLarge
// when the record is over the size limit.
//
// EncodePods and DecodePods return it with Claim and Key empty: they see a
// value, not a claim.
type RecordError struct {
	// Claim is the claim's namespace and name; zero when the error comes
	// from the codec alone (DecodePods, EncodePods).
	Claim types.NamespacedName
	// Key is the annotation.
	Key string
	// Reason says what is wrong, for people.
	Reason string
	// Err is the sentinel it matches.
	Err error
}

func (e *RecordError) Error() string {
	var b strings.Builder
	if e.Claim.Name != "" {
		b.WriteString("claim ")
		b.WriteString(e.Claim.String())
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString("record ")
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	fmt.Fprintf(&b, "%s: %v", e.Reason, e.Err)
	return b.String()
}

func (e *RecordError) Unwrap() error { return e.Err }
