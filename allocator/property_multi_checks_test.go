package allocator_test

// Checks of the multi-allocator machine (property_multi_test.go). What
// they tolerate is not decided here: each exemption is a named function in
// property_multi_exempt_test.go, with the invariant it relaxes and why.
//
// Checked on the server, after every step and, from an interceptor on the
// allocators' clients, right after every write an allocator makes (writes
// and checks are serialized by a mutex, so a check sees the state of that
// instant):
//
//   - EXCL: no pod name is held (allocated minus released) by two claims'
//     records.
//   - I11 (pod marks on): every pod a record holds carries a mark naming
//     that claim.
//   - I13 (pod marks on): a pod seen, after a step, marked for a claim whose
//     record held it under that mark and now lists it neither held nor
//     released, or marked for a claim that does not exist, or held by a
//     record without its mark, is uncertain; it must go through the
//     recycler (or be deleted) before another claim's record holds it.
//   - I7 (no swap): a live claim's record stops holding a pod only for a
//     reason (checked right after each claim write).
//
// Checked whenever an allocator calls the recycler (pod marks on): the
// pod, read live from the server, carries a mark naming the claim it is
// recycled for (the Recycler contract, allocator/options.go).
//
// At the end of each history all allocators but one stop; the survivor runs
// rounds on fresh listings of both pools, the clock advancing past
// allocator.DefaultQuarantine each time, with the recycler finishing everything,
// for mmSettleRounds rounds per pool (fewer once three in a row wrote and
// recycled nothing). Then (liveness): every live claim holds at most what it
// wants, a claim that holds less has no ready pod of its pool left unheld
// and unmarked, no pod is marked for a claim whose record does not hold it,
// every record holds only pods of its claim's current pool, a terminating
// claim holds nothing, and I11 holds. The allocator must not panic either.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
)

// mmDirty says a pod (by UID) was seen with an uncertain holder: claim,
// the one it was uncertain for, and why.
type mmDirty struct {
	claim types.UID
	why   string
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

// checkDrops checks I7 between two states: a live claim's record stops
// holding a pod only for a reason exemptDrop accepts. m.mu held.
func (m *mmMachine) checkDrops(old, st *mmState, where string) []mmViolation {
	var out []mmViolation
	if old == nil {
		return nil
	}
	for _, c := range st.claims {
		was := old.byUID[c.uid]
		if was == nil {
			continue
		}
		for _, p := range was.held {
			if slices.Contains(c.held, p) || m.exemptDrop(st, c, p) {
				continue
			}
			out = append(out, mmViolation{"I7: a claim lost a pod it held, wanted and did not release",
				fmt.Sprintf("I7 %s: the record of %s (want %d) no longer holds pod %s, which is ready, still its (by mark, with marks) and not released by its owner",
					where, c.name, c.want, p)})
		}
	}
	return out
}

// checkState checks EXCL, I11 and I13 on st. m.mu held. writer is the
// allocator whose write st follows, nil after a step.
func (m *mmMachine) checkState(st *mmState, where string, writer *mmAlloc) []mmViolation {
	var out []mmViolation
	holders := st.holders()
	for _, p := range slices.Sorted(maps.Keys(holders)) {
		if len(holders[p]) < 2 {
			continue
		}
		cs := slices.DeleteFunc(slices.Clone(holders[p]), func(c *mmClaim) bool {
			return m.exemptUnseenRecord(c, p, writer)
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
	if m.exemptUnfenced() {
		return out
	}
	for _, c := range st.claims {
		for _, p := range c.held {
			pod := st.pods[p]
			if m.exemptGonePod(pod) {
				continue
			}
			if pod.mark != c.mark() && !m.exemptRecreated(c, p) && !m.exemptPremarkRecord(c, p) {
				out = append(out, mmViolation{"I11: a record holds a pod whose mark names another claim or none",
					fmt.Sprintf("I11 %s: the record of %s holds pod %s, whose mark is %q", where, c.name, p, pod.mark)})
			}
			if d, ok := m.dirty[pod.uid]; ok && !m.exemptUncertainKept(d, c) && !m.exemptRecreated(c, p) {
				out = append(out, mmViolation{"I13: an uncertain pod went to another claim unrecycled",
					fmt.Sprintf("I13 %s: the record of %s holds pod %s, whose holder was uncertain (%s) and which was not recycled since", where, c.name, p, d.why)})
			}
		}
	}
	return out
}

// observe updates the uncertain pods (I13) and the exemptions after a
// step. m.mu held.
func (m *mmMachine) observe(st *mmState) {
	m.pruneExemptions(st)
	if m.exemptUnfenced() {
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
			case m.exemptCertainAgain(pod, c, len(hs)):
				delete(m.dirty, pod.uid)
			case m.exemptRecycledUnderMark(pod):
			case c == nil:
				m.setDirty(pod, uid, "marked for "+pod.mark+", a claim that does not exist")
			case !slices.Contains(c.held, name) && !slices.Contains(c.released, name) && !m.exemptUnexposedMark(pod, c):
				m.setDirty(pod, uid, "marked for "+c.name+", whose record held it and no longer lists it")
			}
		}
		for _, c := range hs {
			if pod.mark != c.mark() && !m.exemptRecreated(c, name) {
				m.setDirty(pod, c.uid, fmt.Sprintf("held by the record of %s, marked %q", c.name, pod.mark))
			}
		}
	}
}

// checkRecycleMark checks, as al's recycler is called for req, that the
// pod, read live from the server (pod, or found false if there is none),
// carries a mark naming req.Claim: with pod marks the allocator calls the
// recycler only while the pod's mark names the claim it is recycled for
// (allocator.Recycler). A recycler that restarts the pod in place would
// otherwise act on a pod handed to another claim, or on an uncertain one.
// A violation ends the history after the round.
func (m *mmMachine) checkRecycleMark(al *mmAlloc, req allocator.RecycleRequest, pod *corev1.Pod, found bool) {
	if m.exemptUnfenced() || m.exemptRecycleGone(req, pod, found) {
		return
	}
	want := req.Claim.Claim.Name + "/" + string(req.Claim.UID)
	live := pod.Annotations[mmMarkKey]
	m.mu.Lock()
	defer m.mu.Unlock()
	m.journal = append(m.journal, fmt.Sprintf("a%d recycle %s for %s: live mark %q (pod rv %s, request rv %s)",
		al.id, req.Pod, want, live, pod.ResourceVersion, req.ResourceVersion))
	if live == want {
		return
	}
	m.violations = append(m.violations, mmViolation{"RECYCLE: the recycler was called for a pod not marked for the claim",
		fmt.Sprintf("RECYCLE a%d's recycler was called for pod %s (uid %s, request rv %s) given back by %s, but the pod's live mark is %q (pod rv %s)",
			al.id, req.Pod, pod.UID, req.ResourceVersion, want, live, pod.ResourceVersion)})
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
			if pool := m.podPool[p]; pool != c.pool && !m.exemptGonePod(st.pods[p]) && !m.exemptRecreated(c, p) {
				add("a record holds a pod of another pool", "record of %s (pool %s) still holds pod %s of pool %q", c.name, c.pool, p, pool)
			}
		}
		if c.terminating {
			if len(c.held) > 0 {
				add("a terminating claim holds pods", "terminating claim %s still holds %v", c.name, c.held)
			}
			continue
		}
		if m.exemptOpenSandboxWant() {
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
		if !m.exemptOpenSandboxWant() {
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
		if pod.mark != "" && !m.exemptUnfenced() {
			c := st.byUID[parseMarkUID(pod.mark)]
			if c == nil || !slices.Contains(c.held, name) {
				add("a pod is marked for a claim whose record does not hold it", "pod %s is marked %q but that claim's record does not hold it", name, pod.mark)
			}
		}
		if s := short[pod.pool]; len(s) > 0 && pod.ready && len(holders[name]) == 0 && (!m.marks || pod.mark == "") && takable(pod.pool, name) {
			add("a ready pod is left unheld while a claim is short", "pod %s is ready, unheld and unmarked while %v are short", name, s)
		}
	}
	if !m.exemptUnfenced() {
		for _, c := range st.claims {
			for _, p := range c.held {
				if pod := st.pods[p]; !m.exemptGonePod(pod) && pod.mark != c.mark() && !m.exemptRecreated(c, p) {
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
