package allocator_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/sandboxv1"
	"github.com/poolalloc/poolalloc/internal/testenv"
)

// The README's reconciler, verbatim between the markers below:
// TestReadmeReconcilerIsThisOne keeps the two the same, and
// TestReadmeReconcilerCreatesWhatIsMissing runs it on the real API server.

// README reconciler begins.
type PoolReconciler struct {
	client.Client
	Alloc allocator.Allocator
}

func (r *PoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(req.Namespace), client.MatchingLabels{"example.com/pool": req.Name}); err != nil {
		return ctrl.Result{}, err
	}
	var claims sandboxv1.SandboxClaimList // needs a field index on spec.poolRef
	if err := r.List(ctx, &claims, client.InNamespace(req.Namespace), client.MatchingFields{"spec.poolRef": req.Name}); err != nil {
		return ctrl.Result{}, err
	}
	in := allocator.Input{Pool: req.NamespacedName, Pods: pods.Items}
	for i := range claims.Items {
		c := &claims.Items[i]
		in.Claims = append(in.Claims, allocator.Claim{Object: c, Want: int(c.Spec.Replicas), Priority: c.Spec.Priority})
	}
	res, err := r.Alloc.Round(ctx, in) // res is valid even when err is not nil
	// Pods not ready yet that no claim holds may still serve the shortfall.
	for range res.Shortfall - res.Starting {
		if err := r.Create(ctx, newPoolPod(req.NamespacedName)); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, err // an error requeues the pool with backoff
}

// README reconciler ends.

// newPoolPod stands for the pool's pod template.
func newPoolPod(pool types.NamespacedName) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    pool.Namespace,
			GenerateName: pool.Name + "-",
			Labels:       map[string]string{"example.com/pool": pool.Name},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "example.com/sandbox:1"}}},
	}
}

// Example_reconciler makes the README's reconciler. It is compiled, not
// run: mgr stands for your controller-runtime manager.
func Example_reconciler() {
	var mgr interface {
		GetClient() client.Client
		GetAPIReader() client.Reader
	}
	alloc, err := allocator.New(mgr.GetClient(),
		allocator.WithAPIReader(mgr.GetAPIReader()), // live reads to settle conflicts
		allocator.WithRecycler(allocator.RecycleDelete(mgr.GetClient())))
	if err != nil {
		return
	}
	var r ctrl.Reconciler = &PoolReconciler{Client: mgr.GetClient(), Alloc: alloc}
	_ = r // register it: ctrl.NewControllerManagedBy(mgr).For(&Pool{}).Watches(...).Complete(r)
}

// reconcilerSource returns the text between the README reconciler markers
// of this file.
func reconcilerSource(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile("example_reconciler_test.go")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(src), "// README reconciler begins.\n")
	require.True(t, ok)
	body, _, ok := strings.Cut(rest, "\n// README reconciler ends.")
	require.True(t, ok)
	return strings.TrimSpace(body)
}

func TestReadmeReconcilerIsThisOne(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	want := reconcilerSource(t)
	require.Contains(t, string(readme), "```go\n"+want+"\n```",
		"the README's reconciler differs from the one in example_reconciler_test.go, which is compiled and tested: change both")
}

// TestReadmeReconcilerCreatesWhatIsMissing runs the README's reconciler on
// the real API server (no kubelet: the test makes pods Ready). A claim
// waiting while a held pod is unready gets a new pod created and is served;
// pods created but not ready yet are not created again.
func TestReadmeReconcilerCreatesWhatIsMissing(t *testing.T) {
	f := newFixture(t)
	pool := types.NamespacedName{Namespace: f.ns, Name: "p"}
	r := &PoolReconciler{Client: f.c, Alloc: f.alloc()}
	reconcile := func() {
		t.Helper()
		_, err := r.Reconcile(f.ctx, ctrl.Request{NamespacedName: pool})
		require.NoError(t, err)
		require.NoError(t, allocator.CheckInvariants(r.Alloc))
	}
	pods := func() []corev1.Pod {
		t.Helper()
		var l corev1.PodList
		require.NoError(t, f.c.List(f.ctx, &l, client.InNamespace(f.ns), client.MatchingLabels{"example.com/pool": "p"}))
		return l.Items
	}
	setReady := func(pod *corev1.Pod, ready bool) {
		t.Helper()
		require.NoError(t, f.c.Get(f.ctx, client.ObjectKeyFromObject(pod), pod))
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
		require.NoError(t, f.c.Status().Update(f.ctx, pod))
	}

	// c wants one pod: one is created, and created only once while it
	// starts.
	f.claim("c", "p", 1)
	reconcile()
	reconcile()
	created := pods()
	require.Equal(t, 1, len(created))
	setReady(&created[0], true)
	reconcile()
	require.Equal(t, []string{created[0].Name}, f.held("c"))

	// c's pod goes unready: it is c's (lost), not starting. w waits: a pod
	// is created for it.
	setReady(&created[0], false)
	f.claim("w", "p", 1)
	reconcile()
	all := pods()
	require.Equal(t, 2, len(all), "a pod for w, although the pool has an unready pod")
	reconcile()
	require.Equal(t, 2, len(pods()), "the new pod is starting: not created again")
	for i := range all {
		if all[i].Name != created[0].Name {
			setReady(&all[i], true)
			reconcile()
			require.Equal(t, []string{all[i].Name}, f.held("w"))
		}
	}
	require.Equal(t, []string{created[0].Name}, f.held("c"), "c keeps its pod")
}

// TestStartingCountsOnlyPodsOnTheirWay checks what Result.Starting counts:
// unready pods no claim holds, not those held, terminating or finished.
func TestStartingCountsOnlyPodsOnTheirWay(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, nil)
	pool := types.NamespacedName{Namespace: "ns", Name: "p"}
	pod := func(name string, ready bool, edit func(*corev1.Pod)) corev1.Pod {
		p := readyPod("ns", name)
		if !ready {
			p.Status.Conditions[0].Status = corev1.ConditionFalse
		}
		if edit != nil {
			edit(&p)
		}
		return p
	}
	now := metav1.Now()
	in := allocator.Input{Pool: pool, Pods: []corev1.Pod{
		pod("ready", true, nil),
		pod("starting", false, nil),
		pod("terminating", false, func(p *corev1.Pod) { p.DeletionTimestamp = &now }),
		pod("failed", false, func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
		pod("done", false, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
	}}
	a, err := allocator.New(c, allocator.WithPodMarks(false))
	require.NoError(t, err)
	res, err := a.Round(ctx, in)
	require.NoError(t, err)
	require.Equal(t, 1, res.IdleCount)
	require.Equal(t, 1, res.Starting)

	// A claim takes the ready pod; the starting one becomes ready and is
	// taken too, then goes unready while held: it is lost, not starting.
	cl := testenv.NewClaim("ns", "c", "p", 2)
	cl.UID = "uid-c" // the fake client assigns none
	require.NoError(t, c.Create(ctx, cl))
	in.Claims = []allocator.Claim{{Object: cl, Want: 2}}
	res, err = a.Round(ctx, in)
	require.NoError(t, err)
	require.Equal(t, 1, res.Shortfall)
	require.Equal(t, 1, res.Starting)
	in.Pods[1] = pod("starting", true, func(p *corev1.Pod) { p.ResourceVersion = "2" })
	res, err = a.Round(ctx, in)
	require.NoError(t, err)
	require.Zero(t, res.Shortfall)
	require.Zero(t, res.Starting)
	in.Pods[1] = pod("starting", false, func(p *corev1.Pod) { p.ResourceVersion = "3" })
	res, err = a.Round(ctx, in)
	require.NoError(t, err)
	require.Zero(t, res.Starting, "a held pod that went unready is its claim's")
	require.Len(t, res.Lost, 1)
	require.NoError(t, allocator.CheckInvariants(a))
}
