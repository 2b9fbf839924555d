package allocator

import (
	"reflect"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What the allocator keeps of a claim's object.
//
// Writes of a claim's record are based on the newest version of the claim
// the allocator knows: listed, written, or read live. With the annotation
// syncer, whose records and finalizer live in the claim's metadata, the
// allocator does not keep that object (its spec and status, labels,
// managed fields: most of its size). It keeps what a write and a read of
// the record use, in a claimMeta: the Go type and kind, resourceVersion,
// deletion timestamp, annotations and finalizers; claimInfo has the name,
// namespace, UID and creation timestamp. When it needs the object it makes
// a slim one of the same Go type from them. AnnotationSyncer.Write sends
// the JSON merge patch between the object it is given and a copy with the
// record changed, plus its resourceVersion: the same patch from the slim
// object as from the whole one. With another syncer, which may read any
// field, the object itself is kept.

// claimKind is a claim's Go type and kind, shared by the claims of a pool
// that have the same.
type claimKind struct {
	typ reflect.Type
	// gvk is the object's GroupVersionKind; for *unstructured.Unstructured
	// apiVersion and kind are its fields as they were.
	gvk               schema.GroupVersionKind
	apiVersion, kind  string
	unstructuredClaim bool
}

// claimMeta is what the allocator keeps of a version of a claim: with the
// annotation syncer the fields below obj (see above), with another syncer
// the object itself in obj. It is not changed once made.
type claimMeta struct {
	// obj is the claim's object, kept with another syncer than the
	// annotation syncer; nil with it.
	obj     client.Object
	kind    *claimKind
	rv      string
	deleted *metav1.Time
	// ann are the annotations as key, value pairs, nil when the object
	// has none (nil map).
	ann []string
	// fin are the finalizers.
	fin []string
}

// slimmable reports whether the syncer is the annotation syncer, with
// which the allocator keeps a claimMeta instead of a claim's object.
func (c *config) slimmable() bool { return c.slimKeys != nil }

// setObj makes o the newest version of ci known: o itself, or what a
// claimMeta keeps of it.
func (p *pool) setObj(ci *claimInfo, o client.Object, cfg *config) {
	if o == nil {
		ci.ver = nil
		return
	}
	if !cfg.slimmable() {
		ci.ver = &claimMeta{obj: o}
		return
	}
	m := &claimMeta{kind: p.kindOf(o), rv: o.GetResourceVersion()}
	if d := o.GetDeletionTimestamp(); d != nil {
		t := *d
		m.deleted = &t
	}
	if ann := o.GetAnnotations(); ann != nil {
		m.ann = make([]string, 0, 2*len(ann))
		keys := cfg.slimKeys
		for k, v := range ann {
			// The syncer's keys are kept once, not once per claim.
			switch k {
			case keys.Allocated:
				k = keys.Allocated
			case keys.Release:
				k = keys.Release
			case keys.Released:
				k = keys.Released
			}
			m.ann = append(m.ann, k, v)
		}
	}
	if fin := o.GetFinalizers(); len(fin) == 1 && fin[0] == cfg.slimKeys.Finalizer {
		m.fin = cfg.ourFinalizers
	} else {
		m.fin = slices.Clone(fin)
	}
	ci.ver = m
}

// kindOf returns the claimKind of o, shared with the pool's other claims.
func (p *pool) kindOf(o client.Object) *claimKind {
	k := claimKind{typ: reflect.TypeOf(o), gvk: o.GetObjectKind().GroupVersionKind()}
	if u, ok := o.(*unstructured.Unstructured); ok {
		k.unstructuredClaim = true
		k.apiVersion, k.kind = u.GetAPIVersion(), u.GetKind()
	}
	for _, known := range p.kinds {
		if *known == k {
			return known
		}
	}
	// A copy, so that only a new kind costs an allocation.
	added := k
	p.kinds = append(p.kinds, &added)
	return &added
}

// known reports whether a version of ci is known: false for a claim known
// only from its pods' marks.
func (ci *claimInfo) known() bool { return ci.ver != nil }

// settledVer is claimInfo.ver once a settled claim's version was let go
// (letGo): the version is known, at resourceVersion claimInfo.rv, but not
// kept. A write reads it again (see do).
var settledVer = &claimMeta{}

// letGo forgets what ci keeps of its newest version, which a settled
// claim does not need: most claims of a steady pool are settled, and the
// version is most of what a claim costs to keep.
func (ci *claimInfo) letGo() {
	if ci.ver != nil {
		ci.ver = settledVer
	}
}

// letGone reports whether ci's version is known but was let go.
func (ci *claimInfo) letGone() bool { return ci.ver == settledVer }

// meta returns what ci keeps of its newest version with the annotation
// syncer, nil otherwise.
func (ci *claimInfo) meta() *claimMeta {
	if m := ci.ver; m != nil && m != settledVer && m.obj == nil {
		return m
	}
	return nil
}

// obj returns the newest version of ci itself, kept with another syncer;
// nil otherwise.
func (ci *claimInfo) obj() client.Object {
	if ci.ver == nil {
		return nil
	}
	return ci.ver.obj
}

// objRV is the resourceVersion of the newest version of ci known.
func (ci *claimInfo) objRV() string {
	switch m := ci.ver; {
	case m == nil:
		return ""
	case m == settledVer:
		return ci.rv
	case m.obj != nil:
		return m.obj.GetResourceVersion()
	}
	return ci.ver.rv
}

// objDeleted reports whether the newest version of ci known has a deletion
// timestamp.
func (ci *claimInfo) objDeleted() bool {
	switch m := ci.ver; {
	case m == nil || m == settledVer:
		return false
	case m.obj != nil:
		return m.obj.GetDeletionTimestamp() != nil
	}
	return ci.ver.deleted != nil
}

// object returns the newest version of ci known, nil if none: the object
// itself, or a new slim object made from its claimMeta (see above). It
// only reads ci, and may run concurrently with other readers.
func (ci *claimInfo) object() client.Object {
	m := ci.meta()
	if m == nil {
		return ci.obj()
	}
	var o client.Object
	if m.kind.unstructuredClaim {
		u := &unstructured.Unstructured{Object: map[string]any{}}
		if m.kind.apiVersion != "" {
			u.SetAPIVersion(m.kind.apiVersion)
		}
		if m.kind.kind != "" {
			u.SetKind(m.kind.kind)
		}
		o = u
	} else {
		var ok bool
		if o, ok = reflect.New(m.kind.typ.Elem()).Interface().(client.Object); !ok {
			return nil // not reached: the type was a client.Object's
		}
		if !m.kind.gvk.Empty() {
			o.GetObjectKind().SetGroupVersionKind(m.kind.gvk)
		}
	}
	o.SetNamespace(ci.name().Namespace)
	o.SetName(ci.name().Name)
	o.SetUID(ci.uid())
	o.SetResourceVersion(m.rv)
	o.SetCreationTimestamp(metav1.Time{Time: ci.createdAt()})
	if m.deleted != nil {
		t := *m.deleted
		o.SetDeletionTimestamp(&t)
	}
	if m.ann != nil {
		ann := make(map[string]string, len(m.ann)/2)
		for i := 0; i < len(m.ann); i += 2 {
			ann[m.ann[i]] = m.ann[i+1]
		}
		o.SetAnnotations(ann)
	}
	if m.fin != nil {
		o.SetFinalizers(slices.Clone(m.fin))
	}
	return o
}

// hasFinalizer reports whether the newest version of ci known carries the
// allocation finalizer.
func (r *round) hasFinalizer(ci *claimInfo) bool {
	if m := ci.meta(); m != nil {
		return slices.Contains(m.fin, r.a.cfg.slimKeys.Finalizer)
	}
	if ci.letGone() {
		// Not known: a write reads the claim and finds out.
		return true
	}
	return r.a.cfg.syncer.HasFinalizer(ci.obj())
}
