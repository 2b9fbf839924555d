package algorithm

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// Candidate is a pod the pool can hand out now: Ready, not terminating and
// held by no claim. The allocator decides what is a candidate; the algorithm
// only chooses among them.
type Candidate struct {
	// Name is the pod's name, unique within the pool.
	Name string
	// Node is the name of the node the pod runs on, empty if unknown.
	Node string
	// Zone is the pod's topology zone, empty if unknown.
	Zone string
	// Labels are the pod's labels, nil if unknown. They are read-only and
	// may be shared between candidates.
	Labels labels.Labels
	// NodeLabels are the labels of the node the pod runs on, nil if
	// unknown (package allocator fills them with WithNodeLabels). A
	// topology key a pod's labels lack is looked up here (Domain);
	// selectors match only the pod's own labels.
	NodeLabels labels.Labels
}

// Request is one claim's demand on the pool in this round.
type Request struct {
	// UID identifies the claim. A claim deleted and recreated under the same
	// name is a different request.
	UID types.UID
	// Claim is the claim's namespace and name, for ordering and messages.
	Claim types.NamespacedName
	// Want is the number of pods the claim wants to hold. Zero for a claim
	// that is being deleted.
	Want int
	// Held lists the pods the claim holds and keeps, excluding pods already
	// on their way back to the pool.
	Held []string
	// HeldPods describes the pods of Held, in the same order, where a
	// strategy needs to know where they run (TopologySpread or
	// TopologyPack); nil otherwise.
	HeldPods []Candidate
	// Release lists pods of Held that the claim's owner gives back. The
	// allocator has checked that each one is in Held.
	Release []string
	// Avoid lists pods the claim gave back recently (its owner still lists
	// them as released). A strategy should give the claim other candidates
	// first and one of these only when no other is left, so that a claim
	// that releases a pod without lowering its Want (to replace a pod it
	// found broken, say) does not get the same pod straight back. Packed
	// and Spread do.
	Avoid []string
	// Priority orders claims: higher first.
	Priority int32
	// Created is the claim's creation time: among equal priorities, older
	// first.
	Created time.Time
	// Arrival is the order in which the caller first saw the claim, lower
	// first: among equal priorities and creation times (which the API
	// server keeps to the second), the claim that arrived first is served
	// first. The allocator numbers claims in the order it first saw them
	// (and, among claims first seen in one listing, by resourceVersion); it
	// is an input like the others, so a strategy's output stays a function
	// of its input.
	Arrival uint64
	// Placement is where the claim's pods may run and how they are handed
	// out: a selector, a topology layout, all or nothing.
	Placement Placement
}

// Input is everything an algorithm may look at.
type Input struct {
	// Candidates are the free pods, in the order the allocator keeps them.
	Candidates []Candidate
	// Requests are the claims whose holdings may change this round.
	Requests []Request
}

// Grant names pods for one claim: pods to allocate to it, or pods it gives
// back, depending on the list it is in.
type Grant struct {
	UID   types.UID
	Claim types.NamespacedName
	Pods  []string
}

// Action is an algorithm's plan for one round. The caller persists it; the
// algorithm persists nothing.
type Action struct {
	// Allocate lists, per claim, candidates to hand to it. No candidate
	// appears twice across all grants.
	Allocate []Grant
	// Release lists, per claim, held pods to give back to the pool: the
	// pods its owner released and the pods it holds beyond Want.
	Release []Grant
	// Shortfall is how many more pods the pool must create to satisfy every
	// request: the sum over requests of the demand left unmet.
	Shortfall int
	// ShortfallByClass is Shortfall by the requests' Placement.Class: the
	// demand left unmet of the requests of each class, for each class with
	// some. Nil when Shortfall is 0.
	ShortfallByClass map[string]int
}

// Algorithm chooses which free pods go to which claims.
//
// Plan must be a pure function of its input: the same Input gives the same
// Action, it keeps no state between calls, and it reads no clock, random
// source or global. It must not modify the Input or anything the Input
// refers to, and the Action it returns must share no slice with the Input.
// On an input that Validate refuses it either returns an error wrapping
// ErrInvalidInput or an Action that is still safe: it allocates only
// candidates, each once and to one request, and releases only pods the
// request holds. It never panics on bad input. algorithmtest.Run checks
// all of this. (The allocator hands a strategy a copy of its state and
// checks every Action against the pool itself, so a strategy that breaks
// the contract cannot hand out a held pod; ErrPlan reports it.)
type Algorithm interface {
	Plan(in Input) (Action, error)
}

// ErrInvalidInput is returned (wrapped) by Validate and by the algorithms of
// this package when an Input is inconsistent.
var ErrInvalidInput = errors.New("invalid algorithm input")

// Validate checks the consistency an Algorithm may rely on: candidate names
// are non-empty and unique, request UIDs are non-empty and unique, Want is
// not negative, a request's held pods are unique and not candidates, no pod
// is held by two requests, every Release entry is in Held, HeldPods is
// empty or describes Held in order, and a Placement's topology mode is
// known and its MaxSkew not negative.
func Validate(in Input) error {
	cands := make(map[string]struct{}, len(in.Candidates))
	for _, c := range in.Candidates {
		if c.Name == "" {
			return fmt.Errorf("%w: candidate with empty name", ErrInvalidInput)
		}
		if _, dup := cands[c.Name]; dup {
			return fmt.Errorf("%w: candidate %q listed twice", ErrInvalidInput, c.Name)
		}
		cands[c.Name] = struct{}{}
	}
	uids := make(map[types.UID]struct{}, len(in.Requests))
	holder := make(map[string]types.NamespacedName)
	for _, r := range in.Requests {
		if r.UID == "" {
			return fmt.Errorf("%w: claim %s: empty UID", ErrInvalidInput, r.Claim)
		}
		if _, dup := uids[r.UID]; dup {
			return fmt.Errorf("%w: claim %s: UID %s requested twice", ErrInvalidInput, r.Claim, r.UID)
		}
		uids[r.UID] = struct{}{}
		if r.Want < 0 {
			return fmt.Errorf("%w: claim %s: negative want %d", ErrInvalidInput, r.Claim, r.Want)
		}
		if err := r.Placement.validate(&r); err != nil {
			return err
		}
		held := make(map[string]struct{}, len(r.Held))
		for _, p := range r.Held {
			if _, dup := held[p]; dup {
				return fmt.Errorf("%w: claim %s: pod %q held twice", ErrInvalidInput, r.Claim, p)
			}
			if _, isCand := cands[p]; isCand {
				return fmt.Errorf("%w: claim %s: held pod %q is also a candidate", ErrInvalidInput, r.Claim, p)
			}
			if other, taken := holder[p]; taken {
				return fmt.Errorf("%w: claim %s: pod %q is also held by claim %s", ErrInvalidInput, r.Claim, p, other)
			}
			holder[p] = r.Claim
			held[p] = struct{}{}
		}
		seen := make(map[string]struct{}, len(r.Release))
		for _, p := range r.Release {
			if _, ok := held[p]; !ok {
				return fmt.Errorf("%w: claim %s: released pod %q is not held", ErrInvalidInput, r.Claim, p)
			}
			if _, dup := seen[p]; dup {
				return fmt.Errorf("%w: claim %s: pod %q released twice", ErrInvalidInput, r.Claim, p)
			}
			seen[p] = struct{}{}
		}
	}
	return nil
}
