package testenv

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/poolalloc/poolalloc/algorithm"
)

// Group and version of the test CRDs.
const (
	Group   = "test.poolalloc.io"
	Version = "v1"
)

var (
	// GroupVersion is the group and version of the test CRDs.
	GroupVersion = schema.GroupVersion{Group: Group, Version: Version}
	// ClaimGVK is the kind of the test claim, served as claims.test.poolalloc.io.
	ClaimGVK = GroupVersion.WithKind("Claim")
	// ClaimListGVK is the list kind of ClaimGVK.
	ClaimListGVK = GroupVersion.WithKind("ClaimList")
	// PoolGVK is the kind of the test pool, served as pools.test.poolalloc.io.
	// It has no Go type; use NewPool or unstructured objects.
	PoolGVK = GroupVersion.WithKind("Pool")
)

// Claim is the typed form of the test claim CRD. Its status is free-form
// (x-kubernetes-preserve-unknown-fields), so tests may store anything there;
// DeepCopy copies its nested maps and []any slices.
type Claim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClaimSpec      `json:"spec,omitempty"`
	Status map[string]any `json:"status,omitempty"`
}

// ClaimSpec is what a claim asks for.
type ClaimSpec struct {
	// PoolRef names a pool in the claim's namespace.
	PoolRef string `json:"poolRef,omitempty"`
	// Replicas is how many pods the claim wants.
	Replicas int32 `json:"replicas,omitempty"`
	// Priority orders claims; higher goes first.
	Priority int32 `json:"priority,omitempty"`
	// Selector is the labels a pod must have for the claim (matchLabels).
	Selector map[string]string `json:"selector,omitempty"`
	// Class names the kind of pod the claim needs, for the shortfall.
	Class string `json:"class,omitempty"`
	// Topology is the claim's layout over topology domains.
	Topology *ClaimTopology `json:"topology,omitempty"`
	// Gang makes the claim all or nothing.
	Gang bool `json:"gang,omitempty"`
}

// Placement is the allocator's placement of the spec: Selector as
// matchLabels, Topology.Mode by name ("" is the pool's).
func (spec ClaimSpec) Placement() algorithm.Placement {
	pl := algorithm.Placement{Class: spec.Class, Gang: spec.Gang}
	if len(spec.Selector) > 0 {
		pl.Selector = labels.SelectorFromSet(spec.Selector)
	}
	if t := spec.Topology; t != nil {
		pl.Topology = algorithm.Topology{Key: t.Key, MaxSkew: int(t.MaxSkew), Relax: t.Relax}
		switch t.Mode {
		case "Any":
			pl.Topology.Mode = algorithm.TopologyAny
		case "Spread":
			pl.Topology.Mode = algorithm.TopologySpread
		case "Pack":
			pl.Topology.Mode = algorithm.TopologyPack
		}
	}
	return pl
}

// ClaimTopology is a claim's layout: Mode is "Spread", "Pack", "Any" or
// empty (the pool's).
type ClaimTopology struct {
	Mode    string `json:"mode,omitempty"`
	Key     string `json:"key,omitempty"`
	MaxSkew int32  `json:"maxSkew,omitempty"`
	Relax   bool   `json:"relax,omitempty"`
}

// ClaimList is a list of Claims.
type ClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []Claim `json:"items"`
}

// DeepCopyInto copies c into out.
func (c *Claim) DeepCopyInto(out *Claim) {
	*out = *c
	out.TypeMeta = c.TypeMeta
	c.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec = c.Spec
	if c.Spec.Selector != nil {
		out.Spec.Selector = make(map[string]string, len(c.Spec.Selector))
		for k, v := range c.Spec.Selector {
			out.Spec.Selector[k] = v
		}
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

// AddToScheme registers Claim and ClaimList with s.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Claim{}, &ClaimList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// NewClaim returns a typed claim in namespace ns that wants replicas pods
// of the pool named pool in the same namespace.
func NewClaim(ns, name, pool string, replicas int32) *Claim {
	return &Claim{
		TypeMeta:   metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: ClaimGVK.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       ClaimSpec{PoolRef: pool, Replicas: replicas},
	}
}

// NewUnstructuredClaim is NewClaim as an *unstructured.Unstructured.
func NewUnstructuredClaim(ns, name, pool string, replicas int64) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(ClaimGVK)
	u.SetNamespace(ns)
	u.SetName(name)
	u.Object["spec"] = map[string]any{"poolRef": pool, "replicas": replicas}
	return u
}

// NewPool returns a Pool object (unstructured; Pool has no Go type) that
// wants replicas pods.
func NewPool(ns, name string, replicas int64) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(PoolGVK)
	u.SetNamespace(ns)
	u.SetName(name)
	u.Object["spec"] = map[string]any{"replicas": replicas}
	return u
}

// CRDs returns the test CustomResourceDefinitions, Pool and Claim, that
// Start installs.
func CRDs() []*apiextensionsv1.CustomResourceDefinition {
	integer := apiextensionsv1.JSONSchemaProps{Type: "integer", Format: "int32"}
	nonNegative := integer
	nonNegative.Minimum = ptr(0.0)
	return []*apiextensionsv1.CustomResourceDefinition{
		crd("Pool", "pools", map[string]apiextensionsv1.JSONSchemaProps{
			"replicas": nonNegative,
		}),
		crd("Claim", "claims", map[string]apiextensionsv1.JSONSchemaProps{
			"poolRef":  {Type: "string"},
			"replicas": nonNegative,
			"priority": integer,
			"selector": {Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{
				Allows: true, Schema: &apiextensionsv1.JSONSchemaProps{Type: "string"},
			}},
			"class": {Type: "string"},
			"topology": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"mode":    {Type: "string", Enum: []apiextensionsv1.JSON{{Raw: []byte(`""`)}, {Raw: []byte(`"Any"`)}, {Raw: []byte(`"Spread"`)}, {Raw: []byte(`"Pack"`)}}},
				"key":     {Type: "string"},
				"maxSkew": nonNegative,
				"relax":   {Type: "boolean"},
			}},
			"gang": {Type: "boolean"},
		}, ".spec.poolRef"),
	}
}

// crd returns a CRD of kind with the given spec properties; selectable are
// the JSON paths a field selector may name (spec.poolRef, so that a plain
// client lists a pool's claims as an indexed cache would).
func crd(kind, plural string, spec map[string]apiextensionsv1.JSONSchemaProps, selectable ...string) *apiextensionsv1.CustomResourceDefinition {
	singular := plural[:len(plural)-1]
	var fields []apiextensionsv1.SelectableField
	for _, path := range selectable {
		fields = append(fields, apiextensionsv1.SelectableField{JSONPath: path})
	}
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: Group,
			Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Kind:     kind,
				ListKind: kind + "List",
				Plural:   plural,
				Singular: singular,
			},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name:    Version,
				Served:  true,
				Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{
					OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object",
						Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"apiVersion": {Type: "string"},
							"kind":       {Type: "string"},
							"metadata":   {Type: "object"},
							"spec":       {Type: "object", Properties: spec},
							"status":     {Type: "object", XPreserveUnknownFields: ptr(true)},
						},
					},
				},
				Subresources: &apiextensionsv1.CustomResourceSubresources{
					Status: &apiextensionsv1.CustomResourceSubresourceStatus{},
				},
				SelectableFields: fields,
			}},
		},
	}
}

func ptr[T any](v T) *T { return &v }
