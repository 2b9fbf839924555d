// Package testenv runs a real Kubernetes API server (kube-apiserver and etcd,
// through controller-runtime's envtest) for poolalloc's tests, with test CRDs
// for pools and claims and helpers for pods that no kubelet runs.
//
// The binaries are built from the Go module proxy on first use, from the
// tool modules under tools/ (separate modules, so poolalloc's go.mod never
// requires the Kubernetes or etcd servers), and cached outside the
// repository; see Assets. KUBEBUILDER_ASSETS overrides the cache, and
// binaries setup-envtest installed are used before building
// (examples/operator/envtestbin, which the operator example shares).
//
// Main types and functions:
//
//   - Env, from Start or Main: an admin Client, Config and Scheme;
//     Namespace, UserClient (limited RBAC), RestartAPIServer.
//   - Claim (typed) and NewUnstructuredClaim, NewPool: objects of the test
//     CRDs, group test.poolalloc.io/v1, kinds Claim (spec.poolRef,
//     spec.replicas, spec.priority, placement) and Pool (spec.replicas),
//     both with a free-form status subresource. They are the operator
//     example's API (examples/operator/api/v1, aliased here) and its CRD
//     YAML (examples/operator/config/crd, which CRDs returns).
//   - CreatePods, SetPodReady, ListPods: pods bound to fake nodes, made
//     Ready by writing their status.
//
// A package's tests share one Env:
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }
//
//	func TestSomething(t *testing.T) {
//		ctx := t.Context()
//		ns := env.Namespace(ctx, t)
//		pods, err := testenv.CreatePods(ctx, env.Client, ns, "pool-a", 3, true)
//		...
//		claim := testenv.NewClaim(ns, "c1", "pool-a", 2)
//		err = env.Client.Create(ctx, claim)
//		...
//	}
package testenv
