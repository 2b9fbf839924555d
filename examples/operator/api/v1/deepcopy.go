package v1

import (
	"maps"

	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyInto copies c into out.
func (c *Claim) DeepCopyInto(out *Claim) {
	*out = *c
	out.TypeMeta = c.TypeMeta
	c.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec = c.Spec
	if c.Spec.Selector != nil {
		out.Spec.Selector = maps.Clone(c.Spec.Selector)
	}
	if c.Spec.Topology != nil {
		t := *c.Spec.Topology
		out.Spec.Topology = &t
	}
	if c.Status != nil {
		out.Status = deepCopyValue(c.Status).(map[string]any)
	}
}

// deepCopyValue copies maps and slices of a JSON-like value; anything else
// is copied by value.
func deepCopyValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = deepCopyValue(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = deepCopyValue(e)
		}
		return out
	default:
		return v
	}
}

// DeepCopy returns a copy of c.
func (c *Claim) DeepCopy() *Claim {
	if c == nil {
		return nil
	}
	out := new(Claim)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (c *Claim) DeepCopyObject() runtime.Object {
	if c == nil {
		return nil
	}
	return c.DeepCopy()
}

// DeepCopyInto copies l into out.
func (l *ClaimList) DeepCopyInto(out *ClaimList) {
	*out = *l
	out.TypeMeta = l.TypeMeta
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]Claim, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a copy of l.
func (l *ClaimList) DeepCopy() *ClaimList {
	if l == nil {
		return nil
	}
	out := new(ClaimList)
	l.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (l *ClaimList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	return l.DeepCopy()
}
