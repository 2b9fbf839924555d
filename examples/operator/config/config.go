// Package config ships the operator example's CustomResourceDefinitions
// and RBAC as YAML, and loads them for Go code (tests, the embedded demo,
// poolalloc's own test harness), so that what is installed is always what
// kubectl would apply:
//
//	kubectl apply -k examples/operator/config   # namespace, CRDs, ServiceAccount, RBAC
//
// crd/ holds the Pool and Claim CRDs (package ../api/v1 is their Go side).
// rbac/ holds the operator's ServiceAccount, a ClusterRole with the verbs
// it uses on pods, pools, claims and events, a Role for its leader election
// lease in its own namespace, and their bindings; all name Namespace, which
// kustomization.yaml (or RBAC's argument) replaces.
//
//	crds, err := config.CRDs()
//	rbac, err := config.RBAC("my-operator-namespace")
package config

import (
	"bufio"
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The operator's identity in the shipped YAML.
const (
	// Namespace is the namespace of the ServiceAccount and of the leader
	// election Role and RoleBinding.
	Namespace = "poolalloc-system"
	// ServiceAccount is the name of the operator's ServiceAccount.
	ServiceAccount = "poolalloc-operator"
	// ClusterRole is the name of the ClusterRole (and its binding) with
	// everything the operator does outside its own namespace.
	ClusterRole = "poolalloc-operator"
	// LeaderElectionRole is the name of the Role (and its binding) for the
	// leader election lease in Namespace.
	LeaderElectionRole = "poolalloc-operator-leader-election"
)

// files are the shipped manifests; kustomization.yaml and namespace.yaml
// are for kubectl only.
//
//go:embed crd/*.yaml rbac/*.yaml
var files embed.FS

// CRDs returns the CustomResourceDefinitions in crd/, in file name order.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) { return crds(files) }

func crds(fsys fs.FS) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	objs, err := load(fsys, "crd")
	if err != nil {
		return nil, err
	}
	crds := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(objs))
	for _, o := range objs {
		crd, ok := o.obj.(*apiextensionsv1.CustomResourceDefinition)
		if !ok {
			return nil, fmt.Errorf("config: %s: a %T, want a CustomResourceDefinition", o.file, o.obj)
		}
		crds = append(crds, crd)
	}
	return crds, nil
}

// RBAC returns the objects in rbac/ with the operator's namespace set to
// namespace (Namespace when empty): the namespace of the ServiceAccount,
// the Role and the RoleBinding, and of the ServiceAccount subjects of both
// bindings, as kustomize's namespace field sets it. Apply them after
// creating the namespace.
func RBAC(namespace string) ([]client.Object, error) { return rbac(files, namespace) }

func rbac(fsys fs.FS, namespace string) ([]client.Object, error) {
	if namespace == "" {
		namespace = Namespace
	}
	objs, err := load(fsys, "rbac")
	if err != nil {
		return nil, err
	}
	out := make([]client.Object, 0, len(objs))
	for _, o := range objs {
		switch obj := o.obj.(type) {
		case *corev1.ServiceAccount, *rbacv1.Role:
			obj.(client.Object).SetNamespace(namespace)
		case *rbacv1.RoleBinding:
			obj.SetNamespace(namespace)
			setSubjectNamespace(obj.Subjects, namespace)
		case *rbacv1.ClusterRoleBinding:
			setSubjectNamespace(obj.Subjects, namespace)
		case *rbacv1.ClusterRole:
		default:
			return nil, fmt.Errorf("config: %s: a %T, want a ServiceAccount or an RBAC object", o.file, o.obj)
		}
		out = append(out, o.obj.(client.Object))
	}
	return out, nil
}

func setSubjectNamespace(subjects []rbacv1.Subject, namespace string) {
	for i := range subjects {
		if subjects[i].Kind == rbacv1.ServiceAccountKind {
			subjects[i].Namespace = namespace
		}
	}
}

// object is a decoded manifest and the file it came from.
type object struct {
	file string
	obj  runtime.Object
}

// newDecoder decodes the kinds config ships, strictly: an unknown or
// repeated field is an error.
func newDecoder() (runtime.Decoder, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, rbacv1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("config: scheme: %w", err)
		}
	}
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer(), nil
}

// load decodes every document of every file in dir of fsys, in file name
// order.
func load(fsys fs.FS, dir string) ([]object, error) {
	decoder, err := newDecoder()
	if err != nil {
		return nil, err
	}
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var out []object
	for _, e := range entries {
		file := path.Join(dir, e.Name())
		data, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("config: %s: %w", file, err)
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			obj, _, err := decoder.Decode(doc, nil, nil)
			if err != nil {
				return nil, fmt.Errorf("config: %s: %w", file, err)
			}
			out = append(out, object{file: file, obj: obj})
		}
	}
	return out, nil
}

// stripComments drops the lines of doc that are comments only.
func stripComments(doc []byte) []byte {
	var out []byte
	for line := range bytes.Lines(doc) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, line...)
		}
	}
	return out
}
