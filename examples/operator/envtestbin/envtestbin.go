// Package envtestbin finds the kube-apiserver and etcd binaries that
// controller-runtime's envtest runs, where setup-envtest installed them:
//
//	go run sigs.k8s.io/controller-runtime/tools/setup-envtest@latest use 1.37.2
//
// puts them in setup-envtest's default store, and SetupEnvtest(ctx,
// KubeVersion) then returns their directory, as long as kube-apiserver
// reports that version and etcd a 3.x from 3.5 on. The operator example's
// embedded API server looks there when KUBEBUILDER_ASSETS is not set, and
// so does poolalloc's own test harness before it builds binaries.
//
//	if dir, ok := envtestbin.SetupEnvtest(ctx, envtestbin.KubeVersion); ok {
//		env.BinaryAssetsDirectory = dir
//	}
package envtestbin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// KubeVersion is the Kubernetes version the operator example is tested
// against, the kube-apiserver poolalloc's test harness builds (its tool
// modules pin the same version).
const KubeVersion = "v1.37.2"

// EnvAssets is the environment variable that names a directory holding
// kube-apiserver and etcd; envtest reads it, and it overrides any lookup.
const EnvAssets = "KUBEBUILDER_ASSETS"

// versionTimeout bounds a binary's --version.
const versionTimeout = 10 * time.Second

// SetupEnvtest returns the directory of the binaries setup-envtest
// installed for kubeVersion (vMAJOR.MINOR.PATCH) on this platform, in its
// default store (envtest.SetupEnvtestDefaultBinaryAssetsDirectory), if they
// fit: kube-apiserver reports exactly kubeVersion, and etcd a 3.x version
// from 3.5 on (what kube-apiserver 1.37 supports). ok is false when the
// store has no such directory or its binaries do not fit.
func SetupEnvtest(ctx context.Context, kubeVersion string) (dir string, ok bool) {
	store, err := envtest.SetupEnvtestDefaultBinaryAssetsDirectory()
	if err != nil {
		return "", false
	}
	dir = filepath.Join(store, strings.TrimPrefix(kubeVersion, "v")+"-"+runtime.GOOS+"-"+runtime.GOARCH)
	if !HasBinaries(dir) {
		return "", false
	}
	kube, err := BinaryVersion(ctx, filepath.Join(dir, "kube-apiserver"), "Kubernetes ")
	if err != nil || kube != kubeVersion {
		return "", false
	}
	etcd, err := BinaryVersion(ctx, filepath.Join(dir, "etcd"), "etcd Version: ")
	if err != nil || !etcdFits(etcd) {
		return "", false
	}
	return dir, true
}

// BinaryVersion runs bin --version and returns what follows prefix on the
// first line that starts with it, with a leading "v" added if missing:
// prefix "Kubernetes " for kube-apiserver, "etcd Version: " for etcd.
func BinaryVersion(ctx context.Context, bin, prefix string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			v = strings.TrimSpace(v)
			if !strings.HasPrefix(v, "v") {
				v = "v" + v
			}
			return v, nil
		}
	}
	return "", fmt.Errorf("%s --version: no line starting with %q", bin, prefix)
}

// etcdFits reports whether v (vMAJOR.MINOR.PATCH) is etcd 3.5 or a later 3.x.
func etcdFits(v string) bool {
	var major, minor, patch int
	if n, err := fmt.Sscanf(v, "v%d.%d.%d", &major, &minor, &patch); err != nil || n != 3 {
		return false
	}
	return major == 3 && minor >= 5
}

// HasBinaries reports whether dir holds executable kube-apiserver and etcd
// files.
func HasBinaries(dir string) bool {
	return IsExecutable(filepath.Join(dir, "kube-apiserver")) && IsExecutable(filepath.Join(dir, "etcd"))
}

// IsExecutable reports whether path is a regular file with an execute bit.
func IsExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
