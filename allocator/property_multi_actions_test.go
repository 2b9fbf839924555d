package allocator_test

// Actions of the multi-allocator machine (property_multi_test.go): the
// allocators' rounds and the world's changes to pods and claims.

import (
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/syncer"
)

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
	// always: limitUnfencedOneProcess) run free, in an order that does not
	// replay.
	if !m.limitUnfencedOneProcess() && rapid.IntRange(0, 3).Draw(t, "same allocator if 3") != 3 {
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
	m.limitMarksSwitchListsAfresh()
	m.notePremark()
	m.mu.Unlock()
	m.logf("pod marks on from now (records written without them stay)")
}

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
	m.noteRecreated(name)
	m.mu.Unlock()
	m.stats.recreates.Add(1)
	m.logf("pod %s recreated (uid %s) ready=%t", name, pod.UID, ready)
}

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
	if m.limitPremarkClaim(c.uid) {
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

// moveClaim changes a claim's pool while no allocator runs.
func (m *mmMachine) moveClaim(t *rapid.T) {
	if m.limitUnfencedNoMoves() {
		t.Skip("pod marks are off")
	}
	c := m.pickClaim(t)
	cl, ok := m.getClaim(c.name)
	if !ok {
		t.Skip("claim gone")
	}
	if m.limitPremarkClaim(c.uid) {
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
	m.noteMoved(c.uid)
	m.mu.Unlock()
	m.stats.moves.Add(1)
	m.logf("while no allocator runs, claim %s moves to pool %s (held %v)", c.name, to, c.held)
}
