package store_test

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolalloc/poolalloc/store"
)

func ExampleInMemory() {
	s := store.NewInMemory()
	pool := types.NamespacedName{Namespace: "ci", Name: "runners"}
	build := store.Holder{UID: "7c1e", Claim: types.NamespacedName{Namespace: "ci", Name: "build-1"}}
	lint := store.Holder{UID: "a93f", Claim: types.NamespacedName{Namespace: "ci", Name: "lint-1"}}

	if err := s.Allocate(pool, build, []string{"runner-2", "runner-0"}); err != nil {
		fmt.Println(err)
		return
	}
	held, _ := s.Held(pool, build.UID)
	n, _ := s.Count(pool, build.UID)
	fmt.Println("build holds", held, "-", n, "pods")

	// All or nothing: runner-1 is free, but runner-2 is not.
	err := s.Allocate(pool, lint, []string{"runner-1", "runner-2"})
	var he *store.HeldError
	if errors.As(err, &he) {
		fmt.Println(he.Pod, "is held by", he.Holder.Claim)
	}
	_, ok, _ := s.HolderOf(pool, "runner-1")
	fmt.Println("runner-1 held:", ok)

	if err := s.Free(pool, build.UID, []string{"runner-2"}); err != nil {
		fmt.Println(err)
		return
	}
	err = s.Free(pool, build.UID, []string{"runner-2"})
	fmt.Println(errors.Is(err, store.ErrNotHeld))
	fmt.Println(err)

	// Output:
	// build holds [runner-0 runner-2] - 2 pods
	// runner-2 is held by ci/build-1
	// runner-1 held: false
	// true
	// pool ci/runners: pod runner-2: pod is not held by the claim with UID 7c1e: it is held by no claim
}

// A Reader is what to hand code that must see holdings but must not
// change them, such as a metrics collector or a status reporter.
func ExampleReader() {
	s := store.NewSorted()
	pool := types.NamespacedName{Namespace: "ci", Name: "runners"}
	build := store.Holder{UID: "7c1e", Claim: types.NamespacedName{Namespace: "ci", Name: "build-1"}}
	if err := s.Allocate(pool, build, []string{"runner-1", "runner-0", "runner-3"}); err != nil {
		fmt.Println(err)
		return
	}

	report(s, pool)

	// Output:
	// ci/build-1 (uid 7c1e) holds 3 pods
	// runner-2 held: false
}

// report reads the store through its Reader half only.
func report(r store.Reader, pool types.NamespacedName) {
	holders, _ := r.Holders(pool)
	for _, h := range holders {
		n, _ := r.Count(pool, h.UID)
		fmt.Println(h, "holds", n, "pods")
	}
	_, held, _ := r.HolderOf(pool, "runner-2")
	fmt.Println("runner-2 held:", held)
}
