package allocator_test

// Faults the multi-allocator machine (property_multi_test.go) injects:
// crashes (between rounds and in the middle of one), late joiners, lagging
// listings, interleaved requests of two rounds, strategies that modify
// their input, and a recycler that holds pods or deletes them.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
)

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

// mmPodSnap and mmClaimSnap are listings kept for lagging rounds; sig
// tells one from the next.
// A snapshot is a listing as it was after a write. superseded is when a
// newer one was taken (zero while it is the newest): a listing lags by the
// time since then, and the allocator's contract bounds that lag by
// allocator.DefaultQuarantine, so older ones are not drawn (limitLag).
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

func (m *mmMachine) recycler(al *mmAlloc) allocator.Recycler {
	return func(ctx context.Context, req allocator.RecycleRequest) (bool, error) {
		pool, name := req.Pool, req.Pod
		defer m.sched.enter(al)()
		if al.dead.Load() {
			return false, errCrashed
		}
		m.acts.Add(1)
		// The pod as the server has it now, read by the test's own
		// client (no cache), whatever the recycler then does: the
		// allocator may call the recycler only while the pod's mark
		// names the claim (checkRecycleMark).
		var pod corev1.Pod
		err := m.w.raw.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: name}, &pod)
		if err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		found := err == nil
		m.checkRecycleMark(al, req, &pod, found)
		m.mu.Lock()
		mode, finish := m.recMode, m.recFinish[name]
		m.mu.Unlock()
		if mode == recycleHold && !finish {
			m.mu.Lock()
			m.journal = append(m.journal, fmt.Sprintf("a%d recycle %s: not yet", al.id, name))
			m.mu.Unlock()
			return false, nil
		}
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
			m.noteRecycled(pod.UID, pod.Annotations[mmMarkKey])
		}
		delete(m.recFinish, name)
		m.journal = append(m.journal, fmt.Sprintf("a%d recycle %s: done (%s)", al.id, name, mode))
		return true, nil
	}
}

// drawListing draws a fresh or lagging listing of pool for al, within the
// limits limitUnfencedFreshRecovery and limitLag.
func (m *mmMachine) drawListing(t *rapid.T, al *mmAlloc, pool string) mmListing {
	l := mmListing{pool: pool, what: "fresh"}
	unstr := rapid.Bool().Draw(t, "unstructured claims")
	if !rapid.Bool().Draw(t, "lagging listing") || m.limitUnfencedFreshRecovery(al, pool) {
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
	pl := m.limitLag(rapid.IntRange(0, mmSnapshots-1).Draw(t, "pod listing lag"),
		usable(len(pods), now, func(i int) time.Time { return pods[i].superseded }))
	cl := m.limitLag(rapid.IntRange(0, mmSnapshots-1).Draw(t, "claim listing lag"),
		usable(len(claims), now, func(i int) time.Time { return claims[i].superseded }))
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
	if m.limitUnfencedOneProcess() {
		// Fail over instead.
		for _, al := range slices.Clone(m.allocs) {
			m.dropAllocator(al, "failover")
		}
	}
	m.stats.joins.Add(1)
	m.startAllocator(t)
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
