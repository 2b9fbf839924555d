package allocator

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/poolalloc/poolalloc/store"
)

// MarkHook says what a pod carries, besides its mark, while it is marked
// for a claim (WithMarkHook): labels to route to it, annotations, owner
// references. It is a function of the pod and the claim alone, called
// again for the same pod and claim when the mark goes, and must give the
// same change each time. It must be safe for concurrent use (rounds on
// different pools run at once) and quick: it is called while the round
// decides, once per pod marked or unmarked. A panic in it is an
// ErrPodChange for that pod.
type MarkHook func(pod MarkedPod) PodChange

// MarkedPod is what a MarkHook is told: a pod of a pool and the claim it
// is marked for.
type MarkedPod struct {
	Pool types.NamespacedName
	// Pod is the pod's name; it is in Pool's namespace.
	Pod string
	// Claim is the claim the pod is marked for. At release the claim may
	// be gone.
	Claim store.Holder
}

// PodChange is what a pod carries while it is marked for a claim, besides
// its mark. The allocator writes it in the patch that marks the pod, and
// takes it off in the patch that removes the mark.
type PodChange struct {
	// Labels are set on the pod when it is marked: keys the pod does not
	// carry (as the round's input shows it), valid label keys and values.
	// When the mark goes, each is removed if the pod still carries it
	// with that value.
	Labels map[string]string
	// Annotations are set when the pod is marked and removed, by key,
	// when the mark goes. They must be valid annotation keys other than
	// the pod mark key and its recycling stamp.
	Annotations map[string]string
	// Owners are added to the pod's owner references when it is marked
	// (merged by UID, so the pod keeps the ones it has) and removed, by
	// UID, when the mark goes. Each needs an APIVersion, Kind, Name and
	// UID, and none may be a controller: a pod has at most one, and a
	// pool's pods usually have theirs.
	Owners []metav1.OwnerReference
}

// WithMarkHook lets the caller change a pod in the same patch that marks
// it, so that an operator that labels or owns the pods it hands out pays
// one pod write per hand-out, not two: the pod is marked for its claim and
// carries hook's change (labels, annotations, owner references) in one
// request guarded by its resourceVersion; when its mark is removed (after
// its release is recorded, or when a hand-out failed) the same patch takes
// the change off again. hook is called at hand-out and again at release,
// with the pod and the claim its mark names.
//
// A change the allocator cannot write safely is refused before anything is
// sent, with an error matching ErrPodChange that names the pod and the
// reason: a label the pod carries already (its pool's label, a label a
// claim selects on: the hook adds labels, it never changes one), a label
// that would make the pod fall out of its claim's selector, the pod mark
// or its recycling stamp as an annotation, an invalid key or value, an
// incomplete or controller owner reference, or a panic. A pod whose
// change is refused at hand-out is not marked and not handed out in that
// round (a gang gets none of its pods); at release its mark stays, and
// the unmark is tried again next round, so that a pod never goes back to
// the pool carrying a claim's labels. Nothing else is lost.
//
// Pods marked before the hook was set carry no change until they are
// handed out again; their unmark removes only what they carry. Pods marked
// for a held claim at recovery (WithPodMarkMigration) get the change with
// their mark. It needs pod marks: with WithPodMarks(false) New refuses it.
// hook must not be nil.
func WithMarkHook(hook MarkHook) Option {
	return optionFunc(func(c *config) { c.markHook = hook; c.checkNil("WithMarkHook", hook) })
}

// podEdit is what a patch of a pod carries besides its mark: the hook's
// change as merge patch values (a string sets a key, nil removes it) and,
// for owner references, strategic merge patch entries, merged by UID.
type podEdit struct {
	labels      map[string]any
	annotations map[string]any
	owners      []any
}

// hookEdit returns the hook's change for pi, marked (marking) or unmarked
// for the claim h, as the patch's edit; nil without a hook. At hand-out
// sel is the claim's selector, which the pod must still match.
func (r *round) hookEdit(pi *podInfo, h store.Holder, sel labels.Selector, marking bool) (*podEdit, error) {
	hook := r.a.cfg.markHook
	if hook == nil {
		return nil, nil
	}
	ch, err := callHook(hook, MarkedPod{Pool: r.p.name, Pod: pi.name(), Claim: h})
	if err == nil {
		err = r.checkChange(ch, pi.labels(), sel, marking)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: pod %s marked for claim %s: %w", ErrPodChange, pi.name(), h.Claim, err)
	}
	e := &podEdit{}
	have := pi.labels()
	for k, v := range ch.Labels {
		switch {
		case marking:
			setAny(&e.labels, k, v)
		case have.Has(k) && have.Get(k) == v:
			setAny(&e.labels, k, nil)
		}
	}
	for k, v := range ch.Annotations {
		if marking {
			setAny(&e.annotations, k, v)
		} else {
			setAny(&e.annotations, k, nil)
		}
	}
	for _, o := range ch.Owners {
		ref := map[string]any{"uid": string(o.UID)}
		if marking {
			ref = map[string]any{"apiVersion": o.APIVersion, "kind": o.Kind, "name": o.Name, "uid": string(o.UID)}
			if o.BlockOwnerDeletion != nil {
				ref["blockOwnerDeletion"] = *o.BlockOwnerDeletion
			}
		} else {
			ref["$patch"] = "delete"
		}
		e.owners = append(e.owners, ref)
	}
	return e, nil
}

func setAny(m *map[string]any, k string, v any) {
	if *m == nil {
		*m = make(map[string]any)
	}
	(*m)[k] = v
}

// callHook calls hook; a panic in it is an error.
func callHook(hook MarkHook, pod MarkedPod) (ch PodChange, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("the mark hook panicked: %v", v)
		}
	}()
	return hook(pod), nil
}

// checkChange reports what is wrong with ch for a pod carrying have,
// marked for a claim whose selector is sel (marking), or unmarked.
func (r *round) checkChange(ch PodChange, have labels.Labels, sel labels.Selector, marking bool) error {
	var errs []string
	for _, k := range slices.Sorted(maps.Keys(ch.Labels)) {
		v := ch.Labels[k]
		for _, e := range validation.IsQualifiedName(k) {
			errs = append(errs, fmt.Sprintf("label key %q: %s", k, e))
		}
		for _, e := range validation.IsValidLabelValue(v) {
			errs = append(errs, fmt.Sprintf("label %s value %q: %s", k, v, e))
		}
		if marking && have.Has(k) {
			errs = append(errs, fmt.Sprintf("label %s: the pod carries it already (%s=%s); the hook may add labels, not change them", k, k, have.Get(k)))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(ch.Annotations)) {
		for _, e := range validation.IsQualifiedName(k) {
			errs = append(errs, fmt.Sprintf("annotation key %q: %s", k, e))
		}
		if k == r.a.cfg.markKey || k == r.a.cfg.stampKey {
			errs = append(errs, fmt.Sprintf("annotation %s is the allocator's own", k))
		}
	}
	seen := make(map[types.UID]bool, len(ch.Owners))
	for i, o := range ch.Owners {
		switch {
		case o.APIVersion == "" || o.Kind == "" || o.Name == "" || o.UID == "":
			errs = append(errs, fmt.Sprintf("owner reference %d: apiVersion, kind, name and uid are all needed", i))
		case o.Controller != nil && *o.Controller:
			errs = append(errs, fmt.Sprintf("owner reference %d (%s %s): a controller reference is refused", i, o.Kind, o.Name))
		case seen[o.UID]:
			errs = append(errs, fmt.Sprintf("owner reference %d: uid %s twice", i, o.UID))
		}
		seen[o.UID] = true
	}
	if marking && len(errs) == 0 && sel != nil && !sel.Empty() && len(ch.Labels) > 0 {
		after := labels.Merge(labels.Set(ch.Labels), labelSet(have))
		if !sel.Matches(after) {
			errs = append(errs, fmt.Sprintf("with labels %v the pod no longer matches its claim's selector %s", labels.Set(ch.Labels), sel))
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// labelSet copies l into a labels.Set.
func labelSet(l labels.Labels) labels.Set {
	if s, ok := l.(labels.Set); ok {
		return s
	}
	if p, ok := l.(podLabels); ok {
		return labels.Set(p)
	}
	return nil
}
