package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/poolalloc/poolalloc/algorithm"
)

// Group and version of the API.
const (
	Group   = "test.poolalloc.io"
	Version = "v1"
)

// PoolLabel is the label that puts a pod in a pool: its value is the pool's
// name, in the pod's namespace.
const PoolLabel = "poolalloc.io/test-pool"

var (
	// GroupVersion is the group and version of the API.
	GroupVersion = schema.GroupVersion{Group: Group, Version: Version}
	// ClaimGVK is the kind of a claim, served as claims.test.poolalloc.io.
	ClaimGVK = GroupVersion.WithKind("Claim")
	// ClaimListGVK is the list kind of ClaimGVK.
	ClaimListGVK = GroupVersion.WithKind("ClaimList")
	// PoolGVK is the kind of a pool, served as pools.test.poolalloc.io.
	// It has no Go type; use NewPool or unstructured objects.
	PoolGVK = GroupVersion.WithKind("Pool")
	// PoolListGVK is the list kind of PoolGVK.
	PoolListGVK = GroupVersion.WithKind("PoolList")
)

// Claim asks a pool for pods. Its status is free-form
// (x-kubernetes-preserve-unknown-fields): the allocator keeps its record in
// annotations, and DeepCopy copies whatever nested maps and []any slices
// are stored there.
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

// AddToScheme registers Claim and ClaimList with s.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Claim{}, &ClaimList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// NewClaim returns a claim in namespace ns that wants replicas pods of the
// pool named pool in the same namespace.
func NewClaim(ns, name, pool string, replicas int32) *Claim {
	return &Claim{
		TypeMeta:   metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: ClaimGVK.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       ClaimSpec{PoolRef: pool, Replicas: replicas},
	}
}

// NewPool returns a Pool (unstructured: Pool has no Go type) that keeps at
// least replicas pods.
func NewPool(ns, name string, replicas int64) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(PoolGVK)
	u.SetNamespace(ns)
	u.SetName(name)
	u.Object["spec"] = map[string]any{"replicas": replicas}
	return u
}
