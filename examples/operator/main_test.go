package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	poolv1 "github.com/poolalloc/poolalloc/examples/operator/api/v1"
)

// The command is tested as a user runs it: built, started as a process,
// stopped with SIGTERM.

var build struct {
	once sync.Once
	bin  string
	err  error
}

// binary builds the command once per test process.
func binary(t *testing.T) string {
	t.Helper()
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "poolalloc-operator-test-")
		if err != nil {
			build.err = err
			return
		}
		build.bin = filepath.Join(dir, "operator")
		out, err := exec.Command("go", "build", "-o", build.bin, ".").CombinedOutput()
		if err != nil {
			build.err = errors.Join(err, errors.New(string(out)))
		}
	})
	require.NoError(t, build.err, "go build")
	return build.bin
}

// command starts the binary with args and KUBECONFIG as given, its output
// captured.
type command struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{}
	err            error // set when done is closed
}

func start(t *testing.T, kubeconfig string, args ...string) *command {
	t.Helper()
	c := &command{cmd: exec.Command(binary(t), args...), done: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
	require.NoError(t, c.cmd.Start())
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", c.stdout.String(), c.stderr.String())
		}
	})
	return c
}

// wait waits for the process to exit and returns its exit code.
func (c *command) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(timeout):
		require.Fail(t, "the operator did not exit")
	}
	var exit *exec.ExitError
	if errors.As(c.err, &exit) {
		return exit.ExitCode()
	}
	require.NoError(t, c.err)
	return 0
}

// TestKubeconfigMode runs the command on the test API server through a
// kubeconfig, as against a cluster: it serves a claim, holds its lease,
// creates nothing but pods, and on SIGTERM shuts down, gives the lease up
// and exits 0.
func TestKubeconfigMode(t *testing.T) {
	ctx := t.Context()
	ns := env.namespace(ctx, t)
	h := &harness{t: t, ctx: ctx, c: env.Client, ns: ns, pool: "p"}
	h.startKubelet()
	op := start(t, writeKubeconfig(t),
		"-namespace", ns, "-leader-election-namespace", ns, "-leader-election-id", "op-test",
		"-metrics-bind-address", "0", "-health-probe-bind-address", "0")

	require.NoError(t, h.c.Create(ctx, poolv1.NewPool(ns, h.pool, 1)))
	require.NoError(t, h.c.Create(ctx, poolv1.NewClaim(ns, "a", h.pool, 2)))
	h.eventually("claim served", func(s snap) bool { return s.served() && s.live() == 2 })
	var lease coordinationv1.Lease
	require.NoError(t, h.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "op-test"}, &lease))
	require.NotEmpty(t, ptrValue(lease.Spec.HolderIdentity), "the running operator holds the lease")

	require.NoError(t, op.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, exitOK, op.wait(t, waitFor), "exit code after SIGTERM")
	require.NoError(t, h.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "op-test"}, &lease))
	require.Empty(t, ptrValue(lease.Spec.HolderIdentity), "the lease is given up on shutdown")
	require.NotContains(t, op.stdout.String(), "embedded")
}

// TestEmbeddedDemo runs the command without KUBECONFIG, as `go run
// ./examples/operator` does: its own API server, the operator, the fake
// kubelet and the demo, whose every step must be served; it exits 0 when
// the demo's time is up.
func TestEmbeddedDemo(t *testing.T) {
	op := start(t, "", "-demo-duration", "8s", "-metrics-bind-address", "0", "-health-probe-bind-address", "0")
	require.Equal(t, exitOK, op.wait(t, 2*time.Minute), "exit code")
	out := op.stdout.String()
	for _, want := range []string{"alpha scales up to 3", "beta swaps", "gamma is deleted", "delta wants 3 pods of class large", "epsilon wants 3 pods spread", "scales down to 2", "all steps done", "demo over"} {
		require.Contains(t, out, want)
	}
	require.Equal(t, 8, strings.Count(out, "served in"), "every step served")
	// epsilon's three pods: no zone it is in holds two more than another
	// (which zones the pool had pods in when it was served depends on
	// timing).
	i := strings.Index(out, "epsilon holds ")
	require.GreaterOrEqual(t, i, 0)
	line := out[i : i+strings.Index(out[i:], "\n")]
	lo, hi := 3, 0
	for _, z := range []string{"zone-a", "zone-b", "zone-c"} {
		if n := strings.Count(line, z); n > 0 {
			lo, hi = min(lo, n), max(hi, n)
		}
	}
	require.LessOrEqual(t, hi-lo, 1, "epsilon's pods: %s", line)
	require.Equal(t, 3, strings.Count(line, " in zone-"), "epsilon's pods: %s", line)
}

// writeKubeconfig writes a kubeconfig for the test API server's admin.
func writeKubeconfig(t *testing.T) string {
	t.Helper()
	cfg := env.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientCertificate: cfg.CertFile,
		ClientKeyData: cfg.KeyData, ClientKey: cfg.KeyFile, Token: cfg.BearerToken,
	}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

func ptrValue(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
