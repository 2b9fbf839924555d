package algorithm

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Packed fills claims one at a time, in order (priority, then age, then
// arrival, then name; see Less): the first claim gets all it wants before
// the next gets any.
type Packed struct{}

// Spread hands out one pod per claim per turn, in order, so that when the
// pool is short every waiting claim gets some pods before any gets all.
type Spread struct{}

var (
	_ Algorithm = Packed{}
	_ Algorithm = Spread{}
)

// Plan implements Algorithm.
func (Packed) Plan(in Input) (Action, error) { return plan(in, false) }

// Plan implements Algorithm.
func (Spread) Plan(in Input) (Action, error) { return plan(in, true) }

// Less reports whether request a is served before request b: higher
// Priority first, then older Created, then lower Arrival, then
// namespace/name, then UID. It is the order both strategies use and a total
// order on distinct UIDs; a strategy of your own may use it too.
func Less(a, b *Request) bool { return compareRequests(a, b) < 0 }

func compareRequests(a, b *Request) int {
	if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
		return c
	}
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Arrival, b.Arrival); c != 0 {
		return c
	}
	if c := strings.Compare(a.Claim.Namespace, b.Claim.Namespace); c != 0 {
		return c
	}
	if c := strings.Compare(a.Claim.Name, b.Claim.Name); c != 0 {
		return c
	}
	return strings.Compare(string(a.UID), string(b.UID))
}

// plan is shared by both strategies: releases are decided the same way, and
// only the order in which candidates are dealt out differs.
func plan(in Input, spread bool) (Action, error) {
	order := make([]*Request, len(in.Requests))
	for i := range in.Requests {
		order[i] = &in.Requests[i]
	}
	slices.SortStableFunc(order, compareRequests)

	var act Action
	need := make([]int, len(order))
	for i, r := range order {
		if r.Want < 0 {
			return Action{}, fmt.Errorf("%w: claim %s: negative want %d", ErrInvalidInput, r.Claim, r.Want)
		}
		rel, err := releases(r)
		if err != nil {
			return Action{}, err
		}
		if len(rel) > 0 {
			act.Release = append(act.Release, Grant{UID: r.UID, Claim: r.Claim, Pods: rel})
		}
		if keep := len(r.Held) - len(r.Release); r.Want > keep {
			need[i] = r.Want - keep
		}
	}

	// Deal candidates in input order, skipping a name seen twice so that
	// a malformed input can never make one pod go to two claims. A
	// request's Avoid pods are passed over for it while other candidates
	// are left, and stay for the others.
	dealt := make(map[string]struct{})
	next := 0 // candidates before next are all dealt (or unusable)
	draw := func(r *Request) (string, bool) {
		for next < len(in.Candidates) {
			if _, dup := dealt[in.Candidates[next].Name]; !dup && in.Candidates[next].Name != "" {
				break
			}
			next++
		}
		fallback := -1
		for i := next; i < len(in.Candidates); i++ {
			name := in.Candidates[i].Name
			if _, dup := dealt[name]; dup || name == "" {
				continue
			}
			if slices.Contains(r.Avoid, name) {
				if fallback < 0 {
					fallback = i
				}
				continue
			}
			dealt[name] = struct{}{}
			return name, true
		}
		if fallback >= 0 {
			name := in.Candidates[fallback].Name
			dealt[name] = struct{}{}
			return name, true
		}
		return "", false
	}
	got := make([][]string, len(order))
	if spread {
		for more := true; more; {
			more = false
			for i := range order {
				if len(got[i]) == need[i] {
					continue
				}
				name, ok := draw(order[i])
				if !ok {
					break
				}
				got[i] = append(got[i], name)
				more = true
			}
		}
	} else {
		for i := range order {
			for len(got[i]) < need[i] {
				name, ok := draw(order[i])
				if !ok {
					break
				}
				got[i] = append(got[i], name)
			}
		}
	}
	for i, r := range order {
		if len(got[i]) > 0 {
			act.Allocate = append(act.Allocate, Grant{UID: r.UID, Claim: r.Claim, Pods: got[i]})
		}
		act.Shortfall += need[i] - len(got[i])
	}
	return act, nil
}

// releases returns the pods r gives back: those its owner released, then,
// if it still holds more than it wants, the surplus, chosen as the
// greatest names so that the choice is stable across rounds and restarts.
//
// Whenever it names pods it first checks the part of r it relies on (Held
// and Release without repeats, Release within Held), so that a malformed
// request yields an error wrapping ErrInvalidInput instead of a panic or a
// pod named twice. Its cost grows with len(r.Held), never with the pool.
func releases(r *Request) ([]string, error) {
	keep := len(r.Held) - len(r.Release)
	if len(r.Release) == 0 && keep <= r.Want {
		return nil, nil
	}
	released := make(map[string]bool, len(r.Held)) // held pod → owner released it
	for _, p := range r.Held {
		if _, dup := released[p]; dup {
			return nil, fmt.Errorf("%w: claim %s: pod %q held twice", ErrInvalidInput, r.Claim, p)
		}
		released[p] = false
	}
	out := make([]string, 0, len(r.Release)+max(0, keep-r.Want))
	for _, p := range r.Release {
		done, held := released[p]
		if !held {
			return nil, fmt.Errorf("%w: claim %s: released pod %q is not held", ErrInvalidInput, r.Claim, p)
		}
		if done {
			return nil, fmt.Errorf("%w: claim %s: pod %q released twice", ErrInvalidInput, r.Claim, p)
		}
		released[p] = true
		out = append(out, p)
	}
	if keep <= r.Want {
		return out, nil
	}
	// Held and Release are now known to be repeat-free with Release in
	// Held, so exactly keep pods remain and keep > r.Want >= 0.
	kept := make([]string, 0, keep)
	for _, p := range r.Held {
		if !released[p] {
			kept = append(kept, p)
		}
	}
	slices.Sort(kept)
	return append(out, kept[r.Want:]...), nil
}
