// Package cluster connects the examples to a Kubernetes API server: the
// cluster of KUBECONFIG, or an embedded one from internal/testenv.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/poolalloc/poolalloc/internal/parallel"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/syncer"
)

// Conn is a connection to an API server.
type Conn struct {
	Config *rest.Config
	Scheme *runtime.Scheme
	Client client.WithWatch
	// Embedded is set when the API server was started by Connect.
	Embedded bool
	// Close undoes Connect: it stops the embedded API server, or removes
	// the CRDs Connect installed.
	Close func(context.Context) error
}

// Connect connects to the cluster of KUBECONFIG, installing the test CRDs
// if they are missing, or to an embedded API server when KUBECONFIG is not
// set (build progress, if any, goes to stderr).
func Connect(ctx context.Context) (Conn, error) {
	if os.Getenv("KUBECONFIG") == "" {
		fmt.Println("KUBECONFIG is not set: starting an embedded kube-apiserver and etcd")
		env, err := testenv.Start(ctx, os.Stderr)
		if err != nil {
			return Conn{}, err
		}
		c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
		if err != nil {
			return Conn{}, errors.Join(fmt.Errorf("client: %w", err), env.Stop())
		}
		return Conn{Config: env.Config, Scheme: env.Scheme, Client: c, Embedded: true,
			Close: func(context.Context) error { return env.Stop() }}, nil
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return Conn{}, err
	}
	scheme, err := testenv.NewScheme()
	if err != nil {
		return Conn{}, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return Conn{}, fmt.Errorf("client: %w", err)
	}
	fmt.Println("using the cluster of KUBECONFIG at", cfg.Host)
	var installed []client.Object // CRDs we created, the only ones we remove
	undo := func(ctx context.Context) error {
		var errs []error
		for _, crd := range installed {
			errs = append(errs, client.IgnoreNotFound(c.Delete(ctx, crd)))
		}
		return errors.Join(errs...)
	}
	crds, err := testenv.CRDs()
	if err != nil {
		return Conn{}, err
	}
	for _, crd := range crds {
		switch err := c.Create(ctx, crd); {
		case err == nil:
			installed = append(installed, crd)
		case !apierrors.IsAlreadyExists(err):
			return Conn{}, errors.Join(fmt.Errorf("install CRD %s: %w", crd.Name, err), undo(context.WithoutCancel(ctx)))
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return c.List(ctx, &testenv.ClaimList{}, client.Limit(1)) == nil, nil
	})
	if err != nil {
		return Conn{}, errors.Join(fmt.Errorf("wait for the claim CRD: %w", err), undo(context.WithoutCancel(ctx)))
	}
	return Conn{Config: cfg, Scheme: scheme, Client: c, Close: undo}, nil
}

// RemoveNamespace takes the allocation finalizer off the test claims left in
// ns, workers at a time (no allocator will release them now), and deletes
// the namespace.
func RemoveNamespace(ctx context.Context, c client.Client, ns string, workers int) error {
	var claims testenv.ClaimList
	if err := c.List(ctx, &claims, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("cleanup: list claims: %w", err)
	}
	var todo []*testenv.Claim
	var origs []*testenv.Claim
	for i := range claims.Items {
		cl, orig := &claims.Items[i], claims.Items[i].DeepCopy()
		if controllerutil.RemoveFinalizer(cl, syncer.DefaultKeys().Finalizer) {
			todo, origs = append(todo, cl), append(origs, orig)
		}
	}
	err := parallel.Do(ctx, len(todo), workers, func(ctx context.Context, i int) error {
		if err := c.Patch(ctx, todo[i], client.MergeFrom(origs[i])); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("cleanup: claim %s/%s: remove finalizer: %w", ns, todo[i].Name, err)
		}
		return nil
	})
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	return errors.Join(err, client.IgnoreNotFound(c.Delete(ctx, nsObj)))
}
