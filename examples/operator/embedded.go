package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
	"github.com/poolalloc/poolalloc/examples/operator/config"
	"github.com/poolalloc/poolalloc/examples/operator/envtestbin"
)

// The embedded API server: kube-apiserver and etcd run by controller-runtime's
// envtest, for the demo (no KUBECONFIG) and the tests. Nothing here runs
// against a cluster. A fork keeps it for its tests as is: it installs
// config/crd, and its binaries come from KUBEBUILDER_ASSETS or setup-envtest
// (findBinaries).

// Timeouts of the control plane processes: long, because go test runs
// several test binaries at once, each starting its own API server, on small
// machines.
const (
	startTimeout = 90 * time.Second
	stopTimeout  = 20 * time.Second
)

// poolallocModule is the module of the repository the example ships in.
const poolallocModule = "github.com/poolalloc/poolalloc"

// embedded is a running kube-apiserver and etcd with the operator's CRDs
// installed. Config and Client act as cluster admin (system:masters).
type embedded struct {
	// Config is the admin REST config.
	Config *rest.Config
	// Client is an admin client with Scheme.
	Client client.Client
	// Scheme holds client-go's built-in types and the operator's API.
	Scheme *runtime.Scheme

	env *envtest.Environment
}

// startEmbedded finds the binaries (findBinaries; what it does and where
// they came from goes to progress), starts etcd and kube-apiserver, and
// installs the CRDs of config/crd. The API server enforces owner reference
// permissions (admission plugin OwnerReferencesPermissionEnforcement), as
// hardened clusters do, so that the shipped RBAC is tested for them too.
// The caller must call stop.
func startEmbedded(ctx context.Context, progress io.Writer) (*embedded, error) {
	dir, from, err := findBinaries(ctx, progress)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "embedded API server: kube-apiserver and etcd from %s (%s)\n", dir, from)
	crds, err := config.CRDs()
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, fmt.Errorf("embedded API server: scheme: %w", err)
		}
	}
	api := &envtest.APIServer{}
	api.Configure().Append("enable-admission-plugins", "OwnerReferencesPermissionEnforcement")
	env := &envtest.Environment{
		Scheme:                   scheme,
		BinaryAssetsDirectory:    dir,
		CRDs:                     crds,
		ControlPlaneStartTimeout: startTimeout,
		ControlPlaneStopTimeout:  stopTimeout,
		ControlPlane:             envtest.ControlPlane{APIServer: api},
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("embedded API server: start: %w", err), env.Stop())
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("embedded API server: client: %w", err), env.Stop())
	}
	return &embedded{Config: cfg, Client: c, Scheme: scheme, env: env}, nil
}

// stop stops the API server and etcd and removes their data.
func (e *embedded) stop() error {
	if err := e.env.Stop(); err != nil {
		return fmt.Errorf("embedded API server: stop: %w", err)
	}
	return nil
}

// findBinaries returns a directory holding kube-apiserver and etcd, and
// where it came from:
//
//   - KUBEBUILDER_ASSETS, as every envtest suite reads it;
//   - setup-envtest's default store, if it holds envtestbin.KubeVersion
//     (`setup-envtest use 1.37.2` installs it there);
//   - inside the poolalloc repository only, the binaries its test harness
//     builds once and caches: `go run ./internal/testenv/cmd/envtest-assets`
//     at the repository's root (its progress goes to progress);
//
// otherwise an error that says how to get them.
func findBinaries(ctx context.Context, progress io.Writer) (dir, from string, err error) {
	if dir := os.Getenv(envtestbin.EnvAssets); dir != "" {
		return dir, envtestbin.EnvAssets, nil
	}
	if dir, ok := envtestbin.SetupEnvtest(ctx, envtestbin.KubeVersion); ok {
		return dir, "setup-envtest", nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", "", fmt.Errorf("embedded API server: %w", err)
	}
	if root, ok := moduleRoot(wd, poolallocModule); ok {
		dir, err := harnessBinaries(ctx, root, progress)
		return dir, "poolalloc's test harness", err
	}
	return "", "", fmt.Errorf("embedded API server: no kube-apiserver and etcd: set %s to a directory holding both, "+
		"for example with controller-runtime's setup-envtest: "+
		"%s=$(go run sigs.k8s.io/controller-runtime/tools/setup-envtest@latest use -p path %s), "+
		"or set KUBECONFIG to run against a cluster",
		envtestbin.EnvAssets, envtestbin.EnvAssets, strings.TrimPrefix(envtestbin.KubeVersion, "v"))
}

// moduleRoot walks up from dir to the nearest go.mod and returns its
// directory if it declares module, false otherwise (another module, or
// none).
func moduleRoot(dir, module string) (string, bool) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", false
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			return dir, modulePath(data) == module
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

// modulePath returns the module path a go.mod declares, "" if none.
func modulePath(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module")
		if ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
			rest, _, _ = strings.Cut(rest, "//")
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// harnessBinaries runs poolalloc's envtest-assets command at the
// repository's root and returns the directory it prints: it builds the
// binaries on the first run (minutes) and finds them in its cache after.
func harnessBinaries(ctx context.Context, root string, progress io.Writer) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "run", "./internal/testenv/cmd/envtest-assets")
	cmd.Dir = root
	cmd.Stderr = progress
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("embedded API server: go run ./internal/testenv/cmd/envtest-assets in %s: %w", root, err)
	}
	dir := strings.TrimSpace(string(out))
	if !envtestbin.HasBinaries(dir) {
		return "", fmt.Errorf("embedded API server: go run ./internal/testenv/cmd/envtest-assets in %s printed %q, which holds no kube-apiserver and etcd", root, dir)
	}
	return dir, nil
}
