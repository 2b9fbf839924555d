// Package algorithmtest checks that an algorithm.Algorithm keeps the
// contract the allocator relies on, the way testing/fstest checks an fs.FS.
//
// Run drives the algorithm with property tests over random valid inputs
// (see InputGen) and with a few fixed cases, including malformed inputs
// that must give an error wrapping algorithm.ErrInvalidInput or a safe
// Action, never a panic. It checks that Plan
//
//   - is deterministic and keeps no state between calls;
//   - does not modify its input, and returns slices that share no backing
//     array with it;
//   - hands out only candidates, each at most once, and only to claims in
//     the request list, one non-empty grant per claim and list;
//   - gives no claim more than its need, max(0, Want-(len(Held)-len(Release)));
//   - releases every pod the owner gave back, only pods the claim holds,
//     each once, and leaves every claim with at most Want and at least
//     min(Want, len(Held)-len(Release)) pods;
//   - reports Shortfall as the total need minus the pods it allocated, and
//     reports a shortfall only when every candidate was handed out.
//
// A user checks their own strategy with a test like this:
//
//	func TestMyStrategy(t *testing.T) {
//		algorithmtest.Run(t, mystrategy.New())
//	}
//
// The number of random inputs follows rapid's flags, for example
// go test -rapid.checks=10000. rapid keeps inputs that failed under
// testdata/rapid/ in the package being tested and tries them first on the
// next run; keep those files with the tests.
package algorithmtest
