package allocator_test

// Exemptions of the multi-allocator machine (property_multi_test.go), in one
// place. An exemption is a place where a check tolerates what its
// invariant, read literally, forbids; a limit is a situation the actions do
// not make the allocators face, because the allocator's documented contract
// does not cover it. The checks (property_multi_checks_test.go) and the
// actions ask the functions below and decide nothing of the kind on their
// own. Each is counted when a check or an action relied on it (mmStats,
// logged at the end of a run), so that one no history needs stands out.
//
// Exemptions (the invariant relaxed; the reason is at each function):
//
//	recreated-name      I11, I13, liveness: a record names a pod recreated since it got it (exemptRecreated)
//	recreated-unseen    EXCL: ... and the allocator that handed out the new pod could not see that record (exemptUnseenRecord)
//	premark             I11: a record written before pod marks were switched on (exemptPremarkRecord)
//	gone-pod            I11, I13, liveness: a record names a pod that does not exist (exemptGonePod)
//	unfenced            I11, I13, liveness: pod marks are off (exemptUnfenced)
//	uncertain-kept      I13: the claim a pod was uncertain for keeps it (exemptUncertainKept)
//	certain-again       I13: a pod held and marked by one claim has a certain holder again (exemptCertainAgain)
//	recycled            I13: a pod the recycler was called for is clean (noteRecycled)
//	recycled-under-mark I13: ... and stays clean while it carries the mark it was recycled under (exemptRecycledUnderMark)
//	unexposed-mark      I13: a mark whose claim's record never listed the pod (exemptUnexposedMark)
//	recycle-gone        recycler live mark: no pod has the name of the pod recycled (exemptRecycleGone)
//	recycle-recreated   recycler live mark: the pod under the name has another UID (exemptRecycleGone)
//	recycle-superseded  recycler live mark: the pod changed since the fence the call rests on (exemptRecycleGone)
//	owner-released      I7: the owner's release annotation named the pod (dropReasons)
//	terminating         I7: the claim is terminating (dropReasons, exemptDrop)
//	beyond-want         I7: the claim held more than it wanted (dropReasons)
//	lost                I7: the pod was gone, unready or terminating (dropReasons, exemptDrop)
//	unmarked            I7: the pod was not marked for the claim (dropReasons, exemptDrop)
//	other-pool          I7: the pod is of another pool than the claim (dropReasons)
//	opensandbox-want    liveness (I3): WithOpenSandbox bounds what a record lists over its lifetime (exemptOpenSandboxWant)
//
// Limits (what is not drawn; the reason is at each function):
//
//	unfenced-one-process    without pod marks one allocator process runs at a time (limitUnfencedOneProcess)
//	unfenced-fresh-recovery without pod marks a process's first round of a pool lists afresh (limitUnfencedFreshRecovery)
//	lag-within-quarantine   no listing lags by a Quarantine or more (limitLag)
//	marks-switch-afresh     processes started with pod marks list afresh (limitMarksSwitchListsAfresh)
//	premark-claim           a claim whose record lists pods written without marks is not force-deleted or moved (limitPremarkClaim)
//	unfenced-no-moves       without pod marks no claim moves to another pool (limitUnfencedNoMoves)

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolalloc/poolalloc/allocator"
)

// mmExemption names an exemption or a limit, for the counts.
type mmExemption int

const (
	exRecreatedName mmExemption = iota
	exRecreatedUnseen
	exPremark
	exGonePod
	exUnfenced
	exUncertainKept
	exCertainAgain
	exRecycled
	exRecycledUnderMark
	exUnexposedMark
	exRecycleGone
	exRecycleRecreated
	exRecycleSuperseded
	exOwnerReleased
	exTerminating
	exBeyondWant
	exLost
	exUnmarked
	exOtherPool
	exOpenSandboxWant

	limUnfencedOneProcess
	limUnfencedFreshRecovery
	limLagWithinQuarantine
	limMarksSwitchAfresh
	limPremarkClaim
	limUnfencedNoMoves

	mmExemptions // how many there are
)

var mmExemptionNames = [mmExemptions]string{
	exRecreatedName:     "recreated-name",
	exRecreatedUnseen:   "recreated-unseen",
	exPremark:           "premark",
	exGonePod:           "gone-pod",
	exUnfenced:          "unfenced",
	exUncertainKept:     "uncertain-kept",
	exCertainAgain:      "certain-again",
	exRecycled:          "recycled",
	exRecycledUnderMark: "recycled-under-mark",
	exUnexposedMark:     "unexposed-mark",
	exRecycleGone:       "recycle-gone",
	exRecycleRecreated:  "recycle-recreated",
	exRecycleSuperseded: "recycle-superseded",
	exOwnerReleased:     "owner-released",
	exTerminating:       "terminating",
	exBeyondWant:        "beyond-want",
	exLost:              "lost",
	exUnmarked:          "unmarked",
	exOtherPool:         "other-pool",
	exOpenSandboxWant:   "opensandbox-want",

	limUnfencedOneProcess:    "unfenced-one-process",
	limUnfencedFreshRecovery: "unfenced-fresh-recovery",
	limLagWithinQuarantine:   "lag-within-quarantine",
	limMarksSwitchAfresh:     "marks-switch-afresh",
	limPremarkClaim:          "premark-claim",
	limUnfencedNoMoves:       "unfenced-no-moves",
}

func (e mmExemption) String() string { return mmExemptionNames[e] }

// mmExemptCounts counts, per exemption, how often it made a difference.
type mmExemptCounts [mmExemptions]atomic.Int64

func (c *mmExemptCounts) String() string {
	var parts []string
	for e := range mmExemptions {
		if n := c[e].Load(); n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", e, n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// use counts e as applied and reports true.
func (m *mmMachine) use(e mmExemption) bool {
	m.stats.exempted[e].Add(1)
	return true
}

// mmExemptState is what the exemptions remember of a history. m.mu guards
// it.
type mmExemptState struct {
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
	// as the record names the pod (see exemptUnseenRecord).
	exemptStale map[mmPair]bool
	// listing is, per allocator in a round, the listing the round works
	// on.
	listing map[*mmAlloc]*mmListing
	// mayGo holds the pods a claim's record may stop holding without its
	// owner's say (I7), with the first reason seen (see dropReasons).
	mayGo map[mmPair]mmExemption
}

func newMMExemptState() mmExemptState {
	return mmExemptState{
		exposed:        make(map[types.UID]types.UID),
		recycledUnder:  make(map[types.UID]string),
		exemptRecreate: make(map[mmPair]bool),
		exemptPremark:  make(map[mmPair]bool),
		exemptStale:    make(map[mmPair]bool),
		listing:        make(map[*mmAlloc]*mmListing),
		mayGo:          make(map[mmPair]mmExemption),
	}
}

// ---- what the exemptions remember ----

// noteRecreated records that the test recreated pod name: every claim
// whose record holds the name gets exRecreatedName for it, and may drop
// it. m.mu held.
func (m *mmMachine) noteRecreated(name string) {
	for _, c := range m.cur.claims {
		if slices.Contains(c.held, name) {
			m.exemptRecreate[mmPair{c.uid, name}] = true
			m.allowDrop(mmPair{c.uid, name}, exRecreatedName)
		}
	}
}

// noteMoved records that claim moved to another pool while no allocator
// ran. Moved back later, its record and another claim's may both name a
// recreated pod: no allocator ran to tell them apart (exRecreatedUnseen).
// m.mu held.
func (m *mmMachine) noteMoved(claim types.UID) {
	for pair := range m.exemptRecreate {
		if pair.claim == claim {
			m.exemptStale[pair] = true
		}
	}
}

// notePremark records, when pod marks are switched on, every pod a
// record holds as held without a mark: exPremark for it until an allocator
// marks it, and uncertain (I13) meanwhile. m.mu held.
func (m *mmMachine) notePremark() {
	for _, c := range m.cur.claims {
		for _, p := range c.held {
			m.exemptPremark[mmPair{c.uid, p}] = true
			if pod := m.cur.pods[p]; pod != nil {
				m.setDirty(pod, c.uid, "held by the record of "+c.name+", written without pod marks")
			}
		}
	}
}

// pruneExemptions forgets the recreation and premark exemptions of pairs
// st shows settled: the record no longer holds the pod, or (premark) the
// pod now carries the claim's mark. m.mu held.
func (m *mmMachine) pruneExemptions(st *mmState) {
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

// noteRecycled records that the recycler was called for the pod now
// under the request's name (exRecycled, exRecycledUnderMark). That pod may
// be newer than the one the request was for (exRecycleRecreated): the
// machine's recycler, unlike allocator.RecycleDelete, does not use the
// request's UID, so it also cleans (and, deleting, removes) a pod
// recreated under the name. m.mu held.
func (m *mmMachine) noteRecycled(uid types.UID, mark string) {
	if _, ok := m.dirty[uid]; ok {
		m.use(exRecycled)
	}
	delete(m.dirty, uid)
	if mark != "" {
		m.recycledUnder[uid] = mark
	}
}

// noteMayGo adds to mayGo what st shows. m.mu held.
func (m *mmMachine) noteMayGo(st *mmState) {
	for _, c := range st.claims {
		for _, p := range c.release {
			m.allowDrop(mmPair{c.uid, p}, exOwnerReleased)
		}
		for _, p := range c.held {
			if e, ok := m.dropReasons(st, c, p); ok {
				m.allowDrop(mmPair{c.uid, p}, e)
			}
		}
	}
}

// allowDrop lets the record of pair's claim stop holding its pod for
// reason e, unless an earlier reason does already. m.mu held.
func (m *mmMachine) allowDrop(pair mmPair, e mmExemption) {
	if _, ok := m.mayGo[pair]; !ok {
		m.mayGo[pair] = e
	}
}

// ---- exemptions ----

// exemptRecreated reports whether the record of c holds pod p under a
// name the test recreated since the record got it. It relaxes I11, I13
// and the liveness checks on a held pod's pool and mark: the name no
// longer denotes the pod the record got (DESIGN I12, a pod is its name and
// UID), so the new pod's mark, uncertainty and pool say nothing about the
// record. m.mu held (or no round runs).
func (m *mmMachine) exemptRecreated(c *mmClaim, p string) bool {
	return m.exemptRecreate[mmPair{c.uid, p}] && m.use(exRecreatedName)
}

// exemptUnseenRecord reports whether EXCL lets the record of c name pod p,
// which another record holds too. It relaxes EXCL for a recreated name
// only where the allocator that handed the new pod to another claim could
// not see the record naming it: the record's claim moved to another pool
// (the old pool cannot list it), or the allocator's claim listing lagged
// behind the record (a documented limit, README "Many allocators"). Once
// so, it holds for as long as the record names the pod. An allocator whose
// listing shows the record naming the pod must not hand the new pod out.
// writer is the allocator whose write the check follows, nil after a
// step. m.mu held.
func (m *mmMachine) exemptUnseenRecord(c *mmClaim, p string, writer *mmAlloc) bool {
	pair := mmPair{c.uid, p}
	if !m.exemptRecreate[pair] {
		return false
	}
	if c.pool != m.podPool[p] || m.exemptStale[pair] {
		return m.use(exRecreatedUnseen)
	}
	if writer != nil && !m.listing[writer].names(c.uid, p) {
		m.exemptStale[pair] = true
		return m.use(exRecreatedUnseen)
	}
	return false
}

// exemptPremarkRecord reports whether I11 lets the record of c hold pod p
// without its mark because the record was written before pod marks were
// switched on and no allocator marked the pod since. It relaxes I11: an
// allocator marks such pods (or recycles them) only when it next acts on
// the pool; meanwhile the pod is uncertain (notePremark) and I13 guards
// it. m.mu held.
func (m *mmMachine) exemptPremarkRecord(c *mmClaim, p string) bool {
	return m.exemptPremark[mmPair{c.uid, p}] && m.use(exPremark)
}

// exemptGonePod reports whether pod, which a record holds, does not exist.
// It relaxes I11 and I13 (a pod that does not exist carries no mark and
// can be handed to no one) and the liveness check on a held pod's pool: a
// name whose pod is gone is a lost pod, kept as any lost pod is
// (WithReplaceLost drops those), whatever its pool.
func (m *mmMachine) exemptGonePod(pod *mmPod) bool {
	return pod == nil && m.use(exGonePod)
}

// exemptUnfenced reports whether pod marks are off. It relaxes I11 and
// I13, and the liveness checks on marks: without pod marks nothing fences
// a record, and DESIGN I11 and I13 are stated for pod marks.
func (m *mmMachine) exemptUnfenced() bool {
	return !m.marks && m.use(exUnfenced)
}

// exemptUncertainKept reports whether I13 lets the record of c hold a pod
// that was uncertain (d) because c is the claim it was uncertain for. It
// relaxes I13, which forbids handing an uncertain pod out: a claim keeping
// a pod it held is no hand-out (an allocator marks a held pod that lacked
// its mark for its own claim, and WithPodMarkMigration trusts the record).
func (m *mmMachine) exemptUncertainKept(d mmDirty, c *mmClaim) bool {
	return d.claim == c.uid && m.use(exUncertainKept)
}

// exemptCertainAgain reports whether a pod marked for claim c, whose record
// is the only one holding it, has a certain holder again: it is no longer
// uncertain. It relaxes I13 for the pod's later hand-outs: those follow a
// release through the recycler like any other, and the hand-out that made
// it certain was checked when it was made (exemptUncertainKept). m.mu held.
func (m *mmMachine) exemptCertainAgain(pod *mmPod, c *mmClaim, holders int) bool {
	if c == nil || !slices.Contains(c.held, pod.name) || holders != 1 {
		return false
	}
	if _, ok := m.dirty[pod.uid]; ok {
		m.use(exCertainAgain)
	}
	return true
}

// exemptRecycledUnderMark reports whether pod was recycled under the mark
// it carries now. It relaxes I13: DESIGN I13 asks for a recycle before
// reuse, and a record may still list the pod when it is recycled, so the
// mark left until the release is recorded does not make it uncertain
// again. m.mu held.
func (m *mmMachine) exemptRecycledUnderMark(pod *mmPod) bool {
	return m.recycledUnder[pod.uid] == pod.mark && m.use(exRecycledUnderMark)
}

// exemptUnexposedMark reports whether pod's mark for claim c, whose record
// lists it neither held nor released, exposed the pod to no one: c's
// record never held it under this mark. It relaxes I13: an allocator
// unmarking its own hand-out whose record write failed leaves the pod as
// clean as it was when marked. m.mu held.
func (m *mmMachine) exemptUnexposedMark(pod *mmPod, c *mmClaim) bool {
	return m.exposed[pod.uid] != c.uid && m.use(exUnexposedMark)
}

// exemptRecycleGone reports whether the pod a recycle request is for no
// longer exists: no pod has its name (found false), or the one that has it
// has another UID (a pod recreated under the name, DESIGN I12). It
// relaxes the recycler's live-mark check (checkRecycleMark): a pod that is
// gone carries no mark, the allocator may learn it only from its next
// listing (a pod that left the listing counts as recycled without a
// call), and a recycler that uses the request's UID as a precondition, as
// allocator.RecycleDelete does, touches no other pod. It also relaxes the
// check when the pod changed since the fence the call rests on
// (recycle-superseded): the fence proves the mark at that version only.
func (m *mmMachine) exemptRecycleGone(req allocator.RecycleRequest, pod *corev1.Pod, found bool) bool {
	switch {
	case !found:
		return m.use(exRecycleGone)
	case req.UID != "" && pod.UID != req.UID:
		return m.use(exRecycleRecreated)
	case req.ResourceVersion != "" && pod.ResourceVersion != req.ResourceVersion:
		// The fence proved the mark at req.ResourceVersion; the pod has
		// changed since (another allocator recycled it for the same claim
		// at once and released it, say). Nothing can fence a recycler
		// call that writes nothing beyond that moment: a recycler that
		// acts on the pod takes req.ResourceVersion as a precondition
		// (allocator.RecycleRequest), and it fails then.
		return m.use(exRecycleSuperseded)
	}
	return false
}

// dropReasons says why the record of c, holding pod p in st, may stop
// holding it without its owner's say (I7): the claim is terminating (its
// pods all go back, I8), holds more than it wants (I3), the pod is lost
// (gone, unready or terminating), not marked for the claim (pod marks on:
// an allocator that finds a mark naming another claim drops its belief,
// DESIGN "Many allocators"), or of another pool than the claim's. ok is
// false when none applies.
func (m *mmMachine) dropReasons(st *mmState, c *mmClaim, p string) (e mmExemption, ok bool) {
	pod := st.pods[p]
	switch {
	case c.terminating:
		return exTerminating, true
	case len(c.held) > c.want:
		return exBeyondWant, true
	case pod == nil || !pod.ready || pod.terminating:
		return exLost, true
	case m.marks && pod.mark != c.mark():
		return exUnmarked, true
	case m.podPool[p] != c.pool:
		return exOtherPool, true
	}
	return 0, false
}

// exemptDrop reports whether I7 lets the record of c, live or terminating,
// stop holding pod p, which st shows it no longer holds: c is
// terminating, a reason was seen while the record held it (mayGo: the
// owner's release annotation, dropReasons, or the pod recreated), or the
// pod is lost or not marked for c now (the drop may follow the loss in
// the same write). m.mu held.
func (m *mmMachine) exemptDrop(st *mmState, c *mmClaim, p string) bool {
	if c.terminating {
		return m.use(exTerminating)
	}
	if e, ok := m.mayGo[mmPair{c.uid, p}]; ok {
		return m.use(e)
	}
	switch pod := st.pods[p]; {
	case pod == nil || !pod.ready || pod.terminating:
		return m.use(exLost)
	case m.marks && pod.mark != c.mark():
		return m.use(exUnmarked)
	}
	return false
}

// exemptOpenSandboxWant reports whether the history runs WithOpenSandbox,
// where Want bounds what a record lists, held or released, over the
// claim's lifetime: a lower Want takes nothing back, and a pod the record
// lists already is not handed to it again. It relaxes the liveness check
// of I3 (holds at most, and is short only while no pod is free), which
// then counts the pods listed, and a pod only for a short claim whose
// record does not list it.
func (m *mmMachine) exemptOpenSandboxWant() bool {
	return mmOpenSandbox && m.use(exOpenSandboxWant)
}

// ---- limits ----

// limitUnfencedOneProcess reports whether at most one allocator process
// may run: without pod marks nothing fences two processes (a documented
// limit of WithPodMarks(false)), so a history without marks starts one,
// fails it over to a late joiner, and runs both rounds of a concurrent pair
// on it.
func (m *mmMachine) limitUnfencedOneProcess() bool {
	return !m.marks && m.use(limUnfencedOneProcess)
}

// limitUnfencedFreshRecovery reports whether al's first round of pool must
// get a fresh listing: without pod marks nothing fences a recovery from
// stale records (a documented limit of WithPodMarks(false)).
func (m *mmMachine) limitUnfencedFreshRecovery(al *mmAlloc, pool string) bool {
	return !m.marks && al.seen[pool] == nil && m.use(limUnfencedFreshRecovery)
}

// limitLag bounds a drawn lag (how many listings behind the newest) by
// usable-1: the allocator's contract bounds a listing's lag by
// allocator.DefaultQuarantine, so listings superseded a Quarantine ago or
// more are not drawn.
func (m *mmMachine) limitLag(drawn, usable int) int {
	if drawn > usable-1 {
		m.use(limLagWithinQuarantine)
		return usable - 1
	}
	return drawn
}

// usable counts the newest snapshots (of n) that lag less than a
// Quarantine at now (see limitLag).
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

// limitMarksSwitchListsAfresh drops the listings kept for lagging rounds
// when pod marks are switched on: processes that start with pod marks list
// afresh, so no listing they act on dates from before the switch (a
// documented condition of the switch; an older one may not show a record
// written without marks, and nothing then fences the pods it lists).
// m.mu held.
func (m *mmMachine) limitMarksSwitchListsAfresh() {
	m.use(limMarksSwitchAfresh)
	m.podSnaps, m.claimSnaps = nil, nil
	m.snapshot(m.cur)
}

// limitPremarkClaim reports whether the record of claim lists a pod
// written without pod marks that no allocator has marked since. Such a
// claim is not force-deleted or moved to another pool: nothing ties those
// pods to it once it is gone from the pool (a documented limit of records
// written without pod marks, README, guarantee 6).
func (m *mmMachine) limitPremarkClaim(claim types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for pair := range m.exemptPremark {
		if pair.claim == claim {
			return m.use(limPremarkClaim)
		}
	}
	return false
}

// limitUnfencedNoMoves reports whether no claim may move to another pool:
// without pod marks nothing tells the old pool that a moved claim's pods
// are dirty (a documented limit of WithPodMarks(false)).
func (m *mmMachine) limitUnfencedNoMoves() bool {
	return !m.marks && m.use(limUnfencedNoMoves)
}
