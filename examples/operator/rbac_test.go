package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"

	"github.com/poolalloc/poolalloc/allocator"
	poolv1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
	opconfig "github.com/poolalloc/poolalloc/examples/operator/config"
)

// TestLeastPrivilegeRBAC applies config/rbac on the real API server (with
// owner reference permissions enforced, see startEmbedded) and runs the
// operator, NewManager and Setup with leader election on, as the
// ServiceAccount that YAML binds, impersonated with exactly the groups a
// ServiceAccount gets. End to end: the lease is taken in the operator's
// namespace, a pool's pods are created, a claim is served (its record
// written), a pod it releases is deleted and replaced, the pool's status
// and events (events.k8s.io on the claim, core/v1 on the lease) are
// written, and not one request is forbidden. The rules grant nothing
// beyond that: a sample of other requests is denied; and one rule is
// shown needed: without delete on pods, a released pod's deletion is
// forbidden and the pod stays, until the rule is back.
func TestLeastPrivilegeRBAC(t *testing.T) {
	ctx := t.Context()
	opNS := env.namespace(ctx, t)   // the operator's own: ServiceAccount, lease
	poolNS := env.namespace(ctx, t) // where its pools are
	objs, err := opconfig.RBAC(opNS)
	require.NoError(t, err)
	var role *rbacv1.ClusterRole
	var leRole *rbacv1.Role
	for _, o := range objs {
		switch o := o.(type) {
		case *rbacv1.ClusterRole:
			role = o
		case *rbacv1.Role:
			leRole = o
		}
		apply(ctx, t, o)
	}
	require.NotNil(t, role)
	require.NotNil(t, leRole)

	user := "system:serviceaccount:" + opNS + ":" + opconfig.ServiceAccount
	sa := rest.CopyConfig(env.Config)
	sa.Impersonate = rest.ImpersonationConfig{
		UserName: user,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + opNS, "system:authenticated"},
	}
	saClient, err := client.New(sa, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)

	// What the rules grant, once the authorizer has them: each rule of the
	// ClusterRole in the pools' namespace, and cluster-wide for list and
	// watch (the operator watches every namespace unless told one); the
	// Role's in the operator's namespace.
	var granted []authorizationv1.ResourceAttributes
	for _, r := range role.Rules {
		granted = append(granted, attributes(r, poolNS)...)
		for _, a := range attributes(r, "") {
			if a.Verb == "list" || a.Verb == "watch" {
				granted = append(granted, a)
			}
		}
	}
	for _, r := range leRole.Rules {
		granted = append(granted, attributes(r, opNS)...)
	}
	var denied []string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, waitFor, true, func(ctx context.Context) (bool, error) {
		denied = nil
		for _, a := range granted {
			if ok, err := allowed(ctx, saClient, a); err != nil || !ok {
				denied = append(denied, fmt.Sprintf("%+v (%v)", a, err))
			}
		}
		return len(denied) == 0, nil
	})
	require.NoError(t, err, "the ServiceAccount is not granted %v", denied)
	for _, a := range []authorizationv1.ResourceAttributes{
		{Namespace: poolNS, Verb: "get", Resource: "secrets"},
		{Namespace: poolNS, Verb: "list", Resource: "configmaps"},
		{Namespace: poolNS, Verb: "update", Resource: "pods"},
		{Namespace: poolNS, Verb: "create", Resource: "pods", Subresource: "eviction"},
		{Namespace: poolNS, Verb: "delete", Group: poolv1.Group, Resource: "claims"},
		{Namespace: poolNS, Verb: "update", Group: poolv1.Group, Resource: "claims"},
		{Namespace: poolNS, Verb: "patch", Group: poolv1.Group, Resource: "pools"},
		{Namespace: poolNS, Verb: "get", Group: "coordination.k8s.io", Resource: "leases"},
		{Namespace: poolNS, Verb: "create", Resource: "events"},
		{Namespace: opNS, Verb: "delete", Group: "coordination.k8s.io", Resource: "leases"},
	} {
		ok, err := allowed(ctx, saClient, a)
		require.NoError(t, err)
		require.False(t, ok, "the ServiceAccount may %+v", a)
	}

	// The operator, as that ServiceAccount. Every response it gets goes
	// through forbidden.
	var forbidden forbiddenLog
	opCfg := rest.CopyConfig(sa)
	opCfg.Wrap(forbidden.wrap)
	mgr, err := NewManager(opCfg, ManagerConfig{MetricsAddr: "0", ProbeAddr: "0",
		LeaderElection: true, LeaseNamespace: opNS, LeaseID: "poolalloc-operator", Namespaces: []string{poolNS}})
	require.NoError(t, err)
	require.NoError(t, Setup(anyControllerName{mgr}, Options{Metrics: prometheus.NewRegistry()}))
	mgrCtx, stopMgr := context.WithCancel(context.Background())
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() {
		stopMgr()
		require.NoError(t, <-mgrDone, "manager")
	})
	h := &harness{t: t, ctx: ctx, c: env.Client, ns: poolNS, pool: "p"}
	h.startKubelet()

	require.NoError(t, h.c.Create(ctx, poolv1.NewPool(poolNS, h.pool, 2)))
	require.NoError(t, h.c.Create(ctx, poolv1.NewClaim(poolNS, "a", h.pool, 2)))
	s := h.eventually("claim served", func(s snap) bool { return s.served() && s.live() == 2 })
	var lease coordinationv1.Lease
	require.NoError(t, h.c.Get(ctx, client.ObjectKey{Namespace: opNS, Name: "poolalloc-operator"}, &lease))
	require.NotEmpty(t, ptr.Deref(lease.Spec.HolderIdentity, ""), "the operator holds its lease")

	// a gives one pod back for good: the pod is deleted, and the pool
	// (replicas 2) gets a new one.
	gave, gaveUID := s.held["a"][0], s.pods[s.held["a"][0]].UID
	h.release("a", gave, 1)
	h.eventually("released pod deleted and replaced", func(s snap) bool {
		p, ok := s.pods[gave]
		return (!ok || p.UID != gaveUID) && s.served() && slices.Contains(s.released["a"], gave) && s.live() == 2
	})
	h.clearRelease("a")
	require.Eventually(t, func() bool {
		pool := poolv1.NewPool(poolNS, h.pool, 0)
		if err := h.c.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
			return false
		}
		pods, _, _ := unstructured.NestedInt64(pool.Object, "status", "pods")
		return pods == 2
	}, waitFor, pollEach, "the pool's status is written")
	require.Eventually(t, func() bool {
		var events eventsv1.EventList
		var core corev1.EventList
		if h.c.List(ctx, &events, client.InNamespace(poolNS)) != nil || h.c.List(ctx, &core, client.InNamespace(opNS)) != nil {
			return false
		}
		return slices.ContainsFunc(events.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Name == "a" && e.Reason == allocator.EventAllocated
		}) && slices.ContainsFunc(core.Items, func(e corev1.Event) bool {
			return e.InvolvedObject.Kind == "Lease" && e.Reason == "LeaderElection"
		})
	}, waitFor, pollEach, "an Allocated event on claim a (events.k8s.io) and a LeaderElection event on the lease (core/v1)")
	require.Empty(t, forbidden.list(), "requests the shipped RBAC forbade")

	// Without delete on pods, the pod a releases next is not deleted: its
	// deletion is forbidden. With the rule back, it is.
	without := role.DeepCopy()
	for i := range without.Rules {
		if slices.Contains(without.Rules[i].Resources, "pods") {
			without.Rules[i].Verbs = slices.DeleteFunc(slices.Clone(without.Rules[i].Verbs), func(v string) bool { return v == "delete" })
		}
	}
	apply(ctx, t, without)
	deletePods := authorizationv1.ResourceAttributes{Namespace: poolNS, Verb: "delete", Resource: "pods"}
	require.Eventually(t, func() bool { ok, err := allowed(ctx, saClient, deletePods); return err == nil && !ok }, waitFor, pollEach)
	s = h.read(t)
	gave, gaveUID = s.held["a"][0], s.pods[s.held["a"][0]].UID
	h.release("a", gave, 0)
	require.Eventually(t, func() bool {
		return slices.ContainsFunc(forbidden.list(), func(r string) bool { return r == "DELETE /api/v1/namespaces/"+poolNS+"/pods/"+gave })
	}, waitFor, pollEach, "the operator tries to delete %s and is forbidden", gave)
	s = h.read(t)
	require.Equal(t, gaveUID, s.pods[gave].UID, "pod %s is still there", gave)
	require.NotContains(t, s.released["a"], gave, "a pod whose recycling failed is not released")
	for _, r := range forbidden.list() {
		require.True(t, strings.HasPrefix(r, "DELETE /api/v1/namespaces/"+poolNS+"/pods/"), "only pod deletions are forbidden: %s", r)
	}
	apply(ctx, t, role)
	h.eventually("released pod deleted once the rule is back", func(s snap) bool {
		p, ok := s.pods[gave]
		return (!ok || p.UID != gaveUID) && s.served() && slices.Contains(s.released["a"], gave)
	})
	h.noViolations()
}

// anyControllerName lets Setup register its "pool" controller again in
// this process (other tests do too); it changes nothing else of the
// manager.
type anyControllerName struct{ ctrl.Manager }

func (m anyControllerName) GetControllerOptions() config.Controller {
	o := m.Manager.GetControllerOptions()
	o.SkipNameValidation = ptr.To(true)
	return o
}

// forbiddenLog records the requests answered 403 Forbidden, as "METHOD
// path". Safe for concurrent use.
type forbiddenLog struct {
	mu   sync.Mutex
	reqs []string // guarded by mu
}

func (f *forbiddenLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		if err == nil && resp.StatusCode == http.StatusForbidden {
			f.mu.Lock()
			f.reqs = append(f.reqs, r.Method+" "+r.URL.Path)
			f.mu.Unlock()
		}
		return resp, err
	})
}

func (f *forbiddenLog) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// attributes lists what rule grants, one verb on one resource (or
// subresource) each, in namespace.
func attributes(rule rbacv1.PolicyRule, namespace string) []authorizationv1.ResourceAttributes {
	var out []authorizationv1.ResourceAttributes
	for _, g := range rule.APIGroups {
		for _, res := range rule.Resources {
			resource, sub, _ := strings.Cut(res, "/")
			for _, v := range rule.Verbs {
				out = append(out, authorizationv1.ResourceAttributes{Namespace: namespace, Verb: v, Group: g, Resource: resource, Subresource: sub})
			}
		}
	}
	return out
}

// allowed asks the API server whether the user behind c may do a.
func allowed(ctx context.Context, c client.Client, a authorizationv1.ResourceAttributes) (bool, error) {
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}
	if err := c.Create(ctx, review); err != nil {
		return false, err
	}
	return review.Status.Allowed, nil
}

// apply creates obj as admin, or replaces the object of its name.
func apply(ctx context.Context, t *testing.T, obj client.Object) {
	t.Helper()
	c := env.Client
	err := c.Create(ctx, obj.DeepCopyObject().(client.Object))
	if apierrors.IsAlreadyExists(err) {
		old := obj.DeepCopyObject().(client.Object)
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(obj), old))
		next := obj.DeepCopyObject().(client.Object)
		next.SetResourceVersion(old.GetResourceVersion())
		err = c.Update(ctx, next)
	}
	require.NoError(t, err, "apply %T %s", obj, types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()})
}
