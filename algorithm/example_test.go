package algorithm_test

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolalloc/poolalloc/algorithm"
)

// shortPool is three free pods for three claims that want two each.
func shortPool() algorithm.Input {
	claim := func(name string) algorithm.Request {
		return algorithm.Request{
			UID:   types.UID("uid-" + name),
			Claim: types.NamespacedName{Namespace: "team", Name: name},
			Want:  2,
		}
	}
	return algorithm.Input{
		Candidates: []algorithm.Candidate{{Name: "pod-1"}, {Name: "pod-2"}, {Name: "pod-3"}},
		Requests:   []algorithm.Request{claim("alpha"), claim("beta"), claim("gamma")},
	}
}

func printAction(act algorithm.Action) {
	for _, g := range act.Allocate {
		fmt.Println(g.Claim, g.Pods)
	}
	fmt.Println("shortfall:", act.Shortfall)
}

// Packed fills the first claim before the next one gets anything.
func ExamplePacked() {
	act, err := algorithm.Packed{}.Plan(shortPool())
	if err != nil {
		fmt.Println(err)
		return
	}
	printAction(act)
	// Output:
	// team/alpha [pod-1 pod-2]
	// team/beta [pod-3]
	// shortfall: 3
}

// Spread deals one pod per claim per turn, so every claim gets one.
func ExampleSpread() {
	act, err := algorithm.Spread{}.Plan(shortPool())
	if err != nil {
		fmt.Println(err)
		return
	}
	printAction(act)
	// Output:
	// team/alpha [pod-1]
	// team/beta [pod-2]
	// team/gamma [pod-3]
	// shortfall: 3
}

// A claim that holds more than it wants gives back its greatest pod names,
// after the pods its owner released.
func ExamplePacked_release() {
	act, err := algorithm.Packed{}.Plan(algorithm.Input{
		Requests: []algorithm.Request{{
			UID:     "uid-alpha",
			Claim:   types.NamespacedName{Namespace: "team", Name: "alpha"},
			Want:    1,
			Held:    []string{"pod-a", "pod-b", "pod-c", "pod-d"},
			Release: []string{"pod-b"},
		}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, g := range act.Release {
		fmt.Println(g.Claim, "gives back", g.Pods)
	}
	// Output:
	// team/alpha gives back [pod-b pod-c pod-d]
}
