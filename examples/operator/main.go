// Command operator is a small, complete pool operator built on poolalloc
// and controller-runtime, meant to be forked: a manager with its cache, a
// reconciler per Pool that runs an allocator round over the pool's pods and
// claims listed from the cache, creates the pods the pool lacks, deletes the
// pods its claims give back (allocator.RecycleDelete) and forgets a deleted
// pool; leader election, health and readiness probes, metrics, graceful
// shutdown.
//
//	go run ./examples/operator                       # embedded API server and a demo
//	KUBECONFIG=~/.kube/config go run ./examples/operator -leader-election-namespace poolalloc-system
//
// Its API is package api/v1 (group test.poolalloc.io/v1), served by the
// CRDs in config/crd: a Pool keeps at least spec.replicas pods and grows to
// serve its claims; a Claim names its pool in spec.poolRef and wants
// spec.replicas pods (higher spec.priority first when the pool is short); a
// claim's owner gives pods back through the release annotation
// (syncer.DefaultKeys().Release). The pool's pods are labelled
// poolalloc.io/test-pool=<pool> and owned by it. operator.go holds the
// operator (Setup); replace the API and the pod template (newPod) with
// yours. config/rbac is the RBAC it needs, and no more (rbac_test.go runs
// it as a ServiceAccount bound to those rules only):
//
//	kubectl apply -k examples/operator/config   # CRDs, namespace poolalloc-system, ServiceAccount, RBAC
//
// Without KUBECONFIG it starts an embedded kube-apiserver and etcd
// (embedded.go, through controller-runtime's envtest; the binaries come
// from KUBEBUILDER_ASSETS, else from setup-envtest's store, else, inside
// the poolalloc repository, from its test harness, built once and cached),
// creates a namespace for its leader election lease and a demo namespace,
// and runs, beside the operator, a fake kubelet (package fakekubelet:
// nothing else would make pods Ready) and a demo (demo.go) that creates a
// Pool and Claims, changes them over time and prints who holds what, for
// -demo-duration. With KUBECONFIG it creates nothing: the CRDs must be
// installed, and it runs the operator until SIGTERM or Ctrl-C.
//
// Fork it: copy this directory into your module, replace the import path
// github.com/poolalloc/poolalloc/examples/operator with your own, rename
// the API, and run go test ./... with KUBEBUILDER_ASSETS set (or after
// setup-envtest use 1.37.2); nothing here imports poolalloc's internal
// packages, and fork_test.go checks that a copy builds and passes its
// tests outside this repository.
//
// Flags:
//
//	-metrics-bind-address        metrics endpoint (default ":8080"; "0" disables)
//	-health-probe-bind-address   /healthz and /readyz (default ":8081"; "0" disables)
//	-leader-elect                leader election (default true)
//	-leader-election-namespace   namespace of the lease (default: the pod's own in a
//	                             cluster; the embedded mode creates poolalloc-system)
//	-leader-election-id          name of the lease (default "poolalloc-operator")
//	-namespace                   watch only this namespace (default: all; the
//	                             embedded demo runs in it, default "demo")
//	-resync                      how often an idle pool is looked at (default 30s)
//	-full-resync                 how often a pool's round lists it whole instead of
//	                             taking its events (default 10m)
//	-demo-duration               embedded mode: how long the demo runs once the API
//	                             server is up (default 20s; 0: until signalled)
//	-v                           log verbosity (0: info; 1: per-pool details)
//
// Exit status: 0 after the demo, or after a signal once shut down; 1 on an
// error; 2 on a usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolalloc/poolalloc/allocator/follow"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// flags are the command line.
type flags struct {
	metricsAddr   string
	probeAddr     string
	leaderElect   bool
	leaseNS       string
	leaseID       string
	namespace     string
	resync        time.Duration
	fullResync    time.Duration
	demoDuration  time.Duration
	verbosity     int
	namespaceSeen bool
}

func parseFlags(args []string, stderr io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080", `address of the metrics endpoint; "0" disables it`)
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", `address of /healthz and /readyz; "0" disables them`)
	fs.BoolVar(&f.leaderElect, "leader-elect", true, "run only while holding the leader election lease")
	fs.StringVar(&f.leaseNS, "leader-election-namespace", "", "namespace of the lease (default: the pod's own namespace in a cluster; poolalloc-system, created, in embedded mode)")
	fs.StringVar(&f.leaseID, "leader-election-id", "poolalloc-operator", "name of the lease")
	fs.StringVar(&f.namespace, "namespace", "", `watch only this namespace (default: all; in embedded mode the demo's, default "demo")`)
	fs.DurationVar(&f.resync, "resync", DefaultResync, "how often a pool is reconciled when nothing happens to it")
	fs.DurationVar(&f.fullResync, "full-resync", follow.DefaultResync, "how often a pool's round lists it whole instead of taking its events")
	fs.DurationVar(&f.demoDuration, "demo-duration", 20*time.Second, "embedded mode: how long the demo runs once the API server is up; 0 runs until signalled")
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.resync <= 0 || f.fullResync <= 0 || f.demoDuration < 0 || f.verbosity < 0 {
		return f, errors.New("-resync and -full-resync must be positive, -demo-duration and -v not negative")
	}
	fs.Visit(func(fl *flag.Flag) { f.namespaceSeen = f.namespaceSeen || fl.Name == "namespace" })
	return f, nil
}

// run runs the command and returns its exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "operator:", err)
		return exitUsage
	}
	ctrllog.SetLogger(newLogger(stderr, f.verbosity)) // controller-runtime (and envtest) log through it
	if os.Getenv("KUBECONFIG") == "" {
		err = runEmbedded(ctx, f, stdout, stderr)
	} else {
		err = runCluster(ctx, f)
	}
	if err != nil {
		fmt.Fprintln(stderr, "operator:", err)
		return exitError
	}
	return exitOK
}

// runCluster runs the operator on the cluster of KUBECONFIG until ctx ends.
// It creates nothing there.
func runCluster(ctx context.Context, f flags) error {
	cfg, err := config.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	mc := f.managerConfig()
	if f.namespace != "" {
		mc.Namespaces = []string{f.namespace}
	}
	mgr, err := NewManager(cfg, mc)
	if err != nil {
		return err
	}
	if err := Setup(mgr, Options{Resync: f.resync, FullResync: f.fullResync}); err != nil {
		return err
	}
	return mgr.Start(ctx) // returns when ctx ends, after a graceful shutdown
}

// managerConfig is the manager's part of the flags.
func (f flags) managerConfig() ManagerConfig {
	return ManagerConfig{
		MetricsAddr:    f.metricsAddr,
		ProbeAddr:      f.probeAddr,
		LeaderElection: f.leaderElect,
		LeaseNamespace: f.leaseNS,
		LeaseID:        f.leaseID,
	}
}

// newLogger logs text lines to w up to verbosity: logr's V(n) is slog's
// level -n, printed as "V<n>".
func newLogger(w io.Writer, verbosity int) logr.Logger {
	return logr.FromSlogHandler(slog.NewTextHandler(w, &slog.HandlerOptions{
		Level: slog.Level(-verbosity),
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if l, ok := a.Value.Any().(slog.Level); ok && a.Key == slog.LevelKey && l < slog.LevelInfo {
				a.Value = slog.StringValue(fmt.Sprintf("V%d", -l))
			}
			return a
		},
	}))
}
