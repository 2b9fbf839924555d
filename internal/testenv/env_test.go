package testenv_test

import (
	"bytes"
	"os"
	"os/exec"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/poolalloc/poolalloc/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

const finalizer = "test.poolalloc.io/hold"

func TestMergePatchAddsAnnotationAndFinalizer(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(ctx, t)
	claim := testenv.NewClaim(ns, "c", "pool", 2)
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	orig := claim.DeepCopy()
	claim.Annotations = map[string]string{"test.poolalloc.io/note": `{"pods":["a"]}`}
	controllerutil.AddFinalizer(claim, finalizer)
	if err := env.Client.Patch(ctx, claim, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	var got testenv.Claim
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
		t.Fatal(err)
	}
	if got.Annotations["test.poolalloc.io/note"] != `{"pods":["a"]}` || !controllerutil.ContainsFinalizer(&got, finalizer) {
		t.Fatalf("after patch: annotations %v, finalizers %v", got.Annotations, got.Finalizers)
	}
	if !reflect.DeepEqual(got.Spec, orig.Spec) {
		t.Fatalf("patch changed spec: %+v, want %+v", got.Spec, orig.Spec)
	}
}

func TestStaleUpdateConflicts(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(ctx, t)
	claim := testenv.NewClaim(ns, "c", "pool", 1)
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	stale := claim.DeepCopy()
	claim.Spec.Replicas = 2
	if err := env.Client.Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	stale.Spec.Replicas = 3
	err := env.Client.Update(ctx, stale)
	if !apierrors.IsConflict(err) {
		t.Fatalf("update with stale resourceVersion: got %v, want a Conflict", err)
	}
	// An optimistic-lock merge patch from the stale copy conflicts too.
	err = env.Client.Patch(ctx, stale, client.MergeFromWithOptions(stale.DeepCopy(), client.MergeFromWithOptimisticLock{}))
	if !apierrors.IsConflict(err) {
		t.Fatalf("optimistic patch from stale copy: got %v, want a Conflict", err)
	}
}

func TestFinalizerHoldsDeletion(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(ctx, t)
	claim := testenv.NewClaim(ns, "c", "pool", 1)
	claim.Finalizers = []string{finalizer}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	var got testenv.Claim
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
		t.Fatalf("get after delete: %v (a finalizer should keep the object)", err)
	}
	if got.DeletionTimestamp == nil {
		t.Fatal("deletionTimestamp not set after delete")
	}
	orig := got.DeepCopy()
	controllerutil.RemoveFinalizer(&got, finalizer)
	if err := env.Client.Patch(ctx, &got, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), &got)
	if !apierrors.IsNotFound(err) {
		t.Fatalf("get after removing the last finalizer: got %v, want NotFound", err)
	}
}

func TestPods(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(ctx, t)
	pending, err := testenv.CreatePods(ctx, env.Client, ns, "p", 3, false)
	if err != nil {
		t.Fatal(err)
	}
	ready, err := testenv.CreatePods(ctx, env.Client, ns, "q", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range pending {
		if p.Name != "p-"+string(rune('0'+i)) || p.Spec.NodeName != "node-"+string(rune('0'+i%3)) || testenv.IsPodReady(&p) {
			t.Fatalf("pending pod %d: name %s node %s ready %t", i, p.Name, p.Spec.NodeName, testenv.IsPodReady(&p))
		}
	}
	for _, p := range ready {
		if !testenv.IsPodReady(&p) || p.Status.Phase != corev1.PodRunning {
			t.Fatalf("pod %s: phase %s, ready %t; want Running and Ready", p.Name, p.Status.Phase, testenv.IsPodReady(&p))
		}
	}

	pod := &pending[1]
	if err := testenv.SetPodReady(ctx, env.Client, pod, true); err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &got); err != nil {
		t.Fatal(err)
	}
	if !testenv.IsPodReady(&got) || got.Status.Phase != corev1.PodRunning {
		t.Fatalf("after SetPodReady(true): phase %s, ready %t", got.Status.Phase, testenv.IsPodReady(&got))
	}
	if err := testenv.SetPodReady(ctx, env.Client, &got, false); err != nil {
		t.Fatal(err)
	}
	if testenv.IsPodReady(&got) {
		t.Fatal("still Ready after SetPodReady(false)")
	}

	listed, err := testenv.ListPods(ctx, env.Client, ns, "p")
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 3 {
		t.Fatalf("ListPods(p) returned %d pods, want 3", len(listed))
	}
	for _, p := range listed {
		if p.Labels[testenv.PoolLabel] != "p" {
			t.Fatalf("ListPods(p) returned %s with labels %v", p.Name, p.Labels)
		}
	}
}

func TestUserClientRBAC(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(ctx, t)
	if _, err := testenv.CreatePods(ctx, env.Client, ns, "p", 1, true); err != nil {
		t.Fatal(err)
	}
	user, err := env.UserClient(ctx, "claim-editor", []rbacv1.PolicyRule{{
		APIGroups: []string{testenv.Group},
		Resources: []string{"claims"},
		Verbs:     []string{"get", "list", "watch", "create", "update", "patch"},
	}}, ns)
	if err != nil {
		t.Fatal(err)
	}

	var pods corev1.PodList
	if err := user.List(ctx, &pods, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
		t.Fatalf("user lists pods: got %v, want Forbidden", err)
	}
	pod := &corev1.Pod{}
	pod.Namespace, pod.Name = ns, "p-0"
	if err := user.Delete(ctx, pod); !apierrors.IsForbidden(err) {
		t.Fatalf("user deletes a pod: got %v, want Forbidden", err)
	}

	claim := testenv.NewClaim(ns, "c", "p", 1)
	if err := user.Create(ctx, claim); err != nil {
		t.Fatalf("user creates a claim: %v", err)
	}
	orig := claim.DeepCopy()
	claim.Annotations = map[string]string{"edited": "yes"}
	if err := user.Patch(ctx, claim, client.MergeFrom(orig)); err != nil {
		t.Fatalf("user patches a claim: %v", err)
	}
	other := testenv.NewClaim(env.Namespace(ctx, t), "c", "p", 1)
	if err := user.Create(ctx, other); !apierrors.IsForbidden(err) {
		t.Fatalf("user creates a claim in another namespace: got %v, want Forbidden", err)
	}
}

func TestDataSurvivesAPIServerRestart(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(ctx, t)
	claim := testenv.NewClaim(ns, "c", "pool", 4)
	claim.Annotations = map[string]string{"k": "v"}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	user, err := env.UserClient(ctx, "restart-reader", []rbacv1.PolicyRule{{
		APIGroups: []string{testenv.Group}, Resources: []string{"claims"}, Verbs: []string{"get"},
	}}, ns)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if err := env.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server restarted in %s", time.Since(start).Round(time.Millisecond))

	var got testenv.Claim
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
		t.Fatalf("admin client after restart: %v", err)
	}
	if got.Spec.Replicas != 4 || got.Annotations["k"] != "v" || got.UID != claim.UID {
		t.Fatalf("after restart: %+v, want the claim written before", got)
	}
	if err := user.Get(ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
		t.Fatalf("user client after restart: %v", err)
	}
	got.Spec.Replicas = 5
	if err := env.Client.Update(ctx, &got); err != nil {
		t.Fatalf("write after restart: %v", err)
	}
}

func TestClaimRoundTrip(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(ctx, t)

	typed := testenv.NewClaim(ns, "typed", "pool", 3)
	typed.Spec.Priority = 7
	if err := env.Client.Create(ctx, typed); err != nil {
		t.Fatal(err)
	}
	typed.Status = map[string]any{"phase": "Bound", "pods": []any{"a", "b"}}
	if err := env.Client.Status().Update(ctx, typed); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(testenv.ClaimGVK)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(typed), u); err != nil {
		t.Fatal(err)
	}
	pool, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef")
	replicas, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
	priority, _, _ := unstructured.NestedInt64(u.Object, "spec", "priority")
	phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
	if pool != "pool" || replicas != 3 || priority != 7 || phase != "Bound" {
		t.Fatalf("typed claim read as unstructured: %v", u.Object)
	}

	uc := testenv.NewUnstructuredClaim(ns, "unstructured", "pool", 2)
	if err := env.Client.Create(ctx, uc); err != nil {
		t.Fatal(err)
	}
	var back testenv.Claim
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(uc), &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Spec, testenv.ClaimSpec{PoolRef: "pool", Replicas: 2}) || back.UID != uc.GetUID() {
		t.Fatalf("unstructured claim read as typed: %+v", back)
	}

	pool2 := testenv.NewPool(ns, "pool", 3)
	if err := env.Client.Create(ctx, pool2); err != nil {
		t.Fatal(err)
	}

	// The schema rejects a negative replica count.
	bad := testenv.NewClaim(ns, "bad", "pool", -1)
	if err := env.Client.Create(ctx, bad); !apierrors.IsInvalid(err) {
		t.Fatalf("claim with replicas -1: got %v, want Invalid", err)
	}
}

func TestAssetsUsesKubebuilderAssets(t *testing.T) {
	t.Setenv(testenv.EnvAssets, "/somewhere")
	var progress bytes.Buffer
	dir, err := testenv.Assets(t.Context(), &progress)
	if err != nil || dir != "/somewhere" || progress.Len() != 0 {
		t.Fatalf("Assets with %s set: %q, %v, progress %q", testenv.EnvAssets, dir, err, progress.String())
	}
}

// mainChild is set in the environment of the test binary that
// TestMainStartsNoControlPlaneForBenchmarksAlone runs.
const mainChild = "POOLALLOC_TESTENV_MAIN_CHILD"

// BenchmarkMainEnv fails, in that child, if Main started a control plane.
func BenchmarkMainEnv(b *testing.B) {
	if os.Getenv(mainChild) != "" && env != nil {
		b.Fatal("Main started a control plane for benchmarks alone")
	}
	for b.Loop() {
	}
}

// With -test.run '^$' (benchmarks alone), Main starts no control plane
// and runs the benchmarks.
func TestMainStartsNoControlPlaneForBenchmarksAlone(t *testing.T) {
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run", "^$", "-test.bench", "^BenchmarkMainEnv$", "-test.benchtime", "1x")
	cmd.Env = append(os.Environ(), mainChild+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, want := range []string{"the control plane is not started", "BenchmarkMainEnv", "PASS"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if bytes.Contains(out, []byte("control plane up")) {
		t.Errorf("a control plane was started:\n%s", out)
	}
}
