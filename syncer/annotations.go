package syncer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// AnnotationSyncer keeps a claim's record in three annotations of the claim,
// each holding {"pods":[...]} (see EncodePods), and the allocation
// finalizer in its finalizers. A write that would change neither sets a
// fourth annotation, Keys.Touched. It works on any client.Object the client
// can patch: typed objects and *unstructured.Unstructured alike.
//
// It holds no state besides its configuration and is safe for concurrent
// use.
type AnnotationSyncer struct {
	c      client.Client
	reader client.Reader
	keys   Keys
	// repeats is set by WithOpenSandboxFormat: a list may name a pod more
	// than once.
	repeats bool
}

var _ AllocationSyncer = (*AnnotationSyncer)(nil)

// Option configures an AnnotationSyncer.
type Option interface {
	apply(*options)
}

type options struct {
	apiReader    client.Reader
	apiReaderSet bool
	repeats      bool
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithAPIReader makes Get read through r instead of the client. Get must
// see the API server's current state, so when the client reads from a
// cache (as a manager's client does), pass mgr.GetAPIReader().
func WithAPIReader(r client.Reader) Option {
	return optionFunc(func(o *options) {
		o.apiReader = r
		o.apiReaderSet = true
	})
}

// WithOpenSandboxFormat makes the syncer read and write records as
// OpenSandbox's controller does, where a list may name a pod more than
// once: that controller appends a pod to alloc-status each time it hands
// the pod out, also when it hands a pod the sandbox released back to the
// same sandbox, and never removes one. Read then returns the lists as
// written, repeats included, and Write accepts them; pod names are still
// checked. Without it, a pod listed twice is a malformed record.
//
// Reading a repeat as one pod is what OpenSandbox's own sandbox controller
// does: the pods a sandbox uses are the set of alloc-status minus the set
// of alloc-released (see Record.Held), so a pod handed back after its
// release is not in use by the sandbox either, and is safe to treat as
// released.
func WithOpenSandboxFormat() Option {
	return optionFunc(func(o *options) { o.repeats = true })
}

// NewAnnotationSyncer returns a syncer that writes with c and keeps records
// under keys. Without WithAPIReader, Get reads through c. It fails when c
// is nil, an option is nil or WithAPIReader was given nil (matching
// ErrInvalidOption), or when keys.Validate fails (matching ErrInvalidKeys).
func NewAnnotationSyncer(c client.Client, keys Keys, opts ...Option) (*AnnotationSyncer, error) {
	if c == nil {
		return nil, fmt.Errorf("syncer: %w: nil client", ErrInvalidOption)
	}
	o := options{apiReader: c}
	for i, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("syncer: %w: option %d is nil", ErrInvalidOption, i)
		}
		opt.apply(&o)
	}
	if o.apiReaderSet && o.apiReader == nil {
		return nil, fmt.Errorf("syncer: %w: WithAPIReader(nil)", ErrInvalidOption)
	}
	if err := keys.Validate(); err != nil {
		return nil, fmt.Errorf("syncer: %w", err)
	}
	return &AnnotationSyncer{c: c, reader: o.apiReader, keys: keys, repeats: o.repeats}, nil
}

// Keys returns the keys the syncer reads and writes.
func (s *AnnotationSyncer) Keys() Keys { return s.keys }

// Read decodes the Allocated, Release and Released annotations of claim
// with DecodePods. An absent annotation is an empty list. A pod may be in
// Released without being in Allocated (OpenSandbox's controller can leave
// such records); a pod listed twice in one annotation is an error, unless
// the syncer has WithOpenSandboxFormat (the lists are then as written). Any
// problem is a *RecordError naming the claim and the annotation; when the
// annotations are over the API server's size limit (possible only on an
// object that did not come from the server) it matches ErrRecordTooLarge.
// An unreadable release list alone matches ErrMalformedRelease, and the
// record returned with it has Allocated and Released.
func (s *AnnotationSyncer) Read(claim client.Object) (Record, error) {
	if isNil(claim) {
		return Record{}, errors.New("syncer: read: claim is nil")
	}
	ann := claim.GetAnnotations()
	// One pass over the annotations finds their size and the record's
	// three values (a recovery reads thousands of claims).
	var size int
	var allocated, released, releaseReq string
	for k, v := range ann {
		size += len(k) + len(v)
		switch k {
		case s.keys.Allocated:
			allocated = v
		case s.keys.Released:
			released = v
		case s.keys.Release:
			releaseReq = v
		}
	}
	if size > MaxAnnotationsSize {
		return Record{}, &RecordError{
			Claim:  client.ObjectKeyFromObject(claim),
			Key:    s.largest(ann),
			Reason: fmt.Sprintf("annotations total %d bytes, over the API server's limit of %d", size, MaxAnnotationsSize),
			Err:    ErrRecordTooLarge,
		}
	}
	// Field by field: a loop over pointers to them would move rec to the
	// heap, an allocation per call.
	var rec Record
	var err error
	if rec.Allocated, err = decodePods(allocated, s.repeats); err != nil {
		return Record{}, withClaim(err, claim, s.keys.Allocated)
	}
	if rec.Released, err = decodePods(released, s.repeats); err != nil {
		return Record{}, withClaim(err, claim, s.keys.Released)
	}
	release, err := decodePods(releaseReq, s.repeats)
	if err != nil {
		err = withClaim(err, claim, s.keys.Release)
		var re *RecordError
		if errors.As(err, &re) && errors.Is(re.Err, ErrMalformedRecord) {
			re.Err = ErrMalformedRelease
		}
		return rec, err
	}
	rec.Release = release
	return rec, nil
}

// Write stores rec.Allocated and rec.Released on a copy of claim (removing
// an annotation whose list is empty), adds or removes the finalizer, and
// sends it all as one JSON merge patch that carries claim's resourceVersion.
// The API server applies it only if the claim did not change since: else
// the error is a Conflict and nothing was written. This also keeps the
// finalizers of other controllers, which a merge patch would otherwise
// overwrite. rec.Release is not written. A write that would change none of
// this sets the Keys.Touched annotation to claim's resourceVersion instead,
// so that it too makes a new version of the claim.
//
// Before sending, it encodes both lists (an invalid pod name or, without
// WithOpenSandboxFormat, a pod listed twice is a *RecordError matching
// ErrMalformedRecord) and checks
// the total size of the claim's annotations as the API server counts it
// (a *RecordError matching ErrRecordTooLarge). claim must carry a
// resourceVersion, as objects read from the API server do.
//
// The API server refuses to add a finalizer to a claim that is being
// deleted; removing the last finalizer of such a claim lets it go, and the
// object returned is its last state.
//
// claim is never modified; on success the returned object, of the same Go
// type, is the claim as the server stored it. Errors from the client are
// wrapped with the claim's name; apierrors.IsConflict and
// apierrors.IsNotFound see through the wrapping.
func (s *AnnotationSyncer) Write(ctx context.Context, claim client.Object, rec Record, finalizer bool) (client.Object, error) {
	if isNil(claim) {
		return nil, errors.New("syncer: write: claim is nil")
	}
	name := claimName(claim)
	if claim.GetResourceVersion() == "" {
		return nil, fmt.Errorf("claim %s: write record: claim has no resourceVersion; pass the object as read from the API server", name)
	}
	allocated, err := encode(rec.Allocated, claim, s.keys.Allocated, s.repeats)
	if err != nil {
		return nil, err
	}
	released, err := encode(rec.Released, claim, s.keys.Released, s.repeats)
	if err != nil {
		return nil, err
	}

	obj, ok := claim.DeepCopyObject().(client.Object)
	if !ok {
		return nil, fmt.Errorf("claim %s: write record: %T.DeepCopyObject does not return a client.Object", name, claim)
	}
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = make(map[string]string, 2)
	}
	setOrDelete(ann, s.keys.Allocated, allocated)
	setOrDelete(ann, s.keys.Released, released)
	if finalizer {
		controllerutil.AddFinalizer(obj, s.keys.Finalizer)
	} else {
		controllerutil.RemoveFinalizer(obj, s.keys.Finalizer)
	}
	if maps.Equal(ann, claim.GetAnnotations()) && slices.Equal(obj.GetFinalizers(), claim.GetFinalizers()) {
		// The API server would keep the resourceVersion of a patch that
		// changes nothing. The value differs from the annotation's: a
		// write that set it made a version newer than that value.
		ann[s.keys.Touched] = claim.GetResourceVersion()
	}
	if size := annotationsSize(ann); size > MaxAnnotationsSize {
		key := s.keys.Allocated
		if len(released) > len(allocated) {
			key = s.keys.Released
		}
		return nil, &RecordError{
			Claim: client.ObjectKeyFromObject(claim),
			Key:   key,
			Reason: fmt.Sprintf("annotations would total %d bytes (%d allocated, %d released pods), over the API server's limit of %d",
				size, len(rec.Allocated), len(rec.Released), MaxAnnotationsSize),
			Err: ErrRecordTooLarge,
		}
	}
	if len(ann) == 0 {
		ann = nil
	}
	obj.SetAnnotations(ann)

	// The patch is the difference between claim and obj, plus claim's
	// resourceVersion. Patch reads claim and overwrites only obj.
	patch := client.MergeFromWithOptions(claim, client.MergeFromWithOptimisticLock{})
	if err := s.c.Patch(ctx, obj, patch); err != nil {
		return nil, fmt.Errorf("claim %s: write record: %w", name, err)
	}
	return obj, nil
}

// Get reads claim, by namespace and name, into a new object of the same Go
// type through the API reader (see WithAPIReader). For
// *unstructured.Unstructured and other objects that need it, the new
// object gets claim's GroupVersionKind. A claim that no longer exists is a
// NotFound error (apierrors.IsNotFound sees through the wrapping).
func (s *AnnotationSyncer) Get(ctx context.Context, claim client.Object) (client.Object, error) {
	if isNil(claim) {
		return nil, errors.New("syncer: get: claim is nil")
	}
	name := claimName(claim)
	live, err := newEmpty(claim)
	if err != nil {
		return nil, fmt.Errorf("claim %s: get: %w", name, err)
	}
	if err := s.reader.Get(ctx, client.ObjectKeyFromObject(claim), live); err != nil {
		return nil, fmt.Errorf("claim %s: get: %w", name, err)
	}
	return live, nil
}

// HasFinalizer reports whether claim carries the allocation finalizer. A
// nil claim does not.
func (s *AnnotationSyncer) HasFinalizer(claim client.Object) bool {
	if isNil(claim) {
		return false
	}
	return controllerutil.ContainsFinalizer(claim, s.keys.Finalizer)
}

// largest returns the record annotation with the longest value.
func (s *AnnotationSyncer) largest(ann map[string]string) string {
	key := s.keys.Allocated
	for _, k := range [...]string{s.keys.Release, s.keys.Released} {
		if len(ann[k]) > len(ann[key]) {
			key = k
		}
	}
	return key
}

// encode encodes pods for annotation key of claim; an empty list is "".
func encode(pods []string, claim client.Object, key string, repeats bool) (string, error) {
	if len(pods) == 0 {
		return "", nil
	}
	v, err := encodePods(pods, repeats)
	if err != nil {
		return "", withClaim(err, claim, key)
	}
	return v, nil
}

// withClaim fills in Claim and Key of a *RecordError from the codec.
func withClaim(err error, claim client.Object, key string) error {
	var re *RecordError
	if !errors.As(err, &re) {
		return fmt.Errorf("claim %s: record %s: %w", claimName(claim), key, err)
	}
	out := *re
	out.Claim = client.ObjectKeyFromObject(claim)
	out.Key = key
	return &out
}

func setOrDelete(m map[string]string, key, value string) {
	if value == "" {
		delete(m, key)
		return
	}
	m[key] = value
}

// annotationsSize counts as the API server does: len(key)+len(value) summed
// over all annotations.
func annotationsSize(ann map[string]string) int {
	n := 0
	for k, v := range ann {
		n += len(k) + len(v)
	}
	return n
}

func claimName(claim client.Object) string {
	if ns := claim.GetNamespace(); ns != "" {
		return ns + "/" + claim.GetName()
	}
	return claim.GetName()
}

// isNil reports whether obj is nil or a nil pointer, on which the
// client.Object methods would panic.
func isNil(obj client.Object) bool {
	if obj == nil {
		return true
	}
	v := reflect.ValueOf(obj)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// newEmpty returns a new, empty object of claim's Go type that the client
// can read into.
func newEmpty(claim client.Object) (client.Object, error) {
	if _, ok := claim.(*unstructured.Unstructured); ok {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(claim.GetObjectKind().GroupVersionKind())
		return u, nil
	}
	t := reflect.TypeOf(claim)
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("cannot make a new %T: want a pointer to a struct", claim)
	}
	obj, ok := reflect.New(t.Elem()).Interface().(client.Object)
	if !ok {
		return nil, fmt.Errorf("new %T is not a client.Object", claim)
	}
	// Objects such as PartialObjectMetadata need their kind to be read;
	// typed objects ignore it.
	if gvk := claim.GetObjectKind().GroupVersionKind(); !gvk.Empty() {
		obj.GetObjectKind().SetGroupVersionKind(gvk)
	}
	return obj, nil
}
