package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/poolalloc/poolalloc/examples/operator/envtestbin"
)

// forkModule is the module the fork test copies the example into.
const forkModule = "example.com/fork"

// TestFork forks the example as a user would: it copies this directory
// into a scratch module outside the repository, replaces the example's
// import path with the module's own, requires poolalloc (replaced by this
// repository, as a release would be fetched), and checks that
// `go mod tidy`, `go build ./...`, `go vet ./...` and `go test ./...`
// succeed there, with the API server binaries of KUBEBUILDER_ASSETS
// (findBinaries). No package of the fork imports poolalloc's internal
// packages or the original example, and its build compiles no API server
// or etcd. The go commands use the environment's GOPROXY and module cache
// (a warm cache needs no network; the repository's go.sum is copied so
// that no checksum is looked up).
//
// It skips outside the poolalloc repository (in a fork) and with -short:
// the fork's own tests start an API server of their own and take about a
// minute on two cores.
func TestFork(t *testing.T) {
	root, ok := moduleRoot(".", poolallocModule)
	if !ok {
		t.Skip("not inside the poolalloc repository: this is a fork already")
	}
	if testing.Short() {
		t.Skip("-short: the fork's go test ./... takes a minute")
	}
	ctx := t.Context()
	assets, _, err := findBinaries(ctx, nil)
	require.NoError(t, err)

	dir := filepath.Join(t.TempDir(), "fork")
	require.False(t, strings.HasPrefix(dir, root+string(filepath.Separator)), "scratch module %s is inside the repository", dir)
	copyFork(t, ".", dir)
	gosum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), gosum, 0o644))

	artifacts, runs := t.ArtifactDir(), 0
	run := func(args ...string) string {
		t.Helper()
		start := time.Now()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", envtestbin.EnvAssets+"="+assets)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		t.Logf("go %s: %s", strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond))
		// Every command's whole output is kept: in the test's artifact
		// directory (go test -artifacts keeps it), and in the failure
		// message, so that a failure of the fork's own tests shows all
		// of them.
		runs++
		logFile := filepath.Join(artifacts, fmt.Sprintf("%02d-go-%s.log", runs, args[0]))
		require.NoError(t, os.WriteFile(logFile, out.Bytes(), 0o644))
		require.NoError(t, err, "go %s in %s (output also in %s):\n%s", strings.Join(args, " "), dir, logFile, out.String())
		return out.String()
	}
	run("mod", "init", forkModule)
	run("mod", "edit", "-require="+poolallocModule+"@v0.0.0", "-replace="+poolallocModule+"="+root)
	run("mod", "tidy")
	run("build", "./...")
	run("vet", "./...")

	imports := run("list", "-f", "{{.ImportPath}}:{{range .Imports}} {{.}}{{end}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}", "./...")
	for line := range strings.Lines(imports) {
		for _, imp := range strings.Fields(line)[1:] {
			require.False(t, strings.HasPrefix(imp, poolallocModule+"/internal") || strings.HasPrefix(imp, poolallocModule+"/examples"),
				"the fork's %s imports %s", strings.Fields(line)[0], imp)
		}
	}
	for dep := range strings.Lines(run("list", "-deps", "./...")) {
		for _, heavy := range []string{"k8s.io/kubernetes/", "k8s.io/apiserver/", "go.etcd.io/etcd/server/"} {
			require.False(t, strings.HasPrefix(dep, heavy), "the fork's build compiles %s", strings.TrimSpace(dep))
		}
	}
	out := run("test", "-count=1", "-timeout=10m", "./...")
	t.Logf("the fork's go test ./...:\n%s", out)
}

// copyFork copies the directory src to dst, replacing the example's import
// path with forkModule in Go files.
func copyFork(t *testing.T, src, dst string) {
	t.Helper()
	const path = poolallocModule + "/examples/operator"
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.HasSuffix(p, ".go") {
			data = bytes.ReplaceAll(data, []byte(path), []byte(forkModule))
		}
		return os.WriteFile(target, data, 0o644)
	})
	require.NoError(t, err, "copy %s to %s", src, dst)
}
