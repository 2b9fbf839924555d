// Package syncer reads and writes claims' allocation records and the
// allocation finalizer on the Kubernetes API server.
//
// A Record lists the pods handed to a claim (Allocated), the pods its
// owner gives back (Release) and the pods whose recycling finished
// (Released). AllocationSyncer is the interface the allocator uses;
// AnnotationSyncer implements it on a controller-runtime client.Client by
// keeping each list in an annotation of the claim as {"pods":[...]} (see
// EncodePods and DecodePods). Any client.Object can be a claim: a typed
// CRD or *unstructured.Unstructured.
//
// Keys names the three annotations of the record, the finalizer, and a
// fourth annotation (Touched) that Write sets only when a write would
// change nothing else, so that every write makes a new version of the
// claim. DefaultKeys uses poolalloc.io; OpenSandboxKeys reads and writes
// the record and finalizer exactly as OpenSandbox's controller does (plus
// poolalloc.io/touched, which it ignores), so an operator can switch to
// poolalloc and keep its live allocations.
//
// Records are input from whoever can edit a claim. Read fails closed: a
// record it cannot trust is a *RecordError (matching ErrMalformedRecord or
// ErrRecordTooLarge) naming the claim, the annotation and the reason.
// Write changes a copy of the claim, guards the patch with the claim's
// resourceVersion (a stale claim is a Conflict and nothing is written),
// refuses a record over the API server's annotation size limit before
// sending it, and always makes a new version of the claim.
//
//	s, err := syncer.NewAnnotationSyncer(mgr.GetClient(), syncer.DefaultKeys(),
//		syncer.WithAPIReader(mgr.GetAPIReader()))
//	if err != nil {
//		return err
//	}
//	rec, err := s.Read(claim) // a *RecordError if the record is not trusted
//	if err != nil {
//		return err
//	}
//	rec.Allocated = append(rec.Allocated, "pod-a")
//	claim, err = s.Write(ctx, claim, rec, true) // Conflict if claim is stale
//
// Package syncertest holds a conformance suite for any AllocationSyncer.
package syncer
