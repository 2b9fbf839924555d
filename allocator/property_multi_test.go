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
// Checked on the server, after every step and, from an interceptor on the
// allocators' clients, right after every write an allocator makes (writes
// and checks are serialized by a mutex, so a check sees the state of that
// instant):
//
//   - EXCL: no pod name is held (allocated minus released) by two claims'
//     records.
//   - I11 (pod marks on): every pod a record holds that exists carries a
//     mark naming that claim. Excluded: a name the record held when the test
//     recreated the pod, and records written before marks were switched on.
//   - I13 (pod marks on): a pod seen, after a step, marked for a claim whose
//     record held it under that mark and now lists it neither held nor
//     released, or marked for a claim that does not exist, or held by a
//     record without its mark, is uncertain; it must go through the
//     recycler (or be deleted) before another claim's record holds it. A
//     mark whose claim's record never listed the pod exposed it to no one
//     (an allocator unmarking its own hand-out whose record write failed),
//     and a pod recycled under its current mark stays clean while it
//     carries that mark (DESIGN I13 asks for a recycle before reuse; a
//     record may still list the pod when it is recycled).
//   - EXCL and I13 make one exception: a record may name a pod that was
//     deleted and recreated under that name since the record got it; the
//     name no longer denotes the pod it got (a pod is its name and UID).
//     EXCL exempts it only where the allocator that handed the new pod to
//     another claim could not see the record naming it: the record's claim
//     moved to another pool, or the allocator's claim listing did not show
//     that record. An allocator whose listing shows it must not hand the
//     new pod out while the record names it.
//   - I7 (no swap): a live claim's record stops holding a pod that exists,
//     is ready and (with marks) still carries its mark only if the pod was,
//     at some point seen, in the owner's release annotation, beyond the
//     claim's want, lost, not marked for it, of another pool, or recreated
//     (checked right after each claim write).
//
// At the end of each history all allocators but one stop; the survivor runs
// rounds on fresh listings of both pools, the clock advancing past
// allocator.DefaultQuarantine each time, with the recycler finishing everything,
// for mmSettleRounds rounds per pool (fewer once three in a row wrote and
// recycled nothing). Then (liveness): every live claim holds at most what it
// wants, a claim that holds less has no ready pod of its pool left unheld
// and unmarked, no pod is marked for a claim whose record does not hold it,
// every record holds only pods of its claim's current pool, a terminating
// claim holds nothing, and I11 holds with only the recreation exemption.
// The allocator must not panic either.
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
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/poolalloc/poolalloc/algorithm"
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
}

func (s *mmStats) String() string {
	return fmt.Sprintf("%d histories, %d steps, %d rounds (%d Update, %d on a lagging listing, %d concurrent pairs, %d of them two allocators on one pool), "+
		"%d allocator writes checked (%d state checks), %d crashes (%d mid-round), %d late joiners, %d claims moved, %d pods recreated",
		s.histories.Load(), s.steps.Load(), s.rounds.Load(), s.updates.Load(), s.lagging.Load(), s.concurrent.Load(), s.twoAllocators.Load(),
		s.writes.Load(), s.checks.Load(), s.crashes.Load(), s.midCrashes.Load(), s.joins.Load(), s.moves.Load(), s.recreates.Load())
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

// mmDirty says a pod (by UID) was seen with an uncertain holder: claim,
// the one it was uncertain for, and why.
type mmDirty struct {
	claim types.UID
	why   string
}

// mmRecycleMode is what the recycler does.
type mmRecycleMode int

const (
	recycleDone   mmRecycleMode = iota // reports done at once
	recycleHold                        // reports not done until told
	recycleDelete                      // deletes the pod (UID precondition)
)

func (r mmRecycleMode) String() string {
	return [...]string{"done", "hold", "delete"}[r]
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

// mmViolation is a broken invariant: kind names it (the failure message,
// kept free of resourceVersions and timing so that a replay fails alike),
// text says what and where.
type mmViolation struct{ kind, text string }

// failWith logs the violations and ends the history with their kinds.
func (m *mmMachine) failWith(vs []mmViolation) {
	m.t.Helper()
	if len(vs) == 0 {
		return
	}
	var kinds []string
	for _, v := range vs {
		m.logf("VIOLATION %s", v.text)
		if !slices.Contains(kinds, v.kind) {
			kinds = append(kinds, v.kind)
		}
	}
	slices.Sort(kinds)
	m.fatalf("%s", strings.Join(kinds, "; "))
}

// mmPodSnap and mmClaimSnap are listings kept for lagging rounds; sig
// tells one from the next.
// A snapshot is a listing as it was after a write. superseded is when a
// newer one was taken (zero while it is the newest): a listing lags by the
// time since then, and the allocator's contract bounds that lag by
// allocator.DefaultQuarantine, so older ones are not drawn.
type mmPodSnap struct {
	sig        string
	pods       []corev1.Pod
	superseded time.Time
}

type mmClaimSnap struct {
	sig        string
	claims     []testenv.Claim
	superseded time.Time
}

// usable counts the newest snapshots (of n) that lag less than a
// Quarantine at now.
func usable(n int, now time.Time, superseded func(i int) time.Time) int {
	k := 0
	for i := n - 1; i >= 0; i-- {
		if s := superseded(i); !s.IsZero() && !now.Before(s.Add(allocator.DefaultQuarantine)) {
			break
		}
		k++
	}
	return max(k, 1)
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
	// exposed maps a pod (by UID) to the claim whose record held it under
	// its current mark (see noteExposed).
	exposed map[types.UID]types.UID
	// recycledUnder maps a pod (by UID) to the mark it carried when it was
	// last recycled, while it still carries it.
	recycledUnder map[types.UID]string
	// exemptRecreate: the record held the name when the test recreated
	// the pod. exemptPremark: the record was written without pod marks.
	exemptRecreate map[mmPair]bool
	exemptPremark  map[mmPair]bool
	// exemptStale: an exemptRecreate pair that EXCL exempts for as long
	// as the record names the pod: its claim moved pools since, or another
	// claim's record got the new pod from an allocator whose claim listing
	// did not show this record naming it (it could not know; see
	// checkState).
	exemptStale map[mmPair]bool
	// listing is, per allocator in a round, the listing the round works
	// on.
	listing map[*mmAlloc]*mmListing
	// mayGo holds the pods a claim's record may stop holding without its
	// owner's say (I7): seen in its release annotation, while it held more
	// than it wanted or was terminating, lost (gone, unready, terminating),
	// not marked for it (pod marks on), of another pool, or recreated.
	mayGo     map[mmPair]bool
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
		clock:          clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		podSeq:         make(map[string]int),
		podPool:        make(map[string]string),
		printed:        make(map[string]string),
		dirty:          make(map[types.UID]mmDirty),
		exposed:        make(map[types.UID]types.UID),
		recycledUnder:  make(map[types.UID]string),
		exemptRecreate: make(map[mmPair]bool),
		exemptPremark:  make(map[mmPair]bool),
		exemptStale:    make(map[mmPair]bool),
		listing:        make(map[*mmAlloc]*mmListing),
		mayGo:          make(map[mmPair]bool),
		recFinish:      make(map[string]bool),
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
	if m.marks {
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

// ---- reading the server ----

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

// noteExposed keeps, per pod, the claim whose record held it under its
// current mark. A mark whose claim's record never listed the pod (a
// hand-out whose record write failed or never came) exposed the pod to no
// one: removing it leaves the pod as clean as it was when marked. Every
// record change the allocators make is read here (the interceptor reads
// after each write), so no exposure goes unseen. m.mu held.
func (m *mmMachine) noteExposed(st *mmState) {
	for _, pod := range st.pods {
		if c, ok := m.exposed[pod.uid]; ok && (pod.mark == "" || parseMarkUID(pod.mark) != c) {
			delete(m.exposed, pod.uid)
		}
		if mark, ok := m.recycledUnder[pod.uid]; ok && mark != pod.mark {
			delete(m.recycledUnder, pod.uid)
		}
	}
	for _, c := range st.claims {
		for _, p := range c.held {
			if pod := st.pods[p]; pod != nil && pod.mark == c.mark() {
				m.exposed[pod.uid] = c.uid
			}
		}
	}
}

// noteMayGo adds to mayGo what st shows. m.mu held.
func (m *mmMachine) noteMayGo(st *mmState) {
	for _, c := range st.claims {
		for _, p := range c.release {
			m.mayGo[mmPair{c.uid, p}] = true
		}
		for _, p := range c.held {
			pod := st.pods[p]
			if c.terminating || len(c.held) > c.want || pod == nil || !pod.ready || pod.terminating ||
				m.marks && pod.mark != c.mark() || m.podPool[p] != c.pool {
				m.mayGo[mmPair{c.uid, p}] = true
			}
		}
	}
}

// checkDrops checks I7 between two states: a live claim's record stops
// holding a pod only for a reason in mayGo. m.mu held.
func (m *mmMachine) checkDrops(old, st *mmState, where string) []mmViolation {
	var out []mmViolation
	if old == nil {
		return nil
	}
	for _, c := range st.claims {
		was := old.byUID[c.uid]
		if c.terminating || was == nil {
			continue
		}
		for _, p := range was.held {
			if slices.Contains(c.held, p) || m.mayGo[mmPair{c.uid, p}] {
				continue
			}
			if pod := st.pods[p]; pod == nil || !pod.ready || pod.terminating || m.marks && pod.mark != c.mark() {
				continue // lost, or not (or no longer) marked for it
			}
			out = append(out, mmViolation{"I7: a claim lost a pod it held, wanted and did not release",
				fmt.Sprintf("I7 %s: the record of %s (want %d) no longer holds pod %s, which is ready, still its (by mark, with marks) and not released by its owner",
					where, c.name, c.want, p)})
		}
	}
	return out
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

func maxRV[T any](items []T, rv func(*T) string) string {
	var top uint64
	for i := range items {
		if v, _ := strconv.ParseUint(rv(&items[i]), 10, 64); v > top {
			top = v
		}
	}
	return strconv.Itoa(len(items)) + "@" + strconv.FormatUint(top, 10)
}

// snapshot appends st's listings to the history if they changed. m.mu held.
func (m *mmMachine) snapshot(st *mmState) {
	psig := maxRV(st.podList, func(p *corev1.Pod) string { return p.ResourceVersion })
	if n := len(m.podSnaps); n == 0 || m.podSnaps[n-1].sig != psig {
		if n > 0 {
			m.podSnaps[n-1].superseded = m.clock.Now()
		}
		m.podSnaps = append(m.podSnaps, mmPodSnap{sig: psig, pods: st.podList})
		if len(m.podSnaps) > mmSnapshots {
			m.podSnaps = slices.Delete(m.podSnaps, 0, 1)
		}
	}
	csig := maxRV(st.claimList, func(c *testenv.Claim) string { return c.ResourceVersion })
	if n := len(m.claimSnaps); n == 0 || m.claimSnaps[n-1].sig != csig {
		if n > 0 {
			m.claimSnaps[n-1].superseded = m.clock.Now()
		}
		m.claimSnaps = append(m.claimSnaps, mmClaimSnap{sig: csig, claims: st.claimList})
		if len(m.claimSnaps) > mmSnapshots {
			m.claimSnaps = slices.Delete(m.claimSnaps, 0, 1)
		}
	}
}

// ---- checks ----

// checkState checks EXCL, I11 and I13 on st. m.mu held. writer is the
// allocator whose write st follows, nil after a step.
func (m *mmMachine) checkState(st *mmState, where string, writer *mmAlloc) []mmViolation {
	var out []mmViolation
	holders := st.holders()
	for _, p := range slices.Sorted(maps.Keys(holders)) {
		// A record may still name a pod that was deleted and recreated
		// under that name: the name no longer denotes the pod the record
		// got (a pod is its name and UID). An allocator that does not
		// see the record naming it may hand the new pod out before the
		// name is dropped from the record: the old pool of a claim moved
		// to another pool, which cannot list the claim, or an allocator
		// whose claim listing lags behind the record (a documented
		// limit, README "Many allocators"). An allocator whose listing
		// shows the record naming the pod must not.
		cs := slices.DeleteFunc(slices.Clone(holders[p]), func(c *mmClaim) bool {
			pair := mmPair{c.uid, p}
			if !m.exemptRecreate[pair] {
				return false
			}
			if c.pool != m.podPool[p] || m.exemptStale[pair] {
				return true
			}
			if len(holders[p]) > 1 && writer != nil && !m.listing[writer].names(c.uid, p) {
				m.exemptStale[pair] = true
				return true
			}
			return false
		})
		if len(cs) > 1 {
			names := make([]string, len(cs))
			for i, c := range cs {
				names[i] = c.name
			}
			out = append(out, mmViolation{"EXCL: a pod is held by two records", fmt.Sprintf("EXCL %s: pod %s is held by the records of %v at once", where, p, names)})
		}
	}
	for _, c := range st.claims {
		if c.err != nil {
			out = append(out, mmViolation{"a record is unreadable", fmt.Sprintf("%s: record unreadable: %v", where, c.err)})
		}
	}
	if !m.marks {
		return out
	}
	for _, c := range st.claims {
		for _, p := range c.held {
			pod := st.pods[p]
			if pod == nil {
				continue
			}
			if pair := (mmPair{c.uid, p}); pod.mark != c.mark() && !m.exemptRecreate[pair] && !m.exemptPremark[pair] {
				out = append(out, mmViolation{"I11: a record holds a pod whose mark names another claim or none",
					fmt.Sprintf("I11 %s: the record of %s holds pod %s, whose mark is %q", where, c.name, p, pod.mark)})
			}
			if d, ok := m.dirty[pod.uid]; ok && d.claim != c.uid && !m.exemptRecreate[mmPair{c.uid, p}] {
				out = append(out, mmViolation{"I13: an uncertain pod went to another claim unrecycled",
					fmt.Sprintf("I13 %s: the record of %s holds pod %s, whose holder was uncertain (%s) and which was not recycled since", where, c.name, p, d.why)})
			}
		}
	}
	return out
}

// observe updates the uncertain pods (I13) and the I11 exemptions after a
// step. m.mu held.
func (m *mmMachine) observe(st *mmState) {
	for pair := range m.exemptRecreate {
		if c := st.byUID[pair.claim]; c == nil || !slices.Contains(c.held, pair.pod) {
			delete(m.exemptRecreate, pair)
			delete(m.exemptStale, pair)
		}
	}
	for pair := range m.exemptPremark {
		c, pod := st.byUID[pair.claim], st.pods[pair.pod]
		if c == nil || !slices.Contains(c.held, pair.pod) || pod != nil && pod.mark == c.mark() {
			delete(m.exemptPremark, pair)
		}
	}
	if !m.marks {
		return
	}
	uids := make(map[types.UID]bool, len(st.pods))
	for _, pod := range st.pods {
		uids[pod.uid] = true
	}
	for uid := range m.dirty {
		if !uids[uid] {
			delete(m.dirty, uid) // deleted: a pod under that name is a new one
		}
	}
	holders := st.holders()
	for _, name := range slices.Sorted(maps.Keys(st.pods)) {
		pod := st.pods[name]
		hs := holders[name]
		if pod.mark != "" {
			uid := parseMarkUID(pod.mark)
			c := st.byUID[uid]
			switch {
			case c != nil && slices.Contains(c.held, name) && len(hs) == 1:
				delete(m.dirty, pod.uid) // held and marked: certain
			case m.recycledUnder[pod.uid] == pod.mark:
				// recycled under this mark already
			case c == nil:
				m.setDirty(pod, uid, "marked for "+pod.mark+", a claim that does not exist")
			case !slices.Contains(c.held, name) && !slices.Contains(c.released, name) && m.exposed[pod.uid] == c.uid:
				m.setDirty(pod, uid, "marked for "+c.name+", whose record held it and no longer lists it")
			}
		}
		for _, c := range hs {
			if pod.mark != c.mark() && !m.exemptRecreate[mmPair{c.uid, name}] {
				m.setDirty(pod, c.uid, fmt.Sprintf("held by the record of %s, marked %q", c.name, pod.mark))
			}
		}
	}
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

func (m *mmMachine) setDirty(pod *mmPod, claim types.UID, why string) {
	if _, ok := m.dirty[pod.uid]; !ok {
		m.dirty[pod.uid] = mmDirty{claim: claim, why: why}
	}
}

// failOnViolations ends the history if an interceptor found a violation.
func (m *mmMachine) failOnViolations() {
	m.t.Helper()
	m.mu.Lock()
	vs, journal := m.violations, m.journal
	m.violations, m.journal = nil, nil
	m.mu.Unlock()
	for _, j := range journal {
		m.logf("    %s", j)
	}
	m.failWith(vs)
}

// check is the "" action: the invariants after every step.
func (m *mmMachine) check(t *rapid.T) {
	m.t = t
	t.Helper()
	m.failOnViolations()
	st, err := m.readState()
	m.must(err, "read state")
	m.mu.Lock()
	m.snapshot(st)
	vs := m.checkState(st, "after the step", nil)
	m.observe(st)
	m.mu.Unlock()
	m.stats.checks.Add(1)
	m.cur = st
	m.logState(st)
	m.failWith(vs)
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

// ---- allocators ----

// mmMutating is a faulty strategy: it reorders in.Candidates in place, then
// plans like Packed.
type mmMutating struct{ reverse bool }

func (s mmMutating) Plan(in algorithm.Input) (algorithm.Action, error) {
	if s.reverse {
		slices.Reverse(in.Candidates)
	} else {
		slices.SortFunc(in.Candidates, func(a, b algorithm.Candidate) int { return strings.Compare(b.Name, a.Name) })
	}
	return algorithm.Packed{}.Plan(in)
}

var mmAlgorithms = map[string]algorithm.Algorithm{
	"packed":  algorithm.Packed{},
	"spread":  algorithm.Spread{},
	"reverse": mmMutating{reverse: true},
	"sort":    mmMutating{},
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

func (m *mmMachine) dropAllocator(al *mmAlloc, why string) {
	al.dead.Store(true)
	m.allocs = slices.DeleteFunc(m.allocs, func(x *mmAlloc) bool { return x == al })
	m.stats.crashes.Add(1)
	m.logf("allocator a%d stops (%s)", al.id, why)
}

func (m *mmMachine) clientFor(al *mmAlloc) client.WithWatch {
	alive := func() error {
		if al.dead.Load() {
			return errCrashed
		}
		return nil
	}
	// write runs one write of al, unless it crashes now, and checks the
	// state right after it.
	write := func(obj client.Object, verb string, do func() error) error {
		defer m.sched.enter(al)()
		if err := alive(); err != nil {
			return err
		}
		if al.crashAt.Load() >= 0 && al.crashAt.Add(-1) < 0 {
			al.dead.Store(true)
			return errCrashed
		}
		m.writeMu.Lock()
		defer m.writeMu.Unlock()
		if err := do(); err != nil {
			return err
		}
		m.afterWrite(al, obj, verb)
		return nil
	}
	return interceptor.NewClient(m.w.base, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			defer m.sched.enter(al)()
			if err := alive(); err != nil {
				return err
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			defer m.sched.enter(al)()
			if err := alive(); err != nil {
				return err
			}
			return c.List(ctx, list, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return write(obj, "patch", func() error { return c.Patch(ctx, obj, patch, opts...) })
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return write(obj, "update", func() error { return c.Update(ctx, obj, opts...) })
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return write(obj, "delete", func() error { return c.Delete(ctx, obj, opts...) })
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			return write(obj, "create", func() error { return c.Create(ctx, obj, opts...) })
		},
	})
}

// afterWrite journals a write of al and checks the state right after it.
// m.writeMu held.
func (m *mmMachine) afterWrite(al *mmAlloc, obj client.Object, verb string) {
	m.stats.writes.Add(1)
	m.acts.Add(1)
	var what string
	switch o := obj.(type) {
	case *corev1.Pod:
		what = fmt.Sprintf("pod %s mark %q rv %s", o.Name, o.Annotations[mmMarkKey], o.ResourceVersion)
	default:
		held, released, _, err := mmDecode(obj)
		what = fmt.Sprintf("claim %s rv %s held %v released %v finalizers %v", obj.GetName(), obj.GetResourceVersion(), held, released, obj.GetFinalizers())
		if err != nil {
			what += fmt.Sprintf(" (%v)", err)
		}
	}
	_, isPod := obj.(*corev1.Pod)
	old := m.last
	st, err := m.read(isPod, !isPod)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.journal = append(m.journal, fmt.Sprintf("a%d %s %s", al.id, verb, what))
	if err != nil {
		m.violations = append(m.violations, mmViolation{"read state", fmt.Sprintf("read state after a%d's write: %v", al.id, err)})
		return
	}
	m.stats.checks.Add(1)
	m.snapshot(st)
	where := fmt.Sprintf("right after a%d's %s of %s", al.id, verb, what)
	m.violations = append(m.violations, m.checkState(st, where, al)...)
	m.violations = append(m.violations, m.checkDrops(old, st, where)...)
}

func (m *mmMachine) recycler(al *mmAlloc) allocator.Recycler {
	return func(ctx context.Context, req allocator.RecycleRequest) (bool, error) {
		pool, name := req.Pool, req.Pod
		defer m.sched.enter(al)()
		if al.dead.Load() {
			return false, errCrashed
		}
		m.acts.Add(1)
		m.mu.Lock()
		mode, finish := m.recMode, m.recFinish[name]
		m.mu.Unlock()
		if mode == recycleHold && !finish {
			m.mu.Lock()
			m.journal = append(m.journal, fmt.Sprintf("a%d recycle %s: not yet", al.id, name))
			m.mu.Unlock()
			return false, nil
		}
		var pod corev1.Pod
		err := m.w.raw.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: name}, &pod)
		if err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		found := err == nil
		if found && mode == recycleDelete {
			m.writeMu.Lock()
			err := m.w.raw.Delete(ctx, &pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
			if err == nil {
				m.afterRecycleDelete(al, name)
			}
			m.writeMu.Unlock()
			if err != nil && !apierrors.IsNotFound(err) {
				return false, err
			}
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if found {
			delete(m.dirty, pod.UID)
			if mark := pod.Annotations[mmMarkKey]; mark != "" {
				// Recycled under its mark: that mark, until removed,
				// makes the pod uncertain no more (DESIGN I13: an
				// uncertain pod is recycled before it is handed out).
				m.recycledUnder[pod.UID] = mark
			}
		}
		delete(m.recFinish, name)
		m.journal = append(m.journal, fmt.Sprintf("a%d recycle %s: done (%s)", al.id, name, mode))
		return true, nil
	}
}

// afterRecycleDelete snapshots the pods after the recycler deleted one.
// m.writeMu held.
func (m *mmMachine) afterRecycleDelete(al *mmAlloc, name string) {
	st, err := m.read(true, false)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.violations = append(m.violations, mmViolation{"read state", fmt.Sprintf("read state after a%d's recycler deleted %s: %v", al.id, name, err)})
		return
	}
	m.snapshot(st)
	m.violations = append(m.violations, m.checkState(st, fmt.Sprintf("right after a%d's recycler deleted %s", al.id, name), al)...)
}

// ---- listings and rounds ----

// mmListing is a round's input before it is built: one pool's view.
type mmListing struct {
	pool         string
	pods         []corev1.Pod
	claims       []testenv.Claim
	unstructured bool
	what         string
}

// names reports whether the listing shows claim uid's record holding pod.
func (l *mmListing) names(uid types.UID, pod string) bool {
	if l == nil {
		return false
	}
	for i := range l.claims {
		if c := &l.claims[i]; c.UID == uid {
			held, _, _, err := mmDecode(c)
			return err == nil && slices.Contains(held, pod)
		}
	}
	return false
}

func filterPool(pool string, pods []corev1.Pod, claims []testenv.Claim) ([]corev1.Pod, []testenv.Claim) {
	var ps []corev1.Pod
	for i := range pods {
		if pods[i].Labels[testenv.PoolLabel] == pool {
			ps = append(ps, *pods[i].DeepCopy())
		}
	}
	var cs []testenv.Claim
	for i := range claims {
		if claims[i].Spec.PoolRef == pool {
			cs = append(cs, *claims[i].DeepCopy())
		}
	}
	return ps, cs
}

// drawListing draws a fresh or lagging listing of pool for al. Without pod
// marks an allocator's first round of a pool gets a fresh listing: nothing
// fences a recovery from stale records then (a documented limit of
// WithPodMarks(false)).
func (m *mmMachine) drawListing(t *rapid.T, al *mmAlloc, pool string) mmListing {
	l := mmListing{pool: pool, what: "fresh"}
	unstr := rapid.Bool().Draw(t, "unstructured claims")
	if !rapid.Bool().Draw(t, "lagging listing") || (!m.marks && al.seen[pool] == nil) {
		st, err := m.readState()
		m.must(err, "list")
		l.pods, l.claims = filterPool(pool, st.podList, st.claimList)
		l.unstructured = unstr
		return l
	}
	m.mu.Lock()
	pods, claims := m.podSnaps, m.claimSnaps
	m.mu.Unlock()
	// Drawn from a fixed range, so that a replay whose concurrent rounds
	// wrote a little differently draws the same.
	now := m.clock.Now()
	pl := min(rapid.IntRange(0, mmSnapshots-1).Draw(t, "pod listing lag"),
		usable(len(pods), now, func(i int) time.Time { return pods[i].superseded })-1)
	cl := min(rapid.IntRange(0, mmSnapshots-1).Draw(t, "claim listing lag"),
		usable(len(claims), now, func(i int) time.Time { return claims[i].superseded })-1)
	l.pods, l.claims = filterPool(pool, pods[len(pods)-1-pl].pods, claims[len(claims)-1-cl].claims)
	l.unstructured = unstr
	l.what = fmt.Sprintf("pods %d and claims %d listings behind", pl, cl)
	if mmDumpFile != "" {
		// The listing itself, for the dump of a failing history.
		var b strings.Builder
		for _, p := range l.pods {
			fmt.Fprintf(&b, " %s@%s(%s,%q)", p.Name, p.ResourceVersion, p.UID, p.Annotations[mmMarkKey])
		}
		b.WriteString(" |")
		for _, c := range l.claims {
			held, released, _, _ := mmDecode(&c)
			fmt.Fprintf(&b, " %s@%s(want %d held %v released %v)", c.Name, c.ResourceVersion, c.Spec.Replicas, held, released)
		}
		l.what += ":" + b.String()
	}
	if pl > 0 || cl > 0 {
		m.stats.lagging.Add(1)
	}
	return l
}

func (m *mmMachine) freshListing(pool string) mmListing {
	st, err := m.readState()
	m.must(err, "list")
	l := mmListing{pool: pool, what: "fresh"}
	l.pods, l.claims = filterPool(pool, st.podList, st.claimList)
	return l
}

func (m *mmMachine) claimOf(cl *testenv.Claim, unstr bool) allocator.Claim {
	c := allocator.Claim{Object: cl, Want: int(cl.Spec.Replicas), Priority: cl.Spec.Priority}
	if unstr {
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cl)
		m.must(err, "to unstructured")
		u := &unstructured.Unstructured{Object: obj}
		u.SetGroupVersionKind(testenv.ClaimGVK)
		c.Object = u
	}
	return c
}

// mmRound is one round to run.
type mmRound struct {
	al     *mmAlloc
	l      mmListing
	update bool
	res    allocator.Result
	err    error
	// panicked holds what the allocator panicked with, and where.
	panicked string
}

func (m *mmMachine) prepare(t *rapid.T, al *mmAlloc, l mmListing) *mmRound {
	r := &mmRound{al: al, l: l}
	r.update = al.seen[l.pool] != nil && rapid.IntRange(0, 2).Draw(t, "Update unless 0") > 0
	return r
}

// run runs r; it may run on another goroutine. It returns what the
// instance was given, for the next Update.
func (m *mmMachine) run(r *mmRound) *mmSeen {
	defer func() {
		// A panic on another goroutine would end the test binary before
		// rapid could shrink it: logRound reports it.
		if p := recover(); p != nil {
			r.panicked = fmt.Sprintf("%v\n%s", p, debug.Stack())
		}
	}()
	pool := types.NamespacedName{Namespace: m.w.ns, Name: r.l.pool}
	m.mu.Lock()
	m.listing[r.al] = &r.l
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.listing, r.al)
		m.mu.Unlock()
	}()
	seen := &mmSeen{pods: make(map[string]string), claims: make(map[types.UID]string)}
	claims := make([]allocator.Claim, len(r.l.claims))
	for i := range r.l.claims {
		claims[i] = m.claimOf(&r.l.claims[i], r.l.unstructured)
		seen.claims[r.l.claims[i].UID] = r.l.claims[i].ResourceVersion
	}
	for i := range r.l.pods {
		seen.pods[r.l.pods[i].Name] = r.l.pods[i].ResourceVersion
	}
	if !r.update {
		r.res, r.err = r.al.a.Round(m.ctx, allocator.Input{Pool: pool, Pods: r.l.pods, Claims: claims})
	} else {
		old := r.al.seen[r.l.pool]
		ch := allocator.Changes{Pool: pool}
		for i := range r.l.pods {
			if p := &r.l.pods[i]; old.pods[p.Name] != p.ResourceVersion {
				ch.Pods = append(ch.Pods, *p)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(old.pods)) {
			if _, ok := seen.pods[name]; !ok {
				ch.DeletedPods = append(ch.DeletedPods, name)
			}
		}
		for i, c := range claims {
			if old.claims[c.Object.GetUID()] != r.l.claims[i].ResourceVersion {
				ch.Claims = append(ch.Claims, c)
			}
		}
		for _, uid := range slices.Sorted(maps.Keys(old.claims)) {
			if _, ok := seen.claims[uid]; !ok {
				ch.DeletedClaims = append(ch.DeletedClaims, uid)
			}
		}
		r.res, r.err = r.al.a.Update(m.ctx, ch)
	}
	return seen
}

func (m *mmMachine) logRound(r *mmRound) {
	m.t.Helper()
	m.stats.rounds.Add(1)
	verb := "Round"
	if r.update {
		verb = "Update"
		m.stats.updates.Add(1)
	}
	if r.panicked != "" {
		m.logf("a%d %s %s (%s) panicked: %s", r.al.id, verb, r.l.pool, r.l.what, r.panicked)
		m.failOnViolations()
		m.fatalf("the allocator panicked: %s", strings.SplitN(r.panicked, "\n", 2)[0])
	}
	m.logf("a%d %s %s (%s): allocated %v released %v recycling %v lost %d shortfall %d err %v",
		r.al.id, verb, r.l.pool, r.l.what, grants(r.res.Allocated), grants(r.res.Released), r.res.Recycling, len(r.res.Lost), r.res.Shortfall, r.err)
	if mmDumpFile != "" {
		// What the instance believes after the round, in the dump only.
		m.histMu.Lock()
		m.hist.WriteString(allocator.DumpState(r.al.a, types.NamespacedName{Namespace: m.w.ns, Name: r.l.pool}))
		m.histMu.Unlock()
	}
}

func grants(gs []algorithm.Grant) string {
	var b strings.Builder
	for i, g := range gs {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s:%v", g.Claim.Name, g.Pods)
	}
	return "[" + b.String() + "]"
}

// mmSched interleaves the requests of two rounds, each made by an
// allocator instance with one writer (one request at a time): a round runs
// until its next request and parks there; when neither round runs, the
// drawn schedule picks which parked request goes next. A nil *mmSched lets
// everything run.
type mmSched struct {
	mu    sync.Mutex
	cond  *sync.Cond
	who   map[*mmAlloc]int
	state [2]int
	turn  int
	picks []bool
	n     int
}

const (
	schedRunning = iota
	schedParked
	schedCalling
	schedDone
)

func newMMSched(a1, a2 *mmAlloc, picks []bool) *mmSched {
	s := &mmSched{who: map[*mmAlloc]int{a1: 0, a2: 1}, turn: -1, picks: picks}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// enter parks a request of al until it is its turn; the function it
// returns ends the request.
func (s *mmSched) enter(al *mmAlloc) func() {
	if s == nil {
		return func() {}
	}
	i, ok := s.who[al]
	if !ok {
		return func() {}
	}
	s.mu.Lock()
	s.state[i] = schedParked
	s.decide()
	for s.turn != i {
		s.cond.Wait()
	}
	s.state[i] = schedCalling
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.state[i] = schedRunning
		s.turn = -1
		s.mu.Unlock()
	}
}

func (s *mmSched) finish(i int) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.state[i] = schedDone
	s.decide()
	s.mu.Unlock()
}

// decide lets a parked request go when no round runs. s.mu held.
func (s *mmSched) decide() {
	if s.turn >= 0 {
		return
	}
	var parked []int
	for i, st := range s.state {
		switch st {
		case schedRunning, schedCalling:
			return
		case schedParked:
			parked = append(parked, i)
		}
	}
	if len(parked) == 0 {
		return
	}
	s.turn = parked[0]
	if len(parked) == 2 {
		if s.n < len(s.picks) && s.picks[s.n] {
			s.turn = parked[1]
		}
		s.n++
	}
	s.cond.Broadcast()
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

// ---- actions: allocators ----

func (m *mmMachine) round(t *rapid.T) {
	al := m.pickAlloc(t)
	r := m.prepare(t, al, m.drawListing(t, al, m.pickPool(t)))
	al.seen[r.l.pool] = m.run(r)
	m.logRound(r)
	m.failOnViolations()
}

func (m *mmMachine) concurrentRounds(t *rapid.T) {
	a1 := m.pickAlloc(t)
	a2 := a1
	// Two instances, mostly; one instance's two rounds (without marks,
	// always) run free, in an order that does not replay.
	if m.marks && rapid.IntRange(0, 3).Draw(t, "same allocator if 3") != 3 {
		others := slices.DeleteFunc(slices.Clone(m.allocs), func(x *mmAlloc) bool { return x == a1 })
		if len(others) == 0 {
			m.stats.joins.Add(1)
			others = append(others, m.startAllocator(t))
		}
		a2 = others[index(t, len(others), "other allocator index")]
	}
	p1 := m.pickPool(t)
	p2 := p1
	if rapid.IntRange(0, 3).Draw(t, "other pool if 3") == 3 {
		p2 = m.pickPool(t)
	}
	r1 := m.prepare(t, a1, m.drawListing(t, a1, p1))
	r2 := m.prepare(t, a2, m.drawListing(t, a2, p2))
	if a1 == a2 {
		// One instance: Update's base is per instance, keep it simple.
		r1.update, r2.update = false, false
	}
	// Two instances with one writer each are interleaved request by
	// request in a drawn order, so that a failure replays; otherwise (and
	// when drawn) they run free.
	var sched *mmSched
	if a1 != a2 && a1.writers == 1 && a2.writers == 1 && rapid.IntRange(0, 3).Draw(t, "run free if 3") != 3 {
		sched = newMMSched(a1, a2, rapid.SliceOfN(rapid.Bool(), 64, 64).Draw(t, "schedule"))
	}
	m.sched = sched
	var wg sync.WaitGroup
	var s1, s2 *mmSeen
	wg.Go(func() {
		defer sched.finish(0)
		s1 = m.run(r1)
	})
	wg.Go(func() {
		defer sched.finish(1)
		s2 = m.run(r2)
	})
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		// An instance that panicked holding its own lock, say.
		m.fatalf("concurrent rounds did not finish within a minute")
	}
	m.sched = nil
	if a1 == a2 {
		// Which of the two the instance saw last is unknown: the next
		// round of either pool is a Round.
		delete(a1.seen, p1)
		delete(a1.seen, p2)
	} else {
		a1.seen[p1], a2.seen[p2] = s1, s2
	}
	m.stats.concurrent.Add(1)
	if a1 != a2 && p1 == p2 {
		m.stats.twoAllocators.Add(1)
	}
	m.logf("concurrently:")
	m.logRound(r1)
	m.logRound(r2)
	m.failOnViolations()
}

func (m *mmMachine) crash(t *rapid.T) {
	if len(m.allocs) == 0 {
		t.Skip("no allocator")
	}
	m.dropAllocator(m.allocs[index(t, len(m.allocs), "allocator index")], "crash")
}

func (m *mmMachine) crashMidRound(t *rapid.T) {
	al := m.pickAlloc(t)
	k := rapid.IntRange(0, 6).Draw(t, "writes before the crash")
	r := m.prepare(t, al, m.drawListing(t, al, m.pickPool(t)))
	al.crashAt.Store(int64(k))
	_ = m.run(r)
	m.logRound(r)
	m.stats.midCrashes.Add(1)
	m.dropAllocator(al, fmt.Sprintf("crashed after %d writes of that round", k))
	m.failOnViolations()
}

func (m *mmMachine) lateJoiner(t *rapid.T) {
	if len(m.allocs) >= mmMaxAllocators {
		t.Skip("enough allocators")
	}
	if !m.marks {
		// Without marks nothing fences two processes: fail over instead.
		for _, al := range slices.Clone(m.allocs) {
			m.dropAllocator(al, "failover")
		}
	}
	m.stats.joins.Add(1)
	m.startAllocator(t)
}

func (m *mmMachine) advanceClock(t *rapid.T) {
	d := rapid.SampledFrom([]time.Duration{10 * time.Second, time.Minute, allocator.DefaultQuarantine + time.Second}).Draw(t, "advance")
	m.clock.Step(d)
	m.logf("clock +%s", d)
}

func (m *mmMachine) enableMarks(t *rapid.T) {
	if m.marks {
		t.Skip("marks are on")
	}
	for _, al := range slices.Clone(m.allocs) {
		m.dropAllocator(al, "restart with pod marks")
	}
	m.marks = true
	m.mu.Lock()
	// Processes that start with pod marks list afresh: no listing they
	// act on dates from before the switch (a documented condition of the
	// switch; an older one may not show a record written without marks,
	// and nothing then fences the pods it lists).
	m.podSnaps, m.claimSnaps = nil, nil
	m.snapshot(m.cur)
	for _, c := range m.cur.claims {
		for _, p := range c.held {
			m.exemptPremark[mmPair{c.uid, p}] = true
			if pod := m.cur.pods[p]; pod != nil {
				m.setDirty(pod, c.uid, "held by the record of "+c.name+", written without pod marks")
			}
		}
	}
	m.mu.Unlock()
	m.logf("pod marks on from now (records written without them stay)")
}

func (m *mmMachine) setRecycler(t *rapid.T) {
	mode := mmRecycleMode(rapid.IntRange(0, 2).Draw(t, "recycler"))
	m.mu.Lock()
	m.recMode = mode
	m.mu.Unlock()
	m.logf("recycler: %s", mode)
}

func (m *mmMachine) recyclerFinish(t *rapid.T) {
	names := slices.Sorted(maps.Keys(m.cur.pods))
	if len(names) == 0 {
		t.Skip("no pod")
	}
	var pods []string
	for range rapid.IntRange(1, 3).Draw(t, "pods to finish") {
		if p := names[index(t, len(names), "pod index")]; !slices.Contains(pods, p) {
			pods = append(pods, p)
		}
	}
	m.mu.Lock()
	for _, p := range pods {
		m.recFinish[p] = true
	}
	m.mu.Unlock()
	m.logf("recycler will finish %v", pods)
}

// ---- actions: pods ----

func (m *mmMachine) createPod(pool, name string, ready bool) *corev1.Pod {
	if name == "" {
		name = pool + "-" + strconv.Itoa(m.podSeq[pool])
		m.podSeq[pool]++
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: m.w.ns, Name: name,
			Labels: map[string]string{testenv.PoolLabel: pool},
		},
		Spec: corev1.PodSpec{
			NodeName:   "node-" + strconv.Itoa(len(name)%3),
			Containers: []corev1.Container{{Name: "main", Image: testenv.PodImage}},
		},
	}
	if m.w.fakeUIDs {
		m.uids++
		pod.UID = types.UID(fmt.Sprintf("pod-uid-%d", m.uids))
	}
	m.must(m.w.raw.Create(m.ctx, pod), "create pod")
	if ready {
		m.must(testenv.SetPodReady(m.ctx, m.w.raw, pod, true), "set pod ready")
	}
	m.podPool[name] = pool
	return pod
}

func (m *mmMachine) existingPods(t *rapid.T) string {
	names := slices.Sorted(maps.Keys(m.cur.pods))
	if len(names) == 0 {
		t.Skip("no pod")
	}
	return names[index(t, len(names), "pod index")]
}

func (m *mmMachine) getPod(name string) (*corev1.Pod, bool) {
	var pod corev1.Pod
	err := m.w.raw.Get(m.ctx, types.NamespacedName{Namespace: m.w.ns, Name: name}, &pod)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	m.must(err, "get pod")
	return &pod, true
}

func (m *mmMachine) addPods(t *rapid.T) {
	pool := m.pickPool(t)
	n := rapid.IntRange(1, 2).Draw(t, "pods")
	ready := rapid.IntRange(0, 3).Draw(t, "ready unless 3") != 3
	var names []string
	for range n {
		names = append(names, m.createPod(pool, "", ready).Name)
	}
	m.logf("add pods %v to %s ready=%t", names, pool, ready)
}

func (m *mmMachine) podReadiness(t *rapid.T) {
	name := m.existingPods(t)
	ready := rapid.Bool().Draw(t, "ready")
	pod, ok := m.getPod(name)
	if !ok || pod.DeletionTimestamp != nil {
		t.Skip("pod gone or terminating")
	}
	m.must(testenv.SetPodReady(m.ctx, m.w.raw, pod, ready), "set readiness")
	m.logf("pod %s ready=%t", name, ready)
}

// removePod deletes a pod for good, dropping the test's finalizer.
func (m *mmMachine) removePod(pod *corev1.Pod) {
	if len(pod.Finalizers) > 0 {
		pod.Finalizers = nil
		err := m.w.raw.Update(m.ctx, pod)
		if apierrors.IsNotFound(err) {
			return
		}
		m.must(err, "drop pod finalizer")
		if pod.DeletionTimestamp != nil {
			return // gone with its finalizer
		}
	}
	err := m.w.raw.Delete(m.ctx, pod, client.GracePeriodSeconds(0))
	if !apierrors.IsNotFound(err) {
		m.must(err, "delete pod")
	}
}

func (m *mmMachine) deletePod(t *rapid.T) {
	name := m.existingPods(t)
	pod, ok := m.getPod(name)
	if !ok {
		t.Skip("pod gone")
	}
	if pod.DeletionTimestamp == nil && rapid.IntRange(0, 2).Draw(t, "terminate (kept by a finalizer) if 2") == 2 {
		pod.Finalizers = []string{mmPodFinalizer}
		m.must(m.w.raw.Update(m.ctx, pod), "add pod finalizer")
		m.must(m.w.raw.Delete(m.ctx, pod, client.GracePeriodSeconds(0)), "delete pod")
		m.logf("pod %s terminating", name)
		return
	}
	m.removePod(pod)
	m.logf("pod %s deleted", name)
}

// recreatePod deletes a pod (if it exists) and creates a new one under the
// same name, as a pool with fixed pod names does.
func (m *mmMachine) recreatePod(t *rapid.T) {
	names := slices.Sorted(maps.Keys(m.podPool))
	name := names[index(t, len(names), "pod index")]
	if pod, ok := m.getPod(name); ok {
		m.removePod(pod)
	}
	ready := rapid.IntRange(0, 3).Draw(t, "ready unless 3") != 3
	pod := m.createPod(m.podPool[name], name, ready)
	m.mu.Lock()
	for _, c := range m.cur.claims {
		if slices.Contains(c.held, name) {
			m.exemptRecreate[mmPair{c.uid, name}] = true
			m.mayGo[mmPair{c.uid, name}] = true
		}
	}
	m.mu.Unlock()
	m.stats.recreates.Add(1)
	m.logf("pod %s recreated (uid %s) ready=%t", name, pod.UID, ready)
}

// ---- actions: claims ----

func (m *mmMachine) liveClaims() []*mmClaim {
	var out []*mmClaim
	for _, c := range m.cur.claims {
		if !c.terminating {
			out = append(out, c)
		}
	}
	return out
}

func (m *mmMachine) pickClaim(t *rapid.T) *mmClaim {
	live := m.liveClaims()
	if len(live) == 0 {
		t.Skip("no claim")
	}
	return live[index(t, len(live), "claim index")]
}

func (m *mmMachine) getClaim(name string) (*testenv.Claim, bool) {
	var cl testenv.Claim
	err := m.w.raw.Get(m.ctx, types.NamespacedName{Namespace: m.w.ns, Name: name}, &cl)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	m.must(err, "get claim")
	return &cl, true
}

func (m *mmMachine) createClaim(t *rapid.T) {
	if m.claimCount() >= 6 {
		t.Skip("enough claims")
	}
	pool := m.pickPool(t)
	want := rapid.IntRange(0, 3).Draw(t, "replicas")
	prio := rapid.IntRange(0, 2).Draw(t, "priority")
	keep := rapid.IntRange(0, 3).Draw(t, "keep finalizer if 3") == 3
	m.ids++
	cl := testenv.NewClaim(m.w.ns, "c"+strconv.Itoa(m.ids), pool, int32(want))
	cl.Spec.Priority = int32(prio)
	if m.w.fakeUIDs {
		cl.UID = types.UID(fmt.Sprintf("claim-uid-%d", m.ids))
	}
	if keep {
		cl.Finalizers = []string{mmKeepFinalizer}
	}
	m.must(m.w.raw.Create(m.ctx, cl), "create claim")
	m.logf("create claim %s (%s) pool %s want %d priority %d keep %t", cl.Name, cl.UID, pool, want, prio, keep)
}

// claimCount counts the claims that exist, from the server (createClaim
// runs also before the first check).
func (m *mmMachine) claimCount() int {
	var list testenv.ClaimList
	m.must(m.w.raw.List(m.ctx, &list, client.InNamespace(m.w.ns)), "list claims")
	return len(list.Items)
}

func (m *mmMachine) scaleClaim(t *rapid.T) {
	c := m.pickClaim(t)
	want := rapid.IntRange(0, 3).Draw(t, "replicas")
	cl, ok := m.getClaim(c.name)
	if !ok {
		t.Skip("claim gone")
	}
	cl.Spec.Replicas = int32(want)
	m.must(m.w.raw.Update(m.ctx, cl), "scale claim")
	m.logf("scale %s to %d", c.name, want)
}

func (m *mmMachine) releasePods(t *rapid.T) {
	c := m.pickClaim(t)
	if len(c.held) == 0 {
		t.Skip("holds nothing")
	}
	var pods []string
	for i, b := range rapid.SliceOfN(rapid.Bool(), 4, 4).Draw(t, "release which") {
		if i < len(c.held) && b {
			pods = append(pods, c.held[i])
		}
	}
	cl, ok := m.getClaim(c.name)
	if !ok {
		t.Skip("claim gone")
	}
	ann := cl.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	if len(pods) == 0 {
		delete(ann, mmRecordKey.Release)
	} else {
		v, err := syncer.EncodePods(pods)
		m.must(err, "encode release")
		ann[mmRecordKey.Release] = v
	}
	cl.SetAnnotations(ann)
	m.must(m.w.raw.Update(m.ctx, cl), "owner release")
	m.logf("owner of %s releases %v (holds %v)", c.name, pods, c.held)
}

func (m *mmMachine) deleteClaim(t *rapid.T) {
	c := m.pickClaim(t)
	cl, ok := m.getClaim(c.name)
	if !ok {
		t.Skip("claim gone")
	}
	m.must(m.w.raw.Delete(m.ctx, cl), "delete claim")
	m.logf("delete claim %s", c.name)
}

func (m *mmMachine) forceDeleteClaim(t *rapid.T) {
	if len(m.cur.claims) == 0 {
		t.Skip("no claim")
	}
	c := m.cur.claims[index(t, len(m.cur.claims), "claim index")]
	cl, ok := m.getClaim(c.name)
	if !ok {
		t.Skip("claim gone")
	}
	if m.premark(c.uid) {
		// Its record lists pods written without marks, which nothing
		// ties to it once it is gone: a documented limit of records
		// written without pod marks (README, guarantee 6).
		t.Skip("the claim's record lists pods without pod marks")
	}
	if len(cl.Finalizers) > 0 {
		cl.Finalizers = nil
		if err := m.w.raw.Update(m.ctx, cl); err != nil && !apierrors.IsNotFound(err) {
			m.fatalf("strip finalizers: %v", err)
		}
	}
	if err := m.w.raw.Delete(m.ctx, cl); err != nil && !apierrors.IsNotFound(err) {
		m.fatalf("force delete: %v", err)
	}
	m.logf("force-delete claim %s (held %v)", c.name, c.held)
}

// premark reports whether the claim's record lists a pod written without
// pod marks that no allocator has marked since.
func (m *mmMachine) premark(claim types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for pair := range m.exemptPremark {
		if pair.claim == claim {
			return true
		}
	}
	return false
}

// moveClaim changes a claim's pool while no allocator runs.
func (m *mmMachine) moveClaim(t *rapid.T) {
	if !m.marks {
		// Without pod marks nothing tells the old pool that a moved
		// claim's pods are dirty: a documented limit of WithPodMarks(false).
		t.Skip("pod marks are off")
	}
	c := m.pickClaim(t)
	cl, ok := m.getClaim(c.name)
	if !ok {
		t.Skip("claim gone")
	}
	if m.premark(c.uid) {
		// Its record lists pods written without marks: the same limit.
		t.Skip("the claim's record lists pods without pod marks")
	}
	for _, al := range slices.Clone(m.allocs) {
		m.dropAllocator(al, "stopped to move a claim")
	}
	to := "p1"
	if cl.Spec.PoolRef == "p1" {
		to = "p2"
	}
	cl.Spec.PoolRef = to
	m.must(m.w.raw.Update(m.ctx, cl), "move claim")
	m.mu.Lock()
	for pair := range m.exemptRecreate {
		if pair.claim == c.uid {
			// Moved back later, its record and another claim's may both
			// name the recreated pod: no allocator ran to tell them apart.
			m.exemptStale[pair] = true
		}
	}
	m.mu.Unlock()
	m.stats.moves.Add(1)
	m.logf("while no allocator runs, claim %s moves to pool %s (held %v)", c.name, to, c.held)
}

// ---- liveness ----

// settle stops all allocators but one and lets it run rounds on fresh
// listings, then checks liveness.
func (m *mmMachine) settle(t *rapid.T) {
	m.t = t
	var al *mmAlloc
	if len(m.allocs) == 0 {
		al = m.startAllocator(t)
	} else {
		al = m.allocs[index(t, len(m.allocs), "survivor index")]
	}
	for _, x := range slices.Clone(m.allocs) {
		if x != al {
			m.dropAllocator(x, "end of history")
		}
	}
	m.mu.Lock()
	m.recMode = recycleDone
	m.mu.Unlock()
	m.logf("settle: a%d alone, recycler done, up to %d rounds per pool", al.id, mmSettleRounds)
	// Three rounds per pool in a row without a write or a recycler call,
	// the clock past the quarantine each time, are as far as it goes.
	quiet := 0
	for i := 0; i < mmSettleRounds && quiet < 3; i++ {
		before := m.acts.Load()
		for _, pool := range mmPools {
			r := &mmRound{al: al, l: m.freshListing(pool)}
			al.seen[pool] = m.run(r)
			m.logRound(r)
			m.failOnViolations()
		}
		m.clock.Step(allocator.DefaultQuarantine + time.Second)
		m.check(t)
		if m.acts.Load() == before {
			quiet++
		} else {
			quiet = 0
		}
	}
	m.liveness()
}

func (m *mmMachine) liveness() {
	st := m.cur
	var errs []mmViolation
	add := func(kind, format string, args ...any) {
		errs = append(errs, mmViolation{"liveness: " + kind, "liveness: " + fmt.Sprintf(format, args...)})
	}
	holders := st.holders()
	short := make(map[string][]string) // pool → short claims
	shortOS := make(map[string][]*mmClaim)
	for _, c := range st.claims {
		for _, p := range c.held {
			// A name whose pod is gone is a lost pod, kept as any lost
			// pod is (WithReplaceLost drops those), whatever its pool.
			// So is a name whose pod was recreated since the record got
			// it: the record's pod is gone.
			if pool := m.podPool[p]; pool != c.pool && st.pods[p] != nil && !m.exemptRecreate[mmPair{c.uid, p}] {
				add("a record holds a pod of another pool", "record of %s (pool %s) still holds pod %s of pool %q", c.name, c.pool, p, pool)
			}
		}
		if c.terminating {
			if len(c.held) > 0 {
				add("a terminating claim holds pods", "terminating claim %s still holds %v", c.name, c.held)
			}
			continue
		}
		if mmOpenSandbox {
			// Want bounds what the record lists over the claim's
			// lifetime; a lower Want takes nothing back.
			if len(c.listed) < c.want {
				short[c.pool] = append(short[c.pool], fmt.Sprintf("%s (lists %d of %d)", c.name, len(c.listed), c.want))
				shortOS[c.pool] = append(shortOS[c.pool], c)
			}
			continue
		}
		if len(c.held) > c.want {
			add("a claim holds more than it wants", "claim %s holds %v, more than the %d it wants", c.name, c.held, c.want)
		}
		if len(c.held) < c.want {
			short[c.pool] = append(short[c.pool], fmt.Sprintf("%s (holds %d of %d)", c.name, len(c.held), c.want))
		}
	}
	// takable reports whether a short claim of pool may take pod: under
	// WithOpenSandbox, not one its record lists already.
	takable := func(pool, pod string) bool {
		if !mmOpenSandbox {
			return true
		}
		for _, c := range shortOS[pool] {
			if !slices.Contains(c.listed, pod) {
				return true
			}
		}
		return false
	}
	for _, name := range slices.Sorted(maps.Keys(st.pods)) {
		pod := st.pods[name]
		if m.marks && pod.mark != "" {
			c := st.byUID[parseMarkUID(pod.mark)]
			if c == nil || !slices.Contains(c.held, name) {
				add("a pod is marked for a claim whose record does not hold it", "pod %s is marked %q but that claim's record does not hold it", name, pod.mark)
			}
		}
		if s := short[pod.pool]; len(s) > 0 && pod.ready && len(holders[name]) == 0 && (!m.marks || pod.mark == "") && takable(pod.pool, name) {
			add("a ready pod is left unheld while a claim is short", "pod %s is ready, unheld and unmarked while %v are short", name, s)
		}
	}
	if m.marks {
		for _, c := range st.claims {
			for _, p := range c.held {
				if pod := st.pods[p]; pod != nil && pod.mark != c.mark() && !m.exemptRecreate[mmPair{c.uid, p}] {
					add("a record holds a pod not marked for it", "the record of %s holds pod %s, whose mark is %q", c.name, p, pod.mark)
				}
			}
		}
	}
	if len(errs) > 0 {
		m.logf("after the settle rounds by one allocator:")
	}
	m.failWith(errs)
}

// ---- the machine ----

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
