package testenv

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	v1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
	"github.com/poolalloc/poolalloc/examples/operator/config"
)

// The test CRDs are the operator example's API (examples/operator/api/v1)
// and its shipped YAML (examples/operator/config): the names below are
// that package's, so that poolalloc's tests and the example run on one
// definition.

// Group and version of the test CRDs.
const (
	Group   = v1.Group
	Version = v1.Version
)

var (
	// GroupVersion is the group and version of the test CRDs.
	GroupVersion = v1.GroupVersion
	// ClaimGVK is the kind of the test claim, served as claims.test.poolalloc.io.
	ClaimGVK = v1.ClaimGVK
	// ClaimListGVK is the list kind of ClaimGVK.
	ClaimListGVK = v1.ClaimListGVK
	// PoolGVK is the kind of the test pool, served as pools.test.poolalloc.io.
	// It has no Go type; use NewPool or unstructured objects.
	PoolGVK = v1.PoolGVK
)

// Claim is the typed test claim: v1.Claim.
type Claim = v1.Claim

// ClaimSpec is what a claim asks for: v1.ClaimSpec.
type ClaimSpec = v1.ClaimSpec

// ClaimTopology is a claim's layout: v1.ClaimTopology.
type ClaimTopology = v1.ClaimTopology

// ClaimList is a list of Claims: v1.ClaimList.
type ClaimList = v1.ClaimList

// AddToScheme registers Claim and ClaimList with s.
func AddToScheme(s *runtime.Scheme) error { return v1.AddToScheme(s) }

// NewClaim returns a typed claim in namespace ns that wants replicas pods
// of the pool named pool in the same namespace.
func NewClaim(ns, name, pool string, replicas int32) *Claim {
	return v1.NewClaim(ns, name, pool, replicas)
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
	return v1.NewPool(ns, name, replicas)
}

// CRDs returns the test CustomResourceDefinitions, Pool and Claim, that
// Start installs: the YAML of examples/operator/config/crd.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	return config.CRDs()
}
