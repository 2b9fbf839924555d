// Package storetest checks that an implementation of store.AllocationStore
// keeps the interface's contract, in the way testing/fstest checks an
// fs.FS.
//
// Run takes a constructor, calls it once per subtest for an empty store,
// and covers every method of the Reader and Writer halves: all-or-nothing
// Allocate and Free and the errors they return (store.ErrPodHeld with a
// *store.HeldError naming the holder, store.ErrNotHeld,
// store.ErrInvalidArgument), Count agreeing with Held, sorted results,
// DeletePool, pools of the same name in two namespaces sharing nothing,
// claims known by UID rather than name, arguments neither modified nor
// retained, results owned by the caller, concurrent use (run it with
// -race), and a pgregory.net/rapid state-machine test against a plain map
// model. A store that is also a store.BulkWriter has AllocateAll checked
// too, in a subtest and in the model.
//
// To check your own implementation, call Run from a test in your package:
//
//	func TestMyStore(t *testing.T) {
//		storetest.Run(t, func() store.AllocationStore {
//			return mystore.New() // a new, empty store each call
//		})
//	}
//
// When the model test fails, rapid saves the failing case under
// testdata/rapid/ in the package being tested and replays it on later
// runs; keep those files with the tests.
package storetest
