package store

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
)

// checkAfterRandomCalls drives a store with random calls, valid and not,
// on two pools of one name, and after every step runs the check that
// newStore returned with it: a look at the store's own structure, which
// the conformance suite cannot see.
func checkAfterRandomCalls(t *testing.T, newStore func(*rapid.T) (AllocationStore, func() error)) {
	pools := []types.NamespacedName{{Namespace: "a", Name: "pool"}, {Namespace: "b", Name: "pool"}}
	holders := []Holder{
		{UID: "u1", Claim: types.NamespacedName{Namespace: "a", Name: "one"}},
		{UID: "u2", Claim: types.NamespacedName{Namespace: "a", Name: "two"}},
		{UID: "u1", Claim: types.NamespacedName{Namespace: "a", Name: "renamed"}}, // refused while u1 holds pods
		{UID: "u3", Claim: types.NamespacedName{Namespace: "a", Name: "three"}},
		{Claim: types.NamespacedName{Namespace: "a", Name: "no-uid"}},
	}
	names := []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9"}
	rapid.Check(t, func(t *rapid.T) {
		s, check := newStore(t)
		pool := rapid.SampledFrom(pools)
		holder := rapid.SampledFrom(holders)
		// Mostly distinct names; now and then a repeat or an empty one.
		podList := rapid.Custom(func(t *rapid.T) []string {
			pods := rapid.SliceOfNDistinct(rapid.SampledFrom(names), 0, len(names), rapid.ID).Draw(t, "pods")
			switch rapid.IntRange(0, 9).Draw(t, "spoil") {
			case 0:
				pods = append(pods, "")
			case 1:
				if len(pods) > 0 {
					pods = slices.Insert(pods, 0, pods[len(pods)-1])
				}
			}
			return pods
		})
		t.Repeat(map[string]func(*rapid.T){
			"Allocate": func(t *rapid.T) {
				_ = s.Allocate(pool.Draw(t, "pool"), holder.Draw(t, "holder"), podList.Draw(t, "pods"))
			},
			"Free": func(t *rapid.T) {
				_ = s.Free(pool.Draw(t, "pool"), holder.Draw(t, "holder").UID, podList.Draw(t, "pods"))
			},
			"DeletePool": func(t *rapid.T) {
				_ = s.DeletePool(pool.Draw(t, "pool"))
			},
			"": func(t *rapid.T) {
				if err := check(); err != nil {
					t.Fatal(err)
				}
			},
		})
	})
}
