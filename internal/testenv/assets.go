package testenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/poolalloc/poolalloc/examples/operator/envtestbin"
)

// Versions of the binaries Assets provides. They must match the tool modules
// under tools/. KubeVersion is the operator example's (envtestbin), the
// version it looks for in setup-envtest's store too.
const (
	KubeVersion = envtestbin.KubeVersion
	EtcdVersion = "v3.7.3"
)

// EnvAssets is the environment variable that, when set, names a directory
// holding kube-apiserver and etcd; Assets then uses it as is and builds
// nothing. It is the variable controller-runtime's envtest reads too.
const EnvAssets = envtestbin.EnvAssets

// EnvCache is the environment variable that, when set, replaces
// os.UserCacheDir()/poolalloc as the root of the binary cache.
const EnvCache = "POOLALLOC_CACHE"

// progressEvery is how often a running build reports that it still runs.
const progressEvery = 30 * time.Second

// Assets returns a directory containing the kube-apiserver and etcd binaries
// the test harness runs.
//
// If KUBEBUILDER_ASSETS is set, Assets returns it unchecked. Otherwise the
// binaries live in a cache outside the repository,
// <root>/envtest/k8s-<KubeVersion>-etcd-<EtcdVersion>-<hash>, where root is
// $POOLALLOC_CACHE or os.UserCacheDir()/poolalloc and hash covers the tool
// modules' go.mod and go.sum, so a change of version builds afresh. When
// that cache has no binaries yet, the ones controller-runtime's
// setup-envtest installed in its default directory are used if they fit
// (kube-apiserver KubeVersion, etcd 3.5 or a later 3.x; see
// envtestbin.SetupEnvtest). Otherwise missing binaries are built from the Go
// module proxy with the go command. The build
// holds an exclusive lock on a file in the cache directory, so parallel test
// binaries build once while the others wait; each binary is written to a
// temporary directory and renamed into place, so a killed build never leaves
// a partial binary behind.
//
// Progress lines (what is built where, and a line every 30 seconds while it
// runs) are written to progress, which may be nil. The first build of
// kube-apiserver takes about ten minutes on two cores.
func Assets(ctx context.Context, progress io.Writer) (dir string, err error) {
	dir, _, err = assets(ctx, progress)
	return dir, err
}

// Where Assets found the binaries (assetsFrom).
const (
	fromEnv          = EnvAssets
	fromCache        = "cache"
	fromSetupEnvtest = "setup-envtest"
	fromBuild        = "built"
)

// setupEnvtest finds the binaries setup-envtest installed; a variable for
// tests.
var setupEnvtest = envtestbin.SetupEnvtest

// assets is Assets, and says where the binaries came from (fromEnv, ...).
func assets(ctx context.Context, progress io.Writer) (dir, from string, err error) {
	if dir := os.Getenv(EnvAssets); dir != "" {
		return dir, fromEnv, nil
	}
	if progress == nil {
		progress = io.Discard
	}
	tools, err := toolsDir()
	if err != nil {
		return "", "", err
	}
	key, err := cacheKey(tools)
	if err != nil {
		return "", "", err
	}
	root := os.Getenv(EnvCache)
	if root == "" {
		userCache, err := os.UserCacheDir()
		if err != nil {
			return "", "", fmt.Errorf("testenv: locate cache dir (set %s or %s): %w", EnvCache, EnvAssets, err)
		}
		root = filepath.Join(userCache, "poolalloc")
	}
	dir = filepath.Join(root, "envtest", key)
	if envtestbin.HasBinaries(dir) {
		return dir, fromCache, nil
	}
	if found, ok := setupEnvtest(ctx, KubeVersion); ok {
		return found, fromSetupEnvtest, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("testenv: create cache dir: %w", err)
	}
	unlock, err := lockDir(ctx, dir, progress)
	if err != nil {
		return "", "", err
	}
	defer unlock()
	// Remove what killed builds left behind; the lock says none is running.
	if stale, _ := filepath.Glob(filepath.Join(dir, ".build-*")); len(stale) > 0 {
		for _, s := range stale {
			_ = os.RemoveAll(s)
		}
	}
	for _, b := range builds(tools) {
		if envtestbin.IsExecutable(filepath.Join(dir, b.name)) {
			continue
		}
		if err := build(ctx, dir, b, progress); err != nil {
			return "", "", err
		}
	}
	return dir, fromBuild, nil
}

// binaryBuild says how to build one binary from its tool module.
type binaryBuild struct {
	name    string   // file name in the cache dir
	version string   // for progress lines
	module  string   // tool module directory
	args    []string // go build arguments after "build"; the output path is appended
	pkg     string   // package to build
	note    string   // appended to the start line
}

func builds(tools string) []binaryBuild {
	return []binaryBuild{
		{
			name:    "etcd",
			version: EtcdVersion,
			module:  filepath.Join(tools, "etcd"),
			args:    []string{"-trimpath", "-buildvcs=false"},
			pkg:     ".",
			note:    "this happens on the first run only and takes about a minute",
		},
		{
			name:    "kube-apiserver",
			version: KubeVersion,
			module:  filepath.Join(tools, "kube-apiserver"),
			args: []string{"-trimpath", "-buildvcs=false", "-ldflags",
				"-X k8s.io/component-base/version.gitVersion=" + KubeVersion +
					" -X k8s.io/component-base/version.gitMajor=1" +
					" -X k8s.io/component-base/version.gitMinor=37"},
			pkg:  "k8s.io/kubernetes/cmd/kube-apiserver",
			note: "this happens on the first run only and takes about 10 minutes on 2 cores",
		},
	}
}

// build builds b into dir via a temporary directory and a rename.
func build(ctx context.Context, dir string, b binaryBuild, progress io.Writer) error {
	goBin, err := goCommand()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return fmt.Errorf("testenv: build %s: %w", b.name, err)
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, b.name)

	args := append([]string{"build"}, b.args...)
	args = append(args, "-o", out, b.pkg)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = b.module
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var output bytes.Buffer
	cmd.Stdout = &output
	cmd.Stderr = &output

	fmt.Fprintf(progress, "testenv: building %s %s from the module proxy into %s; %s\n", b.name, b.version, dir, b.note)
	start := time.Now()
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				d := time.Since(start).Round(time.Second)
				fmt.Fprintf(progress, "testenv: still building %s (%dm %ds)\n", b.name, int(d.Minutes()), int(d.Seconds())%60)
			}
		}
	}()
	err = cmd.Run()
	close(done)
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("testenv: build %s: %w", b.name, ctxErr)
	}
	if err != nil {
		return fmt.Errorf("testenv: build %s in %s: %w\n%s", b.name, b.module, err, tail(output.String(), 4000))
	}
	if err := os.Rename(out, filepath.Join(dir, b.name)); err != nil {
		return fmt.Errorf("testenv: install %s: %w", b.name, err)
	}
	fmt.Fprintf(progress, "testenv: built %s in %s\n", b.name, time.Since(start).Round(time.Second))
	return nil
}

// lockDir takes the exclusive build lock of dir, waiting while another
// process holds it. The returned function releases it.
func lockDir(ctx context.Context, dir string, progress io.Writer) (unlock func(), err error) {
	path := filepath.Join(dir, ".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testenv: open lock file: %w", err)
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("testenv: lock %s: %w", path, err)
		}
		if !said {
			fmt.Fprintf(progress, "testenv: another process is building into %s; waiting for it\n", dir)
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("testenv: wait for build lock: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// toolsDir locates the tools/ directory holding the two tool modules: next
// to this source file, or, when the binary was built with -trimpath, under
// the main module of the working directory.
func toolsDir() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		dir := filepath.Join(filepath.Dir(file), "tools")
		if isToolsDir(dir) {
			return dir, nil
		}
	}
	goBin, err := goCommand()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("testenv: locate tool modules: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("testenv: locate tool modules: source file not found and the working directory is in no module; set %s", EnvAssets)
	}
	dir := filepath.Join(filepath.Dir(gomod), "internal", "testenv", "tools")
	if !isToolsDir(dir) {
		return "", fmt.Errorf("testenv: locate tool modules: %s has no kube-apiserver and etcd modules; set %s", dir, EnvAssets)
	}
	return dir, nil
}

func isToolsDir(dir string) bool {
	for _, m := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, m, "go.mod")); err != nil {
			return false
		}
	}
	return true
}

// cacheKey names the cache directory after the versions and a hash of the
// tool modules' go.mod and go.sum.
func cacheKey(tools string) (string, error) {
	h := sha256.New()
	for _, m := range []string{"kube-apiserver", "etcd"} {
		for _, f := range []string{"go.mod", "go.sum"} {
			data, err := os.ReadFile(filepath.Join(tools, m, f))
			if err != nil {
				return "", fmt.Errorf("testenv: hash tool modules: %w", err)
			}
			fmt.Fprintf(h, "%s/%s %d\n", m, f, len(data))
			h.Write(data)
		}
	}
	sum := hex.EncodeToString(h.Sum(nil))
	return fmt.Sprintf("k8s-%s-etcd-%s-%s", KubeVersion, EtcdVersion, sum[:12]), nil
}

// goCommand returns the go command of the toolchain the environment names
// (GOROOT, which the go command sets for what it runs) if it is there, else
// the one on PATH.
func goCommand() (string, error) {
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if envtestbin.IsExecutable(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("testenv: find the go command: %w", err)
	}
	return p, nil
}

// tail returns at most the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
