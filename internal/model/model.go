package model

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// Key names a pod by namespace and name. Pods of pools with the same name in
// two namespaces have different keys.
type Key = types.NamespacedName

// Pod is what the model knows of one pod.
type Pod struct {
	// Pool is the pool the pod was created for.
	Pool types.NamespacedName
	// Exists is false once the pod was deleted from the API server. A pod
	// that is terminating (deletionTimestamp set) still exists.
	Exists bool
	// Ready is allocator.PodReady of the pod as stored: false for a pod
	// that is terminating or gone.
	Ready bool
}

// Claim is what the model knows of one claim: its spec, its lifecycle, and
// its record as last durably written on the API server.
type Claim struct {
	UID  types.UID
	Name types.NamespacedName
	Pool types.NamespacedName
	// Want is spec.replicas as last set by the owner.
	Want int
	// Terminating is set once the claim has a deletionTimestamp.
	Terminating bool
	// Gone is set once the claim no longer exists on the API server.
	Gone bool
	// Forced is set when the test stripped the claim's finalizers to make
	// it go at once.
	Forced bool

	// Held and Released are the record's pods: Held is allocated minus
	// released.
	Held     map[string]bool
	Released map[string]bool
	// Finalizer is whether the claim carries the allocation finalizer.
	Finalizer bool
}

// Dirty is a pod that was handed to a claim and is not yet clean: clean
// means the recycler reported it done (or it was deleted) and then either
// the claim's record listed it as released or the claim went away.
type Dirty struct {
	// Claim is the claim the pod was last handed to.
	Claim types.UID
	// Recycled is set when the recycler reported the pod done, or the pod
	// was deleted, after it was handed out.
	Recycled bool
}

// Model is the reference model. Its maps are exported so that tests can
// look, but they should change it only through its methods, which check
// the invariants each change must keep.
type Model struct {
	Pods   map[Key]*Pod
	Claims map[types.UID]*Claim
	Dirty  map[Key]*Dirty
}

// New returns an empty model.
func New() *Model {
	return &Model{
		Pods:   make(map[Key]*Pod),
		Claims: make(map[types.UID]*Claim),
		Dirty:  make(map[Key]*Dirty),
	}
}

// AddPod records a new pod of pool.
func (m *Model) AddPod(key Key, pool types.NamespacedName, ready bool) {
	m.Pods[key] = &Pod{Pool: pool, Exists: true, Ready: ready}
}

// SetReady records the pod's readiness as the allocator's rule sees it.
func (m *Model) SetReady(key Key, ready bool) {
	if p := m.Pods[key]; p != nil {
		p.Ready = ready && p.Exists
	}
}

// DeletePod records that the pod is gone from the API server. A dirty pod
// that is gone counts as recycled.
func (m *Model) DeletePod(key Key) {
	if p := m.Pods[key]; p != nil {
		p.Exists, p.Ready = false, false
	}
	if d := m.Dirty[key]; d != nil {
		d.Recycled = true
	}
	m.settle()
}

// AddClaim records a new claim with an empty record.
func (m *Model) AddClaim(uid types.UID, name, pool types.NamespacedName, want int) {
	m.Claims[uid] = &Claim{
		UID: uid, Name: name, Pool: pool, Want: want,
		Held: map[string]bool{}, Released: map[string]bool{},
	}
}

// Scale records the owner's new spec.replicas.
func (m *Model) Scale(uid types.UID, want int) {
	if c := m.Claims[uid]; c != nil {
		c.Want = want
	}
}

// Terminate records that the claim got a deletionTimestamp.
func (m *Model) Terminate(uid types.UID) {
	if c := m.Claims[uid]; c != nil {
		c.Terminating = true
	}
}

// Force records that the test stripped every finalizer of the claim and
// deleted it: it is gone, and what it held is orphaned.
func (m *Model) Force(uid types.UID) {
	if c := m.Claims[uid]; c != nil {
		c.Forced, c.Gone = true, true
	}
	m.settle()
}

// holderOf returns the existing claim whose record holds key, other than
// except.
func (m *Model) holderOf(key Key, except types.UID) types.UID {
	for uid, c := range m.Claims {
		if uid != except && !c.Gone && c.Name.Namespace == key.Namespace && c.Held[key.Name] {
			return uid
		}
	}
	return ""
}

// Holders returns, for every pod held by an existing claim's record, that
// claim.
func (m *Model) Holders() map[Key]types.UID {
	out := make(map[Key]types.UID)
	for uid, c := range m.Claims {
		if c.Gone {
			continue
		}
		for p := range c.Held {
			out[Key{Namespace: c.Name.Namespace, Name: p}] = uid
		}
	}
	return out
}

// Recycle records one answer of the recycler for pod key. The recycler may
// also be asked about a pod that is not dirty: the allocator recycles, to
// be safe, pods a write of unknown outcome may have handed to a claim that
// is gone.
func (m *Model) Recycle(key Key, done bool) {
	if d := m.Dirty[key]; d != nil && done {
		d.Recycled = true
	}
	m.settle()
}

// Write applies a record the allocator wrote durably on the API server and
// checks the change against the claim's previous record:
//
//   - a pod newly held must exist, be ready, belong to the claim's pool,
//     be held by no other existing claim and not be dirty (I1, I2, I6, I9),
//     and the claim must not be terminating (I8);
//   - a pod no longer held must be listed as released and have been
//     recycled since it was handed out (I6), unless it no longer exists;
//   - a record that holds pods carries the finalizer, and the finalizer is
//     never added to a terminating claim (I8).
//
// gone says the write removed the last finalizer of a terminating claim, so
// that the claim no longer exists.
func (m *Model) Write(rec Record, gone bool) error {
	c := m.Claims[rec.UID]
	if c == nil {
		return fmt.Errorf("write to claim %s (uid %s) the model does not know", rec.Name, rec.UID)
	}
	if c.Gone {
		return fmt.Errorf("write to claim %s (uid %s) that is gone", c.Name, c.UID)
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("claim %s (uid %s): "+format, append([]any{c.Name, c.UID}, args...)...))
	}
	held := toSet(rec.Held)
	released := toSet(rec.Released)
	for _, p := range sortedKeys(held) {
		if c.Held[p] {
			continue
		}
		key := Key{Namespace: c.Name.Namespace, Name: p}
		pod := m.Pods[key]
		switch {
		case c.Terminating:
			bad("I8: pod %s handed to a terminating claim", p)
		case pod == nil:
			bad("I2/I9: pod %s handed out does not exist in namespace %s", p, key.Namespace)
		case pod.Pool != c.Pool:
			bad("I9: pod %s of pool %s handed to a claim of pool %s", p, pod.Pool, c.Pool)
		case !pod.Exists:
			bad("I2: pod %s handed out was deleted", p)
		case !pod.Ready:
			bad("I2: pod %s handed out is not ready", p)
		}
		if other := m.holderOf(key, c.UID); other != "" {
			bad("I1: pod %s handed out is held by claim %s (uid %s)", p, m.Claims[other].Name, other)
		}
		if d := m.Dirty[key]; d != nil {
			bad("I6: pod %s handed out again while dirty (last handed to uid %s, recycled=%t)", p, d.Claim, d.Recycled)
		}
		m.Dirty[key] = &Dirty{Claim: c.UID}
	}
	for _, p := range sortedKeys(c.Held) {
		if held[p] {
			continue
		}
		key := Key{Namespace: c.Name.Namespace, Name: p}
		if !released[p] {
			// A pod that no longer exists may leave a record unreleased
			// (with pod marks, a record entry no live pod backs is not
			// believed): it can never be handed out again.
			if pod := m.Pods[key]; pod == nil || pod.Exists {
				bad("I6: pod %s left the record without being released", p)
			}
			delete(m.Dirty, key)
			continue
		}
		d := m.Dirty[key]
		switch {
		case d == nil || d.Claim != c.UID:
			bad("I6: pod %s released but the model has it handed to %v", p, d)
		case !d.Recycled:
			bad("I6: pod %s recorded released before the recycler finished it", p)
		}
		delete(m.Dirty, key)
	}
	if len(held) > 0 && !rec.Finalizer {
		bad("I8: record holds %v without the allocation finalizer", sortedKeys(held))
	}
	if rec.Finalizer && !c.Finalizer && c.Terminating {
		bad("I8: allocation finalizer added to a terminating claim")
	}
	c.Held, c.Released, c.Finalizer = held, released, rec.Finalizer
	if rec.Terminating {
		c.Terminating = true
	}
	if gone {
		c.Gone = true
	}
	m.settle()
	return errors.Join(errs...)
}

// settle drops dirty pods that are clean: recycled, and their claim gone.
func (m *Model) settle() {
	for key, d := range m.Dirty {
		if c := m.Claims[d.Claim]; d.Recycled && (c == nil || c.Gone) {
			delete(m.Dirty, key)
		}
	}
}

// Reconcile compares the model with the records read from the API server
// for the claims of the given namespaces. Every change of a record must
// have been reported with Write, so a difference means the allocator wrote
// behind the harness's back. A claim that left the API server without
// being forced must not have held pods (I8: the finalizer keeps it while it
// does).
func (m *Model) Reconcile(recs Records, namespaces ...string) error {
	var errs []error
	for _, uid := range slices.Sorted(maps.Keys(m.Claims)) {
		c := m.Claims[uid]
		if c.Gone || !slices.Contains(namespaces, c.Name.Namespace) {
			continue
		}
		r, ok := recs[uid]
		if !ok {
			if len(c.Held) > 0 {
				errs = append(errs, fmt.Errorf("claim %s (uid %s): I8: gone from the API server while its record held %v",
					c.Name, uid, sortedKeys(c.Held)))
			}
			c.Gone = true
			continue
		}
		if r.Terminating {
			c.Terminating = true
		}
		if !maps.Equal(c.Held, toSet(r.Held)) || !maps.Equal(c.Released, toSet(r.Released)) || c.Finalizer != r.Finalizer {
			errs = append(errs, fmt.Errorf("claim %s (uid %s): record on the server (held %v, released %v, finalizer %t) differs from the writes seen (held %v, released %v, finalizer %t)",
				c.Name, uid, r.Held, r.Released, r.Finalizer, sortedKeys(c.Held), sortedKeys(c.Released), c.Finalizer))
		}
	}
	m.settle()
	return errors.Join(errs...)
}

func toSet(s []string) map[string]bool {
	out := make(map[string]bool, len(s))
	for _, v := range s {
		out[v] = true
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
