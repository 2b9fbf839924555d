package allocator_test

// The multi-allocator property test (issue 9, item 6), shared by the run on
// controller-runtime's fake client (property_multi_fake_test.go) and the run
// on a real API server (property_multi_envtest_test.go).
//
// One history is one namespace with two pools, p1 and p2, their pods and
// claims, and one to three allocator instances on the same API server, each
// with its own client, recycler and strategy, all on one fake clock. rapid
// draws a sequence of steps:
//
//   - the world: claims created, scaled, deleted (gracefully or by force),
//     pods released by their owner (the release annotation), pods added,
//     made unready or ready, deleted, or recreated under the same name (a
//     new UID), a claim's pool reference changed while no allocator runs;
//   - the allocators: a round by any of them (Round, or Update with what
//     changed since its last view) on a listing that is fresh or lags the
//     server by any number of writes (pods and claims independently, drawn
//     from a history of listings taken after every write; none that was
//     superseded a quarantine ago or more, the lag the allocator's contract
//     allows), two rounds at
//     once in two goroutines (two allocators on one pool, or two pools), a
//     crash (the instance is dropped), a crash in the middle of a round
//     (every request after the k-th write fails), a late joiner (a new
//     instance), the clock advanced, the recycler holding, finishing or
//     deleting pods, and pod marks switched on for an operator that ran
//     without them;
//   - strategies: algorithm.Packed, algorithm.Spread, and Packed behind a
//     wrapper that sorts or reverses in.Candidates in place.
//
// The checks (EXCL, I7, I11, I13 on the server after every step and right
// after every allocator write, liveness at the end of a history) are
// described in property_multi_checks_test.go; everything they tolerate,
// and every situation the actions leave out, is listed with its reason in
// property_multi_exempt_test.go.
//
// Files: this one has the machine, its world and the action table; the
// actions are in property_multi_actions_test.go, the faults it injects in
// property_multi_faults_test.go, the checks and the exemptions in the
// files named above. The runs are property_multi_fake_test.go and
// property_multi_envtest_test.go.
//
// Replays. A failure is reported by the kinds of invariant it broke (the
// details are logged), so that a replay fails alike. Two instances with one
// writer each that run at once are interleaved request by request in a
// drawn order; other concurrent rounds (one instance, parallel writers, or
// drawn "free") run as the Go scheduler lets them, and the allocator's own
// map order varies from run to run, so a history may not fail again on
// replay and rapid may then stop shrinking it early. Draws of an index do
// not depend on the length of what they index, so that such a replay stays
// close. Failing histories of the current allocator are kept, named, under
// testdata/rapid/TestPropertyMultiFake/.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/syncer"
)

const (
	// mmMaxAllocators is how many allocator instances may run at once.
	mmMaxAllocators = 3
	// mmSettleRounds is how many rounds per pool the survivor gets at the
	// end of a history before liveness is checked.
	mmSettleRounds = 12
	// mmSnapshots is how many listings of pods (and of claims) a history
	// keeps for lagging rounds.
	mmSnapshots     = 24
	mmKeepFinalizer = "test.poolalloc.io/keep"
	mmPodFinalizer  = "test.poolalloc.io/hold"
)

var (
	mmPools    = []string{"p1", "p2"}
	errCrashed = errors.New("allocator process crashed")
	mmMarkKey  = allocator.DefaultPodMarkKey
	// mmRecordKey are the record keys of the history being run, and
	// mmOpenSandbox whether its allocators run WithOpenSandbox (set when
	// a machine starts, before any round).
	mmRecordKey   = syncer.DefaultKeys()
	mmOpenSandbox bool
)

// mmWorld is one history's view of an API server.
type mmWorld struct {
	// raw is the test's own client; base is wrapped by each allocator's
	// interceptor. Both see the same server.
	raw  client.Client
	base client.WithWatch
	ns   string
	// fakeUIDs is set when the server assigns no UIDs.
	fakeUIDs bool
	cleanup  func()
}

// mmBackend makes a fresh world for each history.
type mmBackend func(ctx context.Context, id int) (mmWorld, error)

// mmStats counts what all histories of a test did.
type mmStats struct {
	histories, steps, rounds, updates, lagging, concurrent, twoAllocators,
	crashes, midCrashes, joins, moves, recreates, writes, checks atomic.Int64
	// exempted counts what the exemptions and limits let pass.
	exempted mmExemptCounts
}

func (s *mmStats) String() string {
	return fmt.Sprintf("%d histories, %d steps, %d rounds (%d Update, %d on a lagging listing, %d concurrent pairs, %d of them two allocators on one pool), "+
		"%d allocator writes checked (%d state checks), %d crashes (%d mid-round), %d late joiners, %d claims moved, %d pods recreated",
		s.histories.Load(), s.steps.Load(), s.rounds.Load(), s.updates.Load(), s.lagging.Load(), s.concurrent.Load(), s.twoAllocators.Load(),
		s.writes.Load(), s.checks.Load(), s.crashes.Load(), s.midCrashes.Load(), s.joins.Load(), s.moves.Load(), s.recreates.Load()) +
		"; exemptions and limits relied on: " + s.exempted.String()
}

// mmAlloc is one allocator instance (one process).
type mmAlloc struct {
	id      int
	algo    string
	writers int
	// migrate is whether it runs WithPodMarkMigration.
	migrate bool
	a       allocator.Allocator
	// seen is, per pool, what the instance was last given: the base of
	// the Changes of an Update.
	seen map[string]*mmSeen
	// crashAt is the number of writes the instance still makes before it
	// crashes; negative for never. dead is set once it crashed: every
	// request fails from then on.
	crashAt atomic.Int64
	dead    atomic.Bool
}

type mmSeen struct {
	pods   map[string]string    // name → resourceVersion
	claims map[types.UID]string // uid → resourceVersion
}

// mmPair is a claim and a pod name.
type mmPair struct {
	claim types.UID
	pod   string
}

// mmPod and mmClaim are the server's state as the checks read it.
type mmPod struct {
	name, pool  string
	uid         types.UID
	ready       bool
	terminating bool
	mark        string
}

type mmClaim struct {
	name        string
	uid         types.UID
	pool        string
	want        int
	terminating bool
	finalizers  int
	rv          string
	held        []string
	released    []string
	release     []string
	// listed is every pod the record lists, held or released, each once
	// (WithOpenSandbox: Want bounds their number).
	listed []string
	err    error
}

func (c *mmClaim) mark() string { return c.name + "/" + string(c.uid) }

// mmState is one read of the namespace: pods and claims.
type mmState struct {
	pods      map[string]*mmPod
	claims    []*mmClaim // by name
	byUID     map[types.UID]*mmClaim
	podList   []corev1.Pod
	claimList []testenv.Claim
}

func (st *mmState) holders() map[string][]*mmClaim {
	out := make(map[string][]*mmClaim)
	for _, c := range st.claims {
		for _, p := range c.held {
			out[p] = append(out[p], c)
		}
	}
	return out
}

type mmMachine struct {
	t     *rapid.T
	ctx   context.Context
	w     mmWorld
	stats *mmStats
	clock *clocktesting.FakeClock
	marks bool
	steps int

	allocs []*mmAlloc
	nextID int
	ids    int // claims created
	uids   int // UIDs made up (fake client)
	podSeq map[string]int
	// podPool is the pool of every pod name ever created.
	podPool map[string]string
	// cur is the server as read after the last step.
	cur *mmState
	// printed holds what was last logged per claim and pod.
	printed map[string]string

	// sched, when set, interleaves two rounds' requests in a drawn order.
	// Set and cleared by the test goroutine while no round runs.
	sched *mmSched

	// writeMu serializes the allocators' writes with the checks that
	// follow them, so that a check sees the state right after its write.
	// Taken before mu.
	writeMu sync.Mutex
	// last is the last read of the server. writeMu guards it while rounds
	// run.
	last *mmState

	// mu guards the fields below, used from the allocators' goroutines
	// (interceptor and recycler).
	mu         sync.Mutex
	violations []mmViolation
	journal    []string // what the allocators wrote, logged after the step
	podSnaps   []mmPodSnap
	claimSnaps []mmClaimSnap
	// dirty holds pods (by UID) seen with an uncertain holder (I13).
	dirty map[types.UID]mmDirty
	// mmExemptState is what the exemptions remember
	// (property_multi_exempt_test.go).
	mmExemptState
	recMode   mmRecycleMode
	recFinish map[string]bool
	// acts counts the allocators' writes and recycler calls.
	acts atomic.Int64
	// hist is the history as logged, for POOLALLOC_MULTI_DUMP.
	histMu sync.Mutex
	hist   strings.Builder
}

func newMMMachine(t *rapid.T, backend mmBackend, stats *mmStats, id int) *mmMachine {
	ctx := context.Background()
	w, err := backend(ctx, id)
	if err != nil {
		t.Fatalf("world: %v", err)
	}
	m := &mmMachine{
		t: t, ctx: ctx, w: w, stats: stats,
		clock:         clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		podSeq:        make(map[string]int),
		podPool:       make(map[string]string),
		printed:       make(map[string]string),
		dirty:         make(map[types.UID]mmDirty),
		mmExemptState: newMMExemptState(),
		recFinish:     make(map[string]bool),
	}
	m.marks = rapid.IntRange(0, 3).Draw(t, "pod marks off if 3") != 3
	mmOpenSandbox = rapid.IntRange(0, 3).Draw(t, "OpenSandbox mode if 3") == 3
	mmRecordKey = syncer.DefaultKeys()
	if mmOpenSandbox {
		mmRecordKey = syncer.OpenSandboxKeys()
	}
	m.recMode = mmRecycleMode(rapid.IntRange(0, 2).Draw(t, "recycler"))
	for _, pool := range mmPools {
		for range rapid.IntRange(1, 5).Draw(t, "pods of "+pool) {
			m.createPod(pool, "", true)
		}
	}
	for range rapid.IntRange(0, 3).Draw(t, "initial claims") {
		m.createClaim(t)
	}
	n := 1
	if !m.limitUnfencedOneProcess() {
		n = rapid.IntRange(1, mmMaxAllocators).Draw(t, "allocators")
	}
	for range n {
		m.startAllocator(t)
	}
	m.logf("world: namespace %s, pod marks %t, recycler %s", w.ns, m.marks, m.recMode)
	return m
}

func (m *mmMachine) fatalf(format string, args ...any) {
	m.t.Helper()
	if mmDumpFile != "" {
		m.logf("FAILED: "+format, args...)
		m.dumpHistory()
	}
	m.t.Fatalf(format, args...)
}

func (m *mmMachine) must(err error, what string) {
	m.t.Helper()
	if err != nil {
		m.fatalf("%s: %v", what, err)
	}
}

func parseMarkUID(v string) types.UID {
	i := strings.LastIndexByte(v, '/')
	if i < 0 {
		return ""
	}
	return types.UID(v[i+1:])
}

func mmDecode(obj client.Object) (held, released, release []string, err error) {
	ann := obj.GetAnnotations()
	var lists [3][]string
	for i, k := range [...]string{mmRecordKey.Allocated, mmRecordKey.Released, mmRecordKey.Release} {
		if lists[i], err = syncer.DecodePods(ann[k]); err != nil {
			return nil, nil, nil, fmt.Errorf("claim %s: %s: %w", obj.GetName(), k, err)
		}
	}
	held = syncer.Record{Allocated: lists[0], Released: lists[1]}.Held()
	slices.Sort(held)
	released = slices.Sorted(slices.Values(lists[1]))
	release = slices.Sorted(slices.Values(lists[2]))
	return held, released, release, nil
}

// readState reads the namespace from the server.
func (m *mmMachine) readState() (*mmState, error) { return m.read(true, true) }

// read lists the namespace's pods, or claims, or both; what it does not
// list it takes from the last read, which is as good as a list when only
// one allocator write happened since: writes and reads are serialized.
// Call it with m.writeMu held, or while no round runs.
func (m *mmMachine) read(pods, claims bool) (*mmState, error) {
	var podList []corev1.Pod
	var claimList []testenv.Claim
	if pods || m.last == nil {
		var list corev1.PodList
		if err := m.w.raw.List(m.ctx, &list, client.InNamespace(m.w.ns)); err != nil {
			return nil, fmt.Errorf("list pods: %w", err)
		}
		podList = list.Items
	} else {
		podList = m.last.podList
	}
	if claims || m.last == nil {
		var list testenv.ClaimList
		if err := m.w.raw.List(m.ctx, &list, client.InNamespace(m.w.ns)); err != nil {
			return nil, fmt.Errorf("list claims: %w", err)
		}
		claimList = list.Items
	} else {
		claimList = m.last.claimList
	}
	st := newMMState(podList, claimList)
	m.last = st
	m.mu.Lock()
	m.noteMayGo(st)
	m.noteExposed(st)
	m.mu.Unlock()
	return st, nil
}

// newMMState indexes a listing. The lists are not modified afterwards.
func newMMState(pods []corev1.Pod, claims []testenv.Claim) *mmState {
	st := &mmState{
		pods:      make(map[string]*mmPod, len(pods)),
		byUID:     make(map[types.UID]*mmClaim, len(claims)),
		podList:   pods,
		claimList: claims,
	}
	for i := range pods {
		p := &pods[i]
		st.pods[p.Name] = &mmPod{
			name: p.Name, pool: p.Labels[testenv.PoolLabel], uid: p.UID,
			ready: allocator.PodReady(p), terminating: p.DeletionTimestamp != nil,
			mark: p.Annotations[mmMarkKey],
		}
	}
	for i := range claims {
		cl := &claims[i]
		c := &mmClaim{
			name: cl.Name, uid: cl.UID, pool: cl.Spec.PoolRef, want: int(cl.Spec.Replicas),
			terminating: cl.DeletionTimestamp != nil, finalizers: len(cl.Finalizers), rv: cl.ResourceVersion,
		}
		c.held, c.released, c.release, c.err = mmDecode(cl)
		if c.err == nil {
			all, _ := syncer.DecodePods(cl.Annotations[mmRecordKey.Allocated])
			c.listed = slices.Compact(slices.Sorted(slices.Values(slices.Concat(all, c.released))))
		}
		st.claims = append(st.claims, c)
		st.byUID[c.uid] = c
	}
	slices.SortFunc(st.claims, func(a, b *mmClaim) int { return strings.Compare(a.name, b.name) })
	return st
}

// logf logs a line of the history. With POOLALLOC_MULTI_DUMP set to a
// file name, the lines of the first history that fails are also written
// there as it ran, before shrinking: a failing history may not fail again
// on replay (see Replays above).
func (m *mmMachine) logf(format string, args ...any) {
	m.t.Helper()
	m.t.Logf(format, args...)
	if mmDumpFile != "" {
		m.histMu.Lock()
		fmt.Fprintf(&m.hist, format+"\n", args...)
		m.histMu.Unlock()
	}
}

var (
	mmDumpFile = os.Getenv("POOLALLOC_MULTI_DUMP")
	mmDumpOnce sync.Once
)

// dumpHistory writes the history to POOLALLOC_MULTI_DUMP, once per run.
func (m *mmMachine) dumpHistory() {
	if mmDumpFile == "" {
		return
	}
	mmDumpOnce.Do(func() {
		m.histMu.Lock()
		defer m.histMu.Unlock()
		_ = os.WriteFile(mmDumpFile, []byte(m.hist.String()), 0o644)
	})
}

func (m *mmMachine) logState(st *mmState) {
	for _, c := range st.claims {
		line := fmt.Sprintf("claim %s (%s) pool %s want %d terminating %t finalizers %d rv %s: held %v released %v release %v",
			c.name, c.uid, c.pool, c.want, c.terminating, c.finalizers, c.rv, c.held, c.released, c.release)
		if m.printed["c/"+c.name] != line {
			m.printed["c/"+c.name] = line
			m.logf("  %s", line)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(st.pods)) {
		p := st.pods[name]
		line := fmt.Sprintf("pod %s (%s) ready %t terminating %t mark %q", p.name, p.uid, p.ready, p.terminating, p.mark)
		if m.printed["p/"+name] != line {
			m.printed["p/"+name] = line
			m.logf("  %s", line)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.printed)) {
		if n, ok := strings.CutPrefix(name, "p/"); ok && st.pods[n] == nil {
			delete(m.printed, name)
			m.logf("  pod %s gone", n)
		}
		if n, ok := strings.CutPrefix(name, "c/"); ok && !slices.ContainsFunc(st.claims, func(c *mmClaim) bool { return c.name == n }) {
			delete(m.printed, name)
			m.logf("  claim %s gone", n)
		}
	}
}

func (m *mmMachine) startAllocator(t *rapid.T) *mmAlloc {
	al := &mmAlloc{id: m.nextID + 1, seen: make(map[string]*mmSeen)}
	m.nextID++
	al.crashAt.Store(-1)
	al.algo = rapid.SampledFrom([]string{"packed", "spread", "reverse", "sort"}).Draw(t, "algorithm")
	al.writers = 1
	if rapid.IntRange(0, 2).Draw(t, "parallel writes if 2") == 2 {
		al.writers = rapid.IntRange(2, 4).Draw(t, "writers")
	}
	opts := []allocator.Option{
		allocator.WithClock(m.clock),
		allocator.WithRecycler(m.recycler(al)),
		allocator.WithAlgorithm(mmAlgorithms[al.algo]),
		allocator.WithWriteConcurrency(al.writers),
		allocator.WithClaimType(&testenv.Claim{}),
	}
	if mmOpenSandbox {
		opts = append(opts, allocator.WithOpenSandbox())
	}
	if !m.marks {
		opts = append(opts, allocator.WithPodMarks(false))
	} else if rapid.IntRange(0, 3).Draw(t, "mark migration if 3") == 3 {
		// Poolalloc writes no record that migration would believe over
		// a mark: it changes nothing in these histories.
		opts = append(opts, allocator.WithPodMarkMigration(true))
		al.migrate = true
	}
	a, err := allocator.New(m.clientFor(al), opts...)
	m.must(err, "allocator.New")
	al.a = a
	m.allocs = append(m.allocs, al)
	m.logf("start allocator a%d (%s, %d writers, migration %t, OpenSandbox %t)", al.id, al.algo, al.writers, al.migrate, mmOpenSandbox)
	return al
}

// pickAlloc draws a live allocator, starting one if none runs.
func (m *mmMachine) pickAlloc(t *rapid.T) *mmAlloc {
	if len(m.allocs) == 0 {
		m.stats.joins.Add(1)
		return m.startAllocator(t)
	}
	return m.allocs[index(t, len(m.allocs), "allocator index")]
}

// index draws an index into a list of n elements. The draw does not
// depend on n, so that a replay in which the allocators did a little
// differently (concurrent rounds run free) still draws the same.
func index(t *rapid.T, n int, label string) int {
	return rapid.IntRange(0, 63).Draw(t, label) % n
}

func (m *mmMachine) pickPool(t *rapid.T) string { return rapid.SampledFrom(mmPools).Draw(t, "pool") }

func (m *mmMachine) actions() map[string]func(*rapid.T) {
	// rapid picks map actions with a bias toward the first keys, so the
	// machine draws its own, uniformly, from this weighted table.
	var table []string
	fs := make(map[string]func(*rapid.T))
	for _, a := range []struct {
		name   string
		weight int
		f      func(*rapid.T)
	}{
		{"round", 8, m.round},
		{"createClaim", 3, m.createClaim},
		{"scaleClaim", 3, m.scaleClaim},
		{"releasePods", 2, m.releasePods},
		{"deleteClaim", 1, m.deleteClaim},
		{"forceDeleteClaim", 1, m.forceDeleteClaim},
		{"moveClaim", 1, m.moveClaim},
		{"addPods", 2, m.addPods},
		{"podReadiness", 2, m.podReadiness},
		{"deletePod", 1, m.deletePod},
		{"recreatePod", 2, m.recreatePod},
		{"concurrentRounds", 4, m.concurrentRounds},
		{"crash", 1, m.crash},
		{"crashMidRound", 2, m.crashMidRound},
		{"lateJoiner", 2, m.lateJoiner},
		{"advanceClock", 2, m.advanceClock},
		{"recycler", 1, m.setRecycler},
		{"recyclerFinish", 1, m.recyclerFinish},
		{"enableMarks", 1, m.enableMarks},
	} {
		fs[a.name] = a.f
		for range a.weight {
			table = append(table, a.name)
		}
	}
	return map[string]func(*rapid.T){
		"": m.check,
		"step": func(t *rapid.T) {
			m.t = t
			bits := rapid.SliceOfN(rapid.Bool(), 6, 6).Draw(t, "action bits")
			i := 0
			for _, b := range bits {
				i <<= 1
				if b {
					i |= 1
				}
			}
			name := table[i%len(table)]
			m.logf("> %s", name)
			fs[name](t)
			m.steps++
			m.stats.steps.Add(1)
		},
	}
}

// runMultiProperty runs the machine under rapid.Check and logs the counts.
// exact is set for a world on the fake client (see keptReplays).
func runMultiProperty(t *testing.T, backend mmBackend, minSteps int, exact bool) {
	stats := &mmStats{}
	start := time.Now()
	var id atomic.Int64
	t.Cleanup(func() {
		t.Logf("property %s: %v in %s (histories of at least %d steps but for a few that stop early)", t.Name(), stats, time.Since(start).Round(time.Millisecond), minSteps)
	})
	rapid.Check(keptReplays{T: t, exact: exact}, func(rt *rapid.T) {
		m := newMMMachine(rt, backend, stats, int(id.Add(1)))
		defer m.w.cleanup()
		defer m.stopAll()
		actions := m.actions()
		// Repeat runs until the minimum is reached, or rarely
		// stops early: draws that shrink to "stop" let a failure at the
		// end of a history shrink to a short one.
		for m.steps < minSteps {
			rt.Repeat(actions)
			stop := true
			for range 3 {
				stop = stop && rapid.IntRange(0, 3).Draw(rt, "stop early if all 0") == 0
			}
			if stop {
				break
			}
		}
		m.settle(rt)
		stats.histories.Add(1)
	})
}

// stopAll marks every instance dead, so that nothing of a failed history
// writes on.
func (m *mmMachine) stopAll() {
	for _, al := range m.allocs {
		al.dead.Store(true)
	}
}
