package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolalloc/poolalloc/examples/operator/envtestbin"
)

// env is the API server the package's tests share: the embedded one, as
// the demo runs it.
var env *embedded

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard()) // envtest logs through it; each manager has its own
	code := runTests(m)
	if build.bin != "" {
		_ = os.RemoveAll(filepath.Dir(build.bin))
	}
	os.Exit(code)
}

// runTests starts the embedded API server before m.Run (so that finding or
// building its binaries is not counted against -timeout), runs the tests
// and stops it; on SIGINT or SIGTERM it stops it and exits.
func runTests(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, err := startEmbedded(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env = e
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "%v: stopping the embedded API server\n", s)
			_ = e.stop()
			os.Exit(1)
		case <-ctx.Done():
		}
	}()
	code := m.Run()
	if err := e.stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

var notDNS = regexp.MustCompile(`[^a-z0-9]+`)

// namespace creates a namespace with a fresh name for the test and deletes
// it when the test ends. The API server has no namespace controller, so the
// namespace and its objects stay, marked terminating.
func (e *embedded) namespace(ctx context.Context, t testing.TB) string {
	t.Helper()
	prefix := strings.Trim(notDNS.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	prefix = strings.TrimRight(prefix[:min(len(prefix), 40)], "-") + "-"
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	require.NoError(t, e.Client.Create(ctx, ns), "create namespace")
	cleanupCtx := context.WithoutCancel(ctx)
	t.Cleanup(func() {
		if err := e.Client.Delete(cleanupCtx, ns); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

// Outside this repository, with no KUBEBUILDER_ASSETS and nothing in
// setup-envtest's store, the embedded API server says how to get binaries;
// KUBEBUILDER_ASSETS is taken as it is.
func TestFindBinaries(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("// a fork\nmodule example.com/fork\n\ngo 1.26\n"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	t.Chdir(filepath.Join(dir, "sub"))
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	t.Setenv(envtestbin.EnvAssets, "")
	_, _, err := findBinaries(t.Context(), nil)
	require.ErrorContains(t, err, "set KUBEBUILDER_ASSETS")
	require.ErrorContains(t, err, "setup-envtest@latest use -p path 1.37.2")

	t.Setenv(envtestbin.EnvAssets, "/some/where")
	got, from, err := findBinaries(t.Context(), nil)
	require.NoError(t, err)
	require.Equal(t, "/some/where", got)
	require.Equal(t, envtestbin.EnvAssets, from)
}

// moduleRoot finds the nearest go.mod above a directory and tells
// whether it is the module asked for.
func TestModuleRoot(t *testing.T) {
	repo := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(repo, "go.mod"), []byte("module "+poolallocModule+"\n"), 0o644))
	example := filepath.Join(repo, "examples", "operator")
	require.NoError(t, os.MkdirAll(example, 0o755))
	root, ok := moduleRoot(example, poolallocModule)
	require.True(t, ok)
	require.Equal(t, repo, root)
	_, ok = moduleRoot(example, forkModule)
	require.False(t, ok, "the nearest go.mod is poolalloc's")

	fork := filepath.Join(repo, "fork")
	require.NoError(t, os.MkdirAll(filepath.Join(fork, "api"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(fork, "go.mod"), []byte("module "+forkModule+"\n"), 0o644))
	_, ok = moduleRoot(filepath.Join(fork, "api"), poolallocModule)
	require.False(t, ok, "a module nested in the repository is not the repository")

	for gomod, want := range map[string]string{
		"module example.com/fork\n":                     "example.com/fork",
		"// comment\nmodule \"example.com/quoted\"\n":   "example.com/quoted",
		"module\texample.com/tab // trailing comment\n": "example.com/tab",
		"go 1.26\n":   "",
		"modules x\n": "",
	} {
		require.Equal(t, want, modulePath([]byte(gomod)), "%q", gomod)
	}
}
