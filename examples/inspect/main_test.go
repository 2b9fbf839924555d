package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

// env is the package's API server, shared by all tests.
var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

const testPool = "p"

// fixture is a namespace of the shared API server with a pool of three
// Ready pods, p-0 to p-2, and the claims a case creates.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	pool   types.NamespacedName
	claims map[string]*testenv.Claim
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := t.Context()
	f := &fixture{t: t, ctx: ctx, claims: map[string]*testenv.Claim{},
		pool: types.NamespacedName{Namespace: env.Namespace(ctx, t), Name: testPool}}
	if _, err := testenv.CreatePods(ctx, env.Client, f.pool.Namespace, testPool, 3, true); err != nil {
		t.Fatal(err)
	}
	return f
}

// claim creates a claim of pool wanting one pod.
func (f *fixture) claim(name, pool string) *testenv.Claim {
	f.t.Helper()
	cl := testenv.NewClaim(f.pool.Namespace, name, pool, 1)
	if err := env.Client.Create(f.ctx, cl); err != nil {
		f.t.Fatal(err)
	}
	f.claims[name] = cl
	return cl
}

// annotate sets annotation key of obj to value, as a hand edit would.
func (f *fixture) annotate(obj client.Object, key, value string) {
	f.t.Helper()
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := env.Client.Patch(f.ctx, obj, client.RawPatch(types.MergePatchType, body)); err != nil {
		f.t.Fatalf("annotate %s: %v", obj.GetName(), err)
	}
}

// record writes pods, encoded by the syncer's codec, under key of claim's
// record.
func (f *fixture) record(claim, key string, pods ...string) {
	f.t.Helper()
	value, err := syncer.EncodePods(pods)
	if err != nil {
		f.t.Fatal(err)
	}
	f.annotate(f.claims[claim], key, value)
}

// markRaw sets pod's mark to value; mark sets it to name the claim.
func (f *fixture) markRaw(pod, value string) {
	f.t.Helper()
	f.annotate(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: f.pool.Namespace, Name: pod}}, allocator.DefaultPodMarkKey, value)
}

func (f *fixture) mark(pod, claim string) {
	f.t.Helper()
	f.markRaw(pod, claim+"/"+string(f.claims[claim].UID))
}

func (f *fixture) inspect(opts options) Report {
	f.t.Helper()
	opts.Pool = f.pool
	rep, err := inspect(f.ctx, env.Client, opts)
	if err != nil {
		f.t.Fatal(err)
	}
	return rep
}

// keyOf is what a test compares of a finding: kind, pod and claims.
func keyOf(p Finding) string {
	return fmt.Sprintf("%s pod=%s claims=%s", p.Kind, p.Pod, strings.Join(p.Claims, ","))
}

func findingKeys(rep Report) []string {
	keys := []string{}
	for _, p := range rep.Problems {
		keys = append(keys, keyOf(p))
	}
	return keys
}

func wantFindings(t *testing.T, rep Report, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	slices.Sort(want)
	got := findingKeys(rep)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("findings:\n  got  %q\n  want %q\nreport:\n%s", got, want, table(t, rep))
	}
}

func table(t *testing.T, rep Report) string {
	var b bytes.Buffer
	if err := writeTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func podRow(t *testing.T, rep Report, name string) PodReport {
	t.Helper()
	i := slices.IndexFunc(rep.Pods, func(p PodReport) bool { return p.Name == name })
	if i < 0 {
		t.Fatalf("no row for pod %s:\n%s", name, table(t, rep))
	}
	return rep.Pods[i]
}

// TestFindings creates each kind of disagreement by writing annotations
// directly and checks that the inspector reports exactly the findings it
// implies, naming the pod and the claims.
func TestFindings(t *testing.T) {
	def := syncer.DefaultKeys()
	tests := []struct {
		name     string
		opts     options
		marksOff bool
		setup    func(f *fixture)
		want     []string
		check    func(t *testing.T, f *fixture, rep Report)
	}{{
		name: "record holds an unmarked pod",
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.record("a", def.Allocated, "p-0")
		},
		want: []string{"record-without-mark pod=p-0 claims=a"},
	}, {
		name: "record holds a pod marked for another claim",
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.claim("b", testPool)
			f.record("a", def.Allocated, "p-0")
			f.mark("p-0", "b")
		},
		// b's record does not hold it either: the mark has no record.
		want: []string{"record-without-mark pod=p-0 claims=a", "mark-without-record pod=p-0 claims=b"},
		check: func(t *testing.T, f *fixture, rep Report) {
			p := podRow(t, rep, "p-0")
			if !slices.Equal(p.Holders, []string{"a"}) || p.MarkClaim != "b" {
				t.Errorf("p-0: holders %q, mark %q; want [a], b", p.Holders, p.MarkClaim)
			}
		},
	}, {
		name: "record holds a pod not in the pool",
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.record("a", def.Allocated, "p-9")
		},
		want: []string{"record-without-mark pod=p-9 claims=a"},
		check: func(t *testing.T, f *fixture, rep Report) {
			if p := podRow(t, rep, "p-9"); p.State != StateAbsent {
				t.Errorf("p-9: state %q, want %q", p.State, StateAbsent)
			}
		},
	}, {
		name: "pod marked for a claim whose record does not list it",
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.record("a", def.Allocated, "p-1")
			f.mark("p-1", "a")
			f.mark("p-0", "a")
		},
		want: []string{"mark-without-record pod=p-0 claims=a"},
	}, {
		name: "pod marked for a claim whose record lists it released",
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.record("a", def.Allocated, "p-0")
			f.record("a", def.Released, "p-0")
			f.mark("p-0", "a")
		},
		want: []string{"mark-without-record pod=p-0 claims=a"},
		check: func(t *testing.T, f *fixture, rep Report) {
			if d := rep.Problems[0].Detail; !strings.Contains(d, "released") {
				t.Errorf("detail %q does not say released", d)
			}
		},
	}, {
		name: "pod marked for a claim that does not exist",
		setup: func(f *fixture) {
			f.markRaw("p-2", "ghost/6c1b1bd6-0000-4000-8000-000000000000")
		},
		want: []string{"mark-without-record pod=p-2 claims=ghost"},
	}, {
		name: "pod marked for a claim recreated under its name",
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.markRaw("p-0", "a/6c1b1bd6-0000-4000-8000-000000000000")
		},
		want: []string{"mark-without-record pod=p-0 claims=a"},
		check: func(t *testing.T, f *fixture, rep Report) {
			if d := rep.Problems[0].Detail; !strings.Contains(d, "recreated") {
				t.Errorf("detail %q does not say recreated", d)
			}
		},
	}, {
		name: "pod marked for a claim of another pool",
		setup: func(f *fixture) {
			f.claim("x", "other")
			f.record("x", def.Allocated, "p-0") // not this pool's record
			f.mark("p-0", "x")
		},
		want: []string{"mark-without-record pod=p-0 claims=x"},
	}, {
		name: "mark that names no claim",
		setup: func(f *fixture) {
			f.markRaw("p-0", "nonsense")
		},
		want: []string{"mark-without-record pod=p-0 claims="},
	}, {
		name: "pod in two records",
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.claim("b", testPool)
			f.record("a", def.Allocated, "p-0")
			f.record("b", def.Allocated, "p-0", "p-1")
			f.mark("p-0", "a")
			f.mark("p-1", "b")
		},
		// The mark names a, so b's record holds p-0 without a mark too.
		want: []string{"pod-in-two-records pod=p-0 claims=a,b", "record-without-mark pod=p-0 claims=b"},
	}, {
		name: "record near the annotation limit",
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.claim("b", testPool)
			f.annotate(f.claims["a"], "example.com/notes", strings.Repeat("x", syncer.MaxAnnotationsSize*85/100))
			f.annotate(f.claims["b"], "example.com/notes", strings.Repeat("x", syncer.MaxAnnotationsSize*75/100))
		},
		want: []string{"record-near-limit pod= claims=a"},
	}, {
		name: "record the syncer refuses",
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.annotate(f.claims["a"], def.Allocated, `{"pods":["p-0"`)
			f.mark("p-0", "a")
		},
		// p-0's mark is not reported: a's record cannot say what it holds.
		want: []string{"record-refused pod= claims=a"},
		check: func(t *testing.T, f *fixture, rep Report) {
			wantErr := syncerError(t, f, "a")
			if d := rep.Problems[0].Detail; d != wantErr {
				t.Errorf("detail %q, want the syncer's error %q", d, wantErr)
			}
			if c := rep.Claims[0]; c.Error != wantErr || c.Held != nil {
				t.Errorf("claim a: error %q, held %q; want the syncer's error and null", c.Error, c.Held)
			}
			if p := podRow(t, rep, "p-0"); !p.HolderUnknown {
				t.Errorf("p-0: holder not unknown: %+v", p)
			}
		},
	}, {
		name: "release list the syncer refuses",
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.record("a", def.Allocated, "p-0")
			f.annotate(f.claims["a"], def.Release, "p-0")
			f.mark("p-0", "a")
		},
		// The rest of the record is read, as the allocator reads it.
		want: []string{"record-refused pod= claims=a"},
		check: func(t *testing.T, f *fixture, rep Report) {
			if d, wantErr := rep.Problems[0].Detail, syncerError(t, f, "a"); d != wantErr {
				t.Errorf("detail %q, want the syncer's error %q", d, wantErr)
			}
			if p := podRow(t, rep, "p-0"); !slices.Equal(p.Holders, []string{"a"}) {
				t.Errorf("p-0: holders %q, want [a]", p.Holders)
			}
		},
	}, {
		name: "allocated minus released agrees with the marks",
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.record("a", def.Allocated, "p-0", "p-1")
			f.record("a", def.Released, "p-1")
			f.record("a", def.Release, "p-0")
			f.mark("p-0", "a")
		},
		check: func(t *testing.T, f *fixture, rep Report) {
			p0, p1 := podRow(t, rep, "p-0"), podRow(t, rep, "p-1")
			if !slices.Equal(p0.Holders, []string{"a"}) || !slices.Equal(p0.ReleaseRequested, []string{"a"}) || len(p1.Holders) != 0 {
				t.Errorf("p-0 %+v, p-1 %+v; want p-0 held by a (release requested), p-1 free", p0, p1)
			}
		},
	}, {
		name: "OpenSandbox records: repeats read as one, released pods kept in alloc-status",
		opts: options{OpenSandbox: true},
		setup: func(f *fixture) {
			osk := syncer.OpenSandboxKeys()
			f.claim("a", testPool)
			f.annotate(f.claims["a"], osk.Allocated, `{"pods":["p-0","p-1","p-0"]}`)
			f.record("a", osk.Released, "p-1")
			f.mark("p-0", "a")
		},
		check: func(t *testing.T, f *fixture, rep Report) {
			if got := rep.Claims[0].Held; !slices.Equal(got, []string{"p-0"}) {
				t.Errorf("a holds %q, want [p-0]", got)
			}
			if rep.RecordKeys.Allocated != syncer.OpenSandboxKeys().Allocated {
				t.Errorf("record keys %+v", rep.RecordKeys)
			}
		},
	}, {
		name:     "without marks only records are checked",
		marksOff: true,
		setup: func(f *fixture) {
			f.claim("a", testPool)
			f.claim("b", testPool)
			f.record("a", def.Allocated, "p-0", "p-1")
			f.record("b", def.Allocated, "p-0")
			f.markRaw("p-2", "ghost/1")
		},
		want: []string{"pod-in-two-records pod=p-0 claims=a,b"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opts := tt.opts
			if !tt.marksOff {
				opts.MarkKey = allocator.DefaultPodMarkKey
			}
			f := newFixture(t)
			tt.setup(f)
			rep := f.inspect(opts)
			wantFindings(t, rep, tt.want...)
			if tt.check != nil {
				tt.check(t, f, rep)
			}
			for _, p := range rep.Problems {
				if p.Detail == "" {
					t.Errorf("finding %s has no detail", keyOf(p))
				}
			}
		})
	}
}

// syncerError is the error the syncer gives for the claim's record as
// stored.
func syncerError(t *testing.T, f *fixture, name string) string {
	t.Helper()
	cl := &testenv.Claim{}
	if err := env.Client.Get(f.ctx, client.ObjectKeyFromObject(f.claims[name]), cl); err != nil {
		t.Fatal(err)
	}
	s, err := syncer.NewAnnotationSyncer(env.Client, syncer.DefaultKeys())
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Read(cl)
	if err == nil {
		t.Fatalf("the syncer reads claim %s's record", name)
	}
	return err.Error()
}

// TestTooLarge: a claim whose annotations pass the limit (the API server
// would not store it, but a cache or a test might hand one over) is a
// record the syncer refuses, not a crash.
func TestTooLarge(t *testing.T) {
	s, err := newSyncer(env.Client, false)
	if err != nil {
		t.Fatal(err)
	}
	cl := testenv.NewClaim("ns", "a", testPool, 1)
	cl.UID = "u-a"
	cl.Annotations = map[string]string{"example.com/notes": strings.Repeat("x", syncer.MaxAnnotationsSize)}
	rep := analyze(s, options{Pool: types.NamespacedName{Namespace: "ns", Name: testPool}, MarkKey: allocator.DefaultPodMarkKey},
		nil, []testenv.Claim{*cl})
	wantFindings(t, rep, "record-near-limit pod= claims=a", "record-refused pod= claims=a")
}

// TestCleanPool: a pool served by a real allocator shows what the
// allocator's store holds and no problem, read by a user who may only get
// and list; the command exits 0 and its JSON decodes to the same report.
func TestCleanPool(t *testing.T) {
	ctx := t.Context()
	pool := types.NamespacedName{Namespace: env.Namespace(ctx, t), Name: testPool}
	if _, err := testenv.CreatePods(ctx, env.Client, pool.Namespace, pool.Name, 5, true); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int32{"a": 2, "b": 1, "c": 3} { // one short
		if err := env.Client.Create(ctx, testenv.NewClaim(pool.Namespace, name, pool.Name, want)); err != nil {
			t.Fatal(err)
		}
	}
	a, err := allocator.New(env.Client)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := world.Round(ctx, a, env.Client, pool); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := a.Store().Snapshot(pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap) != 5 {
		t.Fatalf("the allocator holds %d pods, want 5", len(snap))
	}

	reader, err := env.UserClient(ctx, "inspector", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{testenv.Group}, Resources: []string{"claims"}, Verbs: []string{"get", "list"}},
	}, pool.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := inspect(ctx, reader, options{Pool: pool, MarkKey: allocator.DefaultPodMarkKey})
	if err != nil {
		t.Fatal(err)
	}
	wantFindings(t, rep)
	if len(rep.Pods) != 5 || len(rep.Claims) != 3 {
		t.Fatalf("%d pods, %d claims; want 5, 3:\n%s", len(rep.Pods), len(rep.Claims), table(t, rep))
	}
	for _, p := range rep.Pods {
		h := snap[p.Name].Claim.Name
		if !slices.Equal(p.Holders, []string{h}) || p.MarkClaim != h || p.State != StateReady {
			t.Errorf("pod %s: holders %q, mark %q, state %s; the allocator's store says %s", p.Name, p.Holders, p.MarkClaim, p.State, h)
		}
	}

	t.Setenv("KUBECONFIG", kubeconfig(t, env.Config, env.Config.Host))
	var out, errOut bytes.Buffer
	args := []string{"-namespace", pool.Namespace, "-pool", pool.Name}
	if code := run(ctx, args, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d, want 0; stderr:\n%s\nstdout:\n%s", code, &errOut, &out)
	}
	if !strings.Contains(out.String(), "no problems") || strings.Contains(out.String(), "DEMO") {
		t.Errorf("table output:\n%s", &out)
	}
	t.Logf("table output:\n%s", &out)

	out.Reset()
	if code := run(ctx, append(args, "-json"), &out, &errOut); code != exitOK {
		t.Fatalf("-json: exit %d, want 0; stderr:\n%s", code, &errOut)
	}
	var got Report
	dec := json.NewDecoder(&out)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decode -json output: %v", err)
	}
	if !reflect.DeepEqual(got, rep) {
		t.Errorf("-json decodes to\n%+v\nwant\n%+v", got, rep)
	}
	if got.Problems == nil || got.Demo || got.MarkKey != allocator.DefaultPodMarkKey {
		t.Errorf("-json: problems %v, demo %t, mark key %q", got.Problems, got.Demo, got.MarkKey)
	}
}

// TestExitCodes: 1 for a finding (its JSON names it), 2 for usage errors
// and a cluster that cannot be reached.
func TestExitCodes(t *testing.T) {
	ctx := t.Context()
	f := newFixture(t)
	f.claim("a", testPool)
	f.mark("p-1", "a")
	t.Setenv("KUBECONFIG", kubeconfig(t, env.Config, env.Config.Host))

	var out, errOut bytes.Buffer
	args := []string{"-namespace", f.pool.Namespace, "-pool", testPool}
	if code := run(ctx, append(args, "-json"), &out, &errOut); code != exitFindings {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, &errOut)
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	wantFindings(t, rep, "mark-without-record pod=p-1 claims=a")
	out.Reset()
	if code := run(ctx, args, &out, &errOut); code != exitFindings || !strings.Contains(out.String(), "1 problem:\n  mark-without-record: pod p-1") {
		t.Errorf("exit %d, want 1; output:\n%s", code, &out)
	}

	for _, args := range [][]string{
		{"-nope"},
		{"-namespace", f.pool.Namespace},                 // no -pool
		{"-pool", testPool, "extra"},                     // an argument
		{"-pool", testPool, "-mark-key", "not a key!"},   // an invalid key
		{"-pool", testPool, "-namespace", "Not_A_Label"}, // an invalid namespace
		{"-pool", testPool, "-demo-faults"},              // edits records: demo only
	} {
		errOut.Reset()
		if code := run(ctx, args, io.Discard, &errOut); code != exitError || errOut.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a message", args, code, &errOut)
		}
	}

	// An API server that is not there.
	t.Setenv("KUBECONFIG", kubeconfig(t, env.Config, "https://127.0.0.1:1"))
	errOut.Reset()
	if code := run(ctx, args, io.Discard, &errOut); code != exitError || !strings.Contains(errOut.String(), "list pods") {
		t.Errorf("unreachable server: exit %d, stderr %q; want 2", code, &errOut)
	}
}

// TestDemo sets the demo up in namespaces of the shared API server (the
// command does it on an embedded one of its own): clean, it shows no
// problem; with -demo-faults exactly the edits it made.
func TestDemo(t *testing.T) {
	for _, tt := range []struct {
		name   string
		opts   options
		faults bool
		want   func(alphaPod, idle string) []string
	}{
		{name: "clean", opts: options{MarkKey: allocator.DefaultPodMarkKey}},
		{name: "faults", opts: options{MarkKey: allocator.DefaultPodMarkKey}, faults: true, want: func(alphaPod, idle string) []string {
			return []string{"pod-in-two-records pod=" + alphaPod + " claims=alpha,beta", "record-without-mark pod=" + alphaPod + " claims=beta",
				"mark-without-record pod=" + idle + " claims=alpha"}
		}},
		{name: "opensandbox faults", opts: options{MarkKey: allocator.DefaultPodMarkKey, OpenSandbox: true}, faults: true, want: func(alphaPod, idle string) []string {
			return []string{"pod-in-two-records pod=" + alphaPod + " claims=alpha,beta", "record-without-mark pod=" + alphaPod + " claims=beta",
				"mark-without-record pod=" + idle + " claims=alpha"}
		}},
		{name: "no marks faults", faults: true, want: func(alphaPod, _ string) []string {
			return []string{"pod-in-two-records pod=" + alphaPod + " claims=alpha,beta"}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			tt.opts.Pool = types.NamespacedName{Namespace: env.Namespace(ctx, t), Name: demoPool}
			if err := setupDemo(ctx, env.Client, tt.opts, tt.faults, io.Discard); err != nil {
				t.Fatal(err)
			}
			rep, err := inspect(ctx, env.Client, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			held := map[string]int{}
			var alphaPod, idle string
			for _, p := range rep.Pods {
				switch {
				case len(p.Holders) == 0 && p.Mark == "":
				case len(p.Holders) == 0 && idle == "":
					idle = p.Name // marked by hand
				case len(p.Holders) > 1 && alphaPod == "":
					alphaPod = p.Name // listed by beta by hand
				}
				for _, h := range p.Holders {
					held[h]++
				}
			}
			wantHeld := maps.Clone(demoClaims)
			if tt.faults {
				wantHeld["beta"]++
			}
			if len(held) != len(wantHeld) || held["alpha"] != int(wantHeld["alpha"]) || held["beta"] != int(wantHeld["beta"]) || held["gamma"] != int(wantHeld["gamma"]) {
				t.Errorf("held %v, want %v:\n%s", held, wantHeld, table(t, rep))
			}
			var want []string
			if tt.want != nil {
				if alphaPod == "" || (tt.opts.MarkKey != "" && idle == "") {
					t.Fatalf("no pod in two records or no marked idle pod:\n%s", table(t, rep))
				}
				want = tt.want(alphaPod, idle)
			}
			wantFindings(t, rep, want...)
		})
	}
}

// kubeconfig writes a kubeconfig file for cfg's credentials at server.
func kubeconfig(t *testing.T, cfg *rest.Config, server string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["env"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData,
		ClientCertificate: cfg.CertFile, ClientKey: cfg.KeyFile, Token: cfg.BearerToken,
	}
	kc.Contexts["env"] = &clientcmdapi.Context{Cluster: "env", AuthInfo: "admin"}
	kc.CurrentContext = "env"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
