// Command inspect prints who holds what in one pool, as the claims' records
// and the pods' marks say, and flags every place where they disagree. It is
// meant for an on-call engineer: it only reads (list pods and claims in the
// namespace), never writes.
//
//	KUBECONFIG=~/.kube/config go run ./examples/inspect -namespace team-a -pool warm
//
// The pool's pods are those labelled poolalloc.io/test-pool=<pool>, its
// claims the test CRD's claims (claims.test.poolalloc.io) whose
// spec.poolRef names it. A claim's record is read with the syncer, as the
// allocator reads it: the pods it holds are those allocated and not
// released. Disagreements (see Kind):
//
//   - record-without-mark: a record holds a pod whose mark is missing or
//     names another claim, or a pod not in the pool;
//   - mark-without-record: a pod is marked for a claim whose record does
//     not hold it, or for a claim that does not exist;
//   - pod-in-two-records: two claims' records hold the pod;
//   - record-near-limit: a claim's annotations total over 80% of the API
//     server's limit (syncer.MaxAnnotationsSize);
//   - record-refused: the syncer refuses the record (malformed, too large);
//     the finding carries its error.
//
// A hand-out marks the pod before it writes the record, and a release
// writes the record before it removes the mark: a pod caught in between
// shows as mark-without-record for a moment. Run again to confirm.
//
// Without KUBECONFIG there is no cluster to inspect: the command starts an
// embedded kube-apiserver and etcd (see internal/testenv), sets up a demo
// pool served by a real allocator, and inspects that, saying so in its
// output. -demo-faults edits a record and a mark by hand first, to show
// what findings look like.
//
// Flags:
//
//	-namespace   the pool's namespace (default "default")
//	-pool        the pool's name (required with KUBECONFIG)
//	-context     the kubeconfig context (default: the current one)
//	-mark-key    the pods' mark annotation (default allocator.DefaultPodMarkKey)
//	-marks=false the pool's allocator runs with WithPodMarks(false): check records only
//	-opensandbox records under syncer.OpenSandboxKeys(), in OpenSandbox's format
//	             (a pod listed twice is read as one), as allocator.WithOpenSandbox keeps them
//	-json        print the report as JSON (see Report) instead of tables
//
// Exit status: 0 when records and marks agree, 1 when there is any
// finding, 2 for a usage error or when the pool cannot be read.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
)

// Exit codes.
const (
	exitOK       = 0
	exitFindings = 1
	exitError    = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// flags are the command line.
type flags struct {
	namespace, pool, kubeContext string
	namespaceSet                 bool
	opts                         options
	asJSON, demoFaults           bool
}

// parseFlags parses args; a usage error has been reported on stderr.
func parseFlags(args []string, stderr io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: inspect [flags]   (KUBECONFIG names the cluster; without it, an embedded demo)")
		fs.PrintDefaults()
	}
	fs.StringVar(&f.namespace, "namespace", "default", "the pool's `namespace`")
	fs.StringVar(&f.pool, "pool", "", "the pool's `name` (its pods' "+testenv.PoolLabel+" label, its claims' spec.poolRef); required with KUBECONFIG")
	fs.StringVar(&f.kubeContext, "context", "", "the kubeconfig `context` (default: the current one)")
	fs.StringVar(&f.opts.MarkKey, "mark-key", allocator.DefaultPodMarkKey, "the pods' mark `annotation`")
	marks := fs.Bool("marks", true, "check pod marks; false for a pool whose allocator runs with WithPodMarks(false)")
	fs.BoolVar(&f.opts.OpenSandbox, "opensandbox", false, "read records under OpenSandbox's keys and format (allocator.WithOpenSandbox)")
	fs.BoolVar(&f.asJSON, "json", false, "print the report as JSON")
	fs.BoolVar(&f.demoFaults, "demo-faults", false, "embedded demo only: edit a record and a mark by hand before inspecting")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	fs.Visit(func(fl *flag.Flag) { f.namespaceSet = f.namespaceSet || fl.Name == "namespace" })
	usage := func(format string, args ...any) (flags, error) {
		fmt.Fprintf(stderr, "inspect: "+format+"\n", args...)
		fs.Usage()
		return f, errors.New("usage")
	}
	if fs.NArg() > 0 {
		return usage("unexpected arguments %q", fs.Args())
	}
	if *marks {
		if errs := validation.IsQualifiedName(f.opts.MarkKey); len(errs) > 0 {
			return usage("-mark-key %q is not an annotation key: %v", f.opts.MarkKey, errs)
		}
	} else {
		f.opts.MarkKey = ""
	}
	if errs := validation.IsDNS1123Label(f.namespace); len(errs) > 0 {
		return usage("-namespace %q: %v", f.namespace, errs)
	}
	if f.pool != "" {
		if errs := validation.IsValidLabelValue(f.pool); len(errs) > 0 {
			return usage("-pool %q is not a label value: %v", f.pool, errs)
		}
	}
	return f, nil
}

// run is the command: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, err := parseFlags(args, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case err != nil:
		return exitError
	}
	ctrllog.SetLogger(logr.Discard()) // envtest and controller-runtime log through it

	var rep Report
	if os.Getenv("KUBECONFIG") != "" {
		switch {
		case f.pool == "":
			fmt.Fprintln(stderr, "inspect: -pool is required (set KUBECONFIG to empty for the embedded demo)")
			return exitError
		case f.demoFaults:
			fmt.Fprintln(stderr, "inspect: -demo-faults is for the embedded demo only: it edits records by hand (unset KUBECONFIG)")
			return exitError
		}
		f.opts.Pool = types.NamespacedName{Namespace: f.namespace, Name: f.pool}
		rep, err = inspectCluster(ctx, f, stderr)
	} else {
		rep, err = demo(ctx, f, stderr)
	}
	if err != nil {
		fmt.Fprintln(stderr, "inspect:", err)
		return exitError
	}
	if f.asJSON {
		err = writeJSON(stdout, rep)
	} else {
		err = writeTable(stdout, rep)
	}
	if err != nil {
		fmt.Fprintln(stderr, "inspect:", err)
		return exitError
	}
	if len(rep.Problems) > 0 {
		return exitFindings
	}
	return exitOK
}

// inspectCluster inspects the pool on the cluster of KUBECONFIG. Unlike
// internal/cluster.Connect it installs nothing: it only reads.
func inspectCluster(ctx context.Context, f flags, stderr io.Writer) (Report, error) {
	cfg, err := config.GetConfigWithContext(f.kubeContext)
	if err != nil {
		return Report{}, err
	}
	scheme, err := testenv.NewScheme()
	if err != nil {
		return Report{}, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return Report{}, fmt.Errorf("client: %w", err)
	}
	fmt.Fprintf(stderr, "inspecting pool %s on %s\n", f.opts.Pool, cfg.Host)
	return inspect(ctx, c, f.opts)
}
