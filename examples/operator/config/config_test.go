package config

import (
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	v1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
)

// The CRDs serve the Go API's kinds, in its group and version.
func TestCRDsServeTheAPI(t *testing.T) {
	crds, err := CRDs()
	require.NoError(t, err)
	kinds := map[string]string{}
	for _, crd := range crds {
		require.Equal(t, v1.Group, crd.Spec.Group, crd.Name)
		require.Len(t, crd.Spec.Versions, 1, crd.Name)
		ver := crd.Spec.Versions[0]
		require.True(t, ver.Name == v1.Version && ver.Served && ver.Storage, crd.Name)
		require.NotNil(t, ver.Subresources.Status, "%s: status subresource", crd.Name)
		require.Equal(t, crd.Spec.Names.Plural+"."+v1.Group, crd.Name)
		kinds[crd.Spec.Names.Kind] = crd.Spec.Names.ListKind
	}
	require.Equal(t, map[string]string{
		v1.PoolGVK.Kind:  v1.PoolListGVK.Kind,
		v1.ClaimGVK.Kind: v1.ClaimListGVK.Kind,
	}, kinds)
}

// RBAC moves the operator to another namespace as kustomize would, and
// grants nothing through a wildcard.
func TestRBAC(t *testing.T) {
	objs, err := RBAC("elsewhere")
	require.NoError(t, err)
	kinds := map[string]int{}
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			require.Equal(t, ServiceAccount, o.Name)
			require.Equal(t, "elsewhere", o.Namespace)
		case *rbacv1.ClusterRole:
			require.Equal(t, ClusterRole, o.Name)
			noWildcards(t, o.Name, o.Rules)
		case *rbacv1.Role:
			require.Equal(t, LeaderElectionRole, o.Name)
			require.Equal(t, "elsewhere", o.Namespace)
			noWildcards(t, o.Name, o.Rules)
		case *rbacv1.ClusterRoleBinding:
			require.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ClusterRole}, o.RoleRef)
			require.Equal(t, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ServiceAccount, Namespace: "elsewhere"}}, o.Subjects)
		case *rbacv1.RoleBinding:
			require.Equal(t, "elsewhere", o.Namespace)
			require.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: LeaderElectionRole}, o.RoleRef)
			require.Equal(t, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ServiceAccount, Namespace: "elsewhere"}}, o.Subjects)
		}
		kinds[typeName(o)]++
	}
	require.Equal(t, map[string]int{"ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Role": 1, "RoleBinding": 1}, kinds)

	// Without a namespace, the one the YAML names.
	objs, err = RBAC("")
	require.NoError(t, err)
	for _, o := range objs {
		if _, ok := o.(*rbacv1.ClusterRole); !ok {
			if _, ok := o.(*rbacv1.ClusterRoleBinding); !ok {
				require.Equal(t, Namespace, o.GetNamespace(), "%T %s", o, o.GetName())
			}
		}
	}
}

func noWildcards(t *testing.T, role string, rules []rbacv1.PolicyRule) {
	t.Helper()
	require.NotEmpty(t, rules, role)
	for _, r := range rules {
		for _, list := range [][]string{r.Verbs, r.APIGroups, r.Resources, r.ResourceNames, r.NonResourceURLs} {
			for _, s := range list {
				require.NotContains(t, s, "*", "%s: rule %+v", role, r)
			}
		}
	}
}

func typeName(o any) string {
	switch o.(type) {
	case *corev1.ServiceAccount:
		return "ServiceAccount"
	case *rbacv1.ClusterRole:
		return "ClusterRole"
	case *rbacv1.ClusterRoleBinding:
		return "ClusterRoleBinding"
	case *rbacv1.Role:
		return "Role"
	case *rbacv1.RoleBinding:
		return "RoleBinding"
	}
	return "other"
}

// kustomization.yaml applies every shipped manifest, in the namespace the
// manifests and RBAC("") name.
func TestKustomizationListsEveryManifest(t *testing.T) {
	data, err := os.ReadFile("kustomization.yaml")
	require.NoError(t, err)
	var k struct {
		Namespace string   `json:"namespace"`
		Resources []string `json:"resources"`
	}
	require.NoError(t, utilyaml.Unmarshal(data, &k))
	require.Equal(t, Namespace, k.Namespace)
	want := []string{"namespace.yaml"}
	for _, dir := range []string{"crd", "rbac"} {
		entries, err := files.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			want = append(want, path.Join(dir, e.Name()))
		}
	}
	require.ElementsMatch(t, want, k.Resources)
	require.False(t, slices.ContainsFunc(k.Resources, func(r string) bool { return strings.Contains(r, "..") }))
}

// A manifest that does not decode, or is of a kind out of place, is an
// error naming the file and the reason.
func TestBadManifests(t *testing.T) {
	fsys := fstest.MapFS{
		"crd/typo.yaml": {Data: []byte("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: x\nspec:\n  grop: test\n")},
	}
	_, err := load(fsys, "crd")
	require.ErrorContains(t, err, "crd/typo.yaml")
	require.ErrorContains(t, err, `unknown field "spec.grop"`)

	fsys = fstest.MapFS{"rbac/kind.yaml": {Data: []byte("apiVersion: v1\nkind: Nonsense\n")}}
	_, err = rbac(fsys, "")
	require.ErrorContains(t, err, "rbac/kind.yaml")
	require.ErrorContains(t, err, "Nonsense")

	sa := []byte("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n")
	_, err = crds(fstest.MapFS{"crd/sa.yaml": {Data: sa}})
	require.ErrorContains(t, err, "crd/sa.yaml: a *v1.ServiceAccount, want a CustomResourceDefinition")
	_, err = rbac(fstest.MapFS{"rbac/pod.yaml": {Data: []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n")}}, "")
	require.ErrorContains(t, err, "rbac/pod.yaml: a *v1.Pod, want a ServiceAccount or an RBAC object")

	// Two documents in one file, and a comment-only document: both
	// objects, nothing for the comment.
	fsys = fstest.MapFS{"rbac/two.yaml": {Data: []byte("# only a comment\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: b\n")}}
	objs, err := load(fsys, "rbac")
	require.NoError(t, err)
	require.Len(t, objs, 2)
	require.Equal(t, "b", objs[1].obj.(*corev1.ServiceAccount).Name)
}
