package allocator

import (
	"cmp"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/util/resourceversion"
	"pgregory.net/rapid"
)

// TestRVNumAgreesWithApimachinery checks that rvNum reads exactly the
// resourceVersions apimachinery's CompareResourceVersion accepts (within 64
// bits) and orders them as it does.
func TestRVNumAgreesWithApimachinery(t *testing.T) {
	for _, rv := range []string{"", "0", "007", "-1", "1e3", "abc", " 1", "18446744073709551616"} {
		if n := rvNum(rv); n != 0 {
			t.Errorf("rvNum(%q) = %d, want 0 (not a resourceVersion it can keep)", rv, n)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		gen := rapid.OneOf(
			rapid.Custom(func(t *rapid.T) string { return strconv.FormatUint(rapid.Uint64().Draw(t, "n"), 10) }),
			rapid.StringMatching(`0?[0-9]{0,4}x?`),
		)
		a, b := gen.Draw(t, "a"), gen.Draw(t, "b")
		want, err := resourceversion.CompareResourceVersion(a, b)
		na, nb := rvNum(a), rvNum(b)
		if err != nil {
			_, errA := resourceversion.CompareResourceVersion(a, a)
			if (errA != nil) != (na == 0) {
				t.Fatalf("rvNum(%q) = %d, apimachinery says well formed: %v", a, na, errA == nil)
			}
			return
		}
		if na == 0 || nb == 0 {
			t.Fatalf("rvNum(%q), rvNum(%q) = %d, %d for well-formed versions", a, b, na, nb)
		}
		if got := cmp.Compare(na, nb); got != want {
			t.Fatalf("%q vs %q: rvNum orders %d, apimachinery %d", a, b, got, want)
		}
	})
}
