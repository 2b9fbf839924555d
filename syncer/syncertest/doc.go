// Package syncertest is a conformance suite for syncer.AllocationSyncer,
// in the spirit of testing/fstest: run it on your own implementation, or
// on syncer.AnnotationSyncer with your own claim type, against a real API
// server (envtest) or controller-runtime's fake client. Only a real API
// server shows a syncer that breaks EveryWriteMakesANewVersion: the fake
// client gives every patch a new resourceVersion, even one that changes
// nothing.
//
// Run takes a function that, per subtest, returns the syncer under test,
// a client on the same API server, and a factory for claims that the
// client may create:
//
//	func TestMySyncer(t *testing.T) {
//		syncertest.Run(t, func(t *testing.T) (syncer.AllocationSyncer, client.Client, func(string) client.Object) {
//			ns := makeNamespace(t) // a fresh namespace, or a shared one
//			s, err := syncer.NewAnnotationSyncer(k8sClient, syncer.DefaultKeys(),
//				syncer.WithAPIReader(apiReader))
//			if err != nil {
//				t.Fatal(err)
//			}
//			newClaim := func(name string) client.Object {
//				return &myv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
//			}
//			return s, k8sClient, newClaim
//		})
//	}
//
// Subtests run in parallel. Each creates the claims it needs under fixed
// names (so a namespace may be shared by the subtests of one Run, but not by
// two Runs at once) and removes them when it ends, finalizers included.
package syncertest
