package testenv

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolalloc/poolalloc/examples/operator/envtestbin"
)

// Timeouts of the control plane processes. Start waits long because
// go test runs several test binaries at once, each starting its own API
// server on a small machine.
const (
	startTimeout = 90 * time.Second
	stopTimeout  = 20 * time.Second
	// readyTimeout bounds the wait for the API server to serve the test
	// CRDs after a restart, and for RBAC grants to take effect.
	readyTimeout = 30 * time.Second
)

// Env is a running etcd and kube-apiserver with the test CRDs installed.
//
// Client and Config act as cluster admin (group system:masters). They stay
// valid across RestartAPIServer: the API server comes back on the same port
// with the same serving and client certificates.
//
// An Env is safe for concurrent use by tests, except Stop and
// RestartAPIServer, which must not run while other calls are in flight.
type Env struct {
	// Client is an admin client using Scheme.
	Client client.Client
	// Config is the admin REST config Client was made from.
	Config *rest.Config
	// Scheme holds client-go's built-in types, apiextensions/v1 and the test
	// types (Claim, ClaimList).
	Scheme *runtime.Scheme
	// AssetsDir is the directory holding the kube-apiserver and etcd
	// binaries in use; AssetsFrom says where it came from:
	// KUBEBUILDER_ASSETS, "cache" (built earlier), "setup-envtest" (the
	// binaries controller-runtime's setup-envtest installed) or "built".
	AssetsDir  string
	AssetsFrom string
	// ShardedListAndWatch is set when the API server runs with that
	// feature gate on: it does when its kube-apiserver is v1.36 or newer
	// (the gate is unknown to older ones, which KUBEBUILDER_ASSETS may
	// hold).
	ShardedListAndWatch bool

	env      *envtest.Environment
	certDir  string    // the API server's certificates, kept across restarts
	watchdog *exec.Cmd // ends the control plane if the test binary dies; may be nil

	// usersMu serializes env.AddUser: envtest's certificate authority is
	// not safe for concurrent use.
	usersMu sync.Mutex

	stopOnce sync.Once
	stopErr  error
}

// NewScheme returns a scheme with client-go's built-in types,
// apiextensions/v1 and the test types.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("testenv: build scheme: %w", err)
		}
	}
	return s, nil
}

// Start finds or builds the binaries (see Assets; build progress goes to
// progress, which may be nil), starts etcd and kube-apiserver, and installs
// the test CRDs. The caller must call Stop.
func Start(ctx context.Context, progress io.Writer) (*Env, error) {
	dir, from, err := assets(ctx, progress)
	if err != nil {
		return nil, err
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	crds, err := CRDs()
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	// The API server's certificates live in a directory we own, so that
	// RestartAPIServer brings it back with the same serving certificate.
	certDir, err := os.MkdirTemp("", "poolalloc-apiserver-")
	if err != nil {
		return nil, fmt.Errorf("testenv: create cert dir: %w", err)
	}
	e := &Env{
		Scheme:     scheme,
		AssetsDir:  dir,
		AssetsFrom: from,
		certDir:    certDir,
		env: &envtest.Environment{
			Scheme:                   scheme,
			BinaryAssetsDirectory:    dir,
			CRDs:                     crds,
			ErrorIfCRDPathMissing:    true,
			ControlPlaneStartTimeout: startTimeout,
			ControlPlaneStopTimeout:  stopTimeout,
			ControlPlane: envtest.ControlPlane{
				APIServer: &envtest.APIServer{
					Path:    filepath.Join(dir, "kube-apiserver"),
					CertDir: certDir,
				},
				Etcd: &envtest.Etcd{Path: filepath.Join(dir, "etcd")},
			},
		},
	}
	// Alpha since v1.36: sharded list and watch (allocator/sharding).
	if v, err := envtestbin.BinaryVersion(ctx, filepath.Join(dir, "kube-apiserver"), "Kubernetes "); err == nil {
		if parsed, err := version.ParseGeneric(v); err == nil && parsed.AtLeast(version.MajorMinor(1, 36)) {
			e.env.ControlPlane.APIServer.Configure().Append("feature-gates", "ShardedListAndWatch=true")
			e.ShardedListAndWatch = true
		}
	}
	cfg, err := e.env.Start()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("testenv: start control plane: %w", err), e.Stop())
	}
	e.watchdog = e.startWatchdog()
	e.Config = cfg
	e.Client, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("testenv: admin client: %w", err), e.Stop())
	}
	if err := e.waitServing(ctx); err != nil {
		return nil, errors.Join(err, e.Stop())
	}
	if err := e.waitCreatable(ctx); err != nil {
		return nil, errors.Join(err, e.Stop())
	}
	return e, nil
}

// crdCreateDelay is how long after a CRD becomes Established the API server
// holds every create of its resources (apiextensions-apiserver sleeps two
// seconds on each create while the CRD is that young, for HA setups).
const crdCreateDelay = 2 * time.Second

// waitCreatable waits until the test CRDs are old enough that creates are
// no longer held, so that the first create in a test is as fast as the
// others. Established times are stored in whole seconds, as the server sees
// them.
func (e *Env) waitCreatable(ctx context.Context) error {
	var latest time.Time
	for _, crd := range e.env.CRDs {
		var got apiextensionsv1.CustomResourceDefinition
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(crd), &got); err != nil {
			return fmt.Errorf("testenv: get CRD %s: %w", crd.Name, err)
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.LastTransitionTime.After(latest) {
				latest = c.LastTransitionTime.Time
			}
		}
	}
	d := time.Until(latest.Add(crdCreateDelay + 50*time.Millisecond))
	if d <= 0 {
		return nil
	}
	select {
	case <-time.After(min(d, crdCreateDelay+time.Second)):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop stops the API server and etcd and removes their data. Calling it
// again returns the first call's result.
func (e *Env) Stop() error {
	e.stopOnce.Do(func() {
		e.stopErr = e.env.Stop()
		stopWatchdog(e.watchdog)
		if err := os.RemoveAll(e.certDir); err != nil {
			e.stopErr = errors.Join(e.stopErr, err)
		}
	})
	return e.stopErr
}

// RestartAPIServer stops the kube-apiserver process and starts it again
// against the same etcd, as a control plane upgrade or crash would. All data
// survives. The server returns on the same address with the same
// certificates, so Client, Config and clients from UserClient keep working
// unchanged; requests made while it is down fail. RestartAPIServer returns
// once the test CRDs are served again.
func (e *Env) RestartAPIServer(ctx context.Context) error {
	api := e.env.ControlPlane.APIServer
	if err := api.Stop(); err != nil {
		return fmt.Errorf("testenv: stop kube-apiserver: %w", err)
	}
	if err := api.Start(); err != nil {
		return fmt.Errorf("testenv: start kube-apiserver again on port %s: %w", api.SecureServing.Port, err)
	}
	return e.waitServing(ctx)
}

// waitServing waits until the API server serves the test CRDs.
func (e *Env) waitServing(ctx context.Context) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, readyTimeout, true, func(ctx context.Context) (bool, error) {
		last = e.Client.List(ctx, &ClaimList{}, client.InNamespace(metav1.NamespaceDefault), client.Limit(1))
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("testenv: API server does not serve %s: %w (last error: %v)", ClaimGVK, err, last)
	}
	return nil
}

// Namespace creates a namespace with a fresh name for the test and deletes
// it when the test ends. The API server has no namespace controller, so the
// namespace and its objects are not actually removed, only marked
// terminating; tests must not depend on that.
func (e *Env) Namespace(ctx context.Context, t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: namePrefix(t.Name())}}
	if err := e.Client.Create(ctx, ns); err != nil {
		t.Fatalf("testenv: create namespace: %v", err)
	}
	cleanupCtx := context.WithoutCancel(ctx)
	t.Cleanup(func() {
		if err := e.Client.Delete(cleanupCtx, ns); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("testenv: delete namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

var notDNS = regexp.MustCompile(`[^a-z0-9]+`)

// namePrefix turns a test name into a namespace generateName prefix.
func namePrefix(test string) string {
	p := strings.Trim(notDNS.ReplaceAllString(strings.ToLower(test), "-"), "-")
	if len(p) > 40 {
		p = strings.TrimRight(p[:40], "-")
	}
	if p == "" {
		p = "test"
	}
	return p + "-"
}

// UserClient returns a client that authenticates as user name (groups
// system:authenticated only) and is granted exactly rules: in namespace
// through a Role and RoleBinding, or cluster-wide through a ClusterRole and
// ClusterRoleBinding when namespace is "". The grant is named
// "testenv:<name>" and replaced if it exists. UserClient returns once the
// API server's authorizer applies the grant.
func (e *Env) UserClient(ctx context.Context, name string, rules []rbacv1.PolicyRule, namespace string) (client.Client, error) {
	e.usersMu.Lock()
	user, err := e.env.AddUser(envtest.User{Name: name}, e.Config)
	e.usersMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("testenv: add user %s: %w", name, err)
	}
	grant := "testenv:" + name
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}}
	var role, binding client.Object
	if namespace == "" {
		role = &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: grant}, Rules: rules}
		binding = &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: grant},
			Subjects:   subjects,
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: grant},
		}
	} else {
		role = &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: grant}, Rules: rules}
		binding = &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: grant},
			Subjects:   subjects,
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: grant},
		}
	}
	for _, obj := range []client.Object{role, binding} {
		if err := e.createOrReplace(ctx, obj); err != nil {
			return nil, fmt.Errorf("testenv: grant user %s: %w", name, err)
		}
	}
	c, err := client.New(user.Config(), client.Options{Scheme: e.Scheme})
	if err != nil {
		return nil, fmt.Errorf("testenv: client for user %s: %w", name, err)
	}
	if err := waitRules(ctx, c, namespace, rules); err != nil {
		return nil, fmt.Errorf("testenv: grant user %s: %w", name, err)
	}
	return c, nil
}

func (e *Env) createOrReplace(ctx context.Context, obj client.Object) error {
	err := e.Client.Create(ctx, obj.DeepCopyObject().(client.Object))
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	old := obj.DeepCopyObject().(client.Object)
	if err := e.Client.Get(ctx, client.ObjectKeyFromObject(obj), old); err != nil {
		return err
	}
	obj.SetResourceVersion(old.GetResourceVersion())
	return e.Client.Update(ctx, obj)
}

// waitRules waits until a SelfSubjectRulesReview of the user behind c lists
// every resource rule of want, that is until the authorizer's caches hold
// the new Role and binding.
func waitRules(ctx context.Context, c client.Client, namespace string, want []rbacv1.PolicyRule) error {
	if namespace == "" {
		namespace = metav1.NamespaceDefault
	}
	var missing *rbacv1.PolicyRule
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, readyTimeout, true, func(ctx context.Context) (bool, error) {
		review := &authorizationv1.SelfSubjectRulesReview{
			Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: namespace},
		}
		if err := c.Create(ctx, review); err != nil {
			return false, nil //nolint:nilerr // retried until the deadline
		}
		missing = nil
		for i, r := range want {
			if len(r.Resources) == 0 {
				continue
			}
			if !slices.ContainsFunc(review.Status.ResourceRules, func(got authorizationv1.ResourceRule) bool {
				return sameSet(got.Verbs, r.Verbs) && sameSet(got.APIGroups, r.APIGroups) &&
					sameSet(got.Resources, r.Resources) && sameSet(got.ResourceNames, r.ResourceNames)
			}) {
				missing = &want[i]
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("rule %v not in effect: %w", missing, err)
	}
	return nil
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Compact(slices.Sorted(slices.Values(a))), slices.Compact(slices.Sorted(slices.Values(b))))
}

// Main runs a package's tests against one Env; call it from TestMain:
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }
//
// It starts the Env before m.Run, so that a first build of the binaries is
// not counted against go test's -timeout (its alarm starts inside m.Run),
// reports on stderr where the binaries come from and how long the start
// took, runs the tests and stops the Env. On SIGINT or SIGTERM, or shortly
// before the -timeout alarm would end the process, it stops the control
// plane first so that no etcd or kube-apiserver outlives the test binary.
// With -test.run '^$' (benchmarks alone) it starts nothing and *env stays
// nil: a benchmark that needs the API server belongs in a package that
// starts its own. It returns the exit code for os.Exit.
func Main(m *testing.M, env **Env) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	// envtest logs through controller-runtime's logger, which complains on
	// stderr when it was never set.
	ctrllog.SetLogger(logr.Discard())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var started atomic.Pointer[Env]
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "testenv: %v: stopping the control plane\n", s)
			cancel() // ends a build in progress; Start then fails
			if e := started.Load(); e != nil {
				e.emergencyStop()
				os.Exit(1)
			}
		case <-ctx.Done():
		}
	}()

	if noTests() {
		// Benchmarks alone: no control plane, whose background work
		// would only add to their noise.
		fmt.Fprintln(os.Stderr, "testenv: -test.run selects no test: the control plane is not started")
		return m.Run()
	}
	start := time.Now()
	e, err := Start(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		return 1
	}
	*env = e
	started.Store(e)
	versions := fmt.Sprintf("kube-apiserver %s and etcd %s", KubeVersion, EtcdVersion)
	switch e.AssetsFrom {
	case fromEnv:
		versions = "kube-apiserver and etcd"
	case fromSetupEnvtest:
		versions = "kube-apiserver " + KubeVersion + " and etcd"
	}
	fmt.Fprintf(os.Stderr, "testenv: %s from %s (%s); control plane up in %s\n",
		versions, e.AssetsDir, e.AssetsFrom, time.Since(start).Round(10*time.Millisecond))

	if d := testTimeout(); d > 0 {
		margin := min(5*time.Second, d/10)
		t := time.AfterFunc(d-margin, func() {
			fmt.Fprintln(os.Stderr, "testenv: test timeout is near: stopping the control plane")
			e.emergencyStop()
		})
		defer t.Stop()
	}

	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stop: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// noTests reports whether -test.run is "^$", the pattern that selects no
// test (as for benchmarks alone).
func noTests() bool {
	f := flag.Lookup("test.run")
	return f != nil && f.Value.String() == "^$"
}

// emergencyStop signals both processes at once, so that neither survives
// the test binary even if it exits while the API server shuts down.
func (e *Env) emergencyStop() {
	var wg sync.WaitGroup
	wg.Go(func() { _ = e.env.ControlPlane.Etcd.Stop() })
	wg.Go(func() { _ = e.Stop() })
	wg.Wait()
}

// testTimeout returns go test's -test.timeout, or 0.
func testTimeout() time.Duration {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return 0
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return 0
	}
	d, _ := g.Get().(time.Duration)
	return d
}
