package allocator

import (
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolalloc/poolalloc/store"
)

// Pod marks (WithPodMarks). A mark is an annotation on the pod naming the
// claim it was handed to, as "<claim name>/<claim uid>". It is written,
// guarded by the pod's resourceVersion, before the claim's record, and
// removed after the pod's release is recorded. A marked pod is never a
// candidate.

// markString returns v, a pod's mark, as the key of the claim it names when
// the pool knows that claim: one string for the claim and its pods' marks,
// not one per pod kept from the listing.
func (p *pool) markString(v string) string {
	if h, ok := parseMark(p.name, v); ok {
		if ci := p.claims.Get(string(h.UID)); ci != nil && ci.key == v {
			return ci.key
		}
	}
	return v
}

// parseMark returns the holder a mark names; ok is false for a value that
// is not a mark.
func parseMark(pool types.NamespacedName, v string) (store.Holder, bool) {
	i := strings.LastIndexByte(v, '/')
	if i <= 0 || i == len(v)-1 {
		return store.Holder{}, false
	}
	return store.Holder{UID: types.UID(v[i+1:]), Claim: types.NamespacedName{Namespace: pool.Namespace, Name: v[:i]}}, true
}

// markUID is the claim UID pi's mark names, empty if none.
func (pi *podInfo) markUID(pool types.NamespacedName) types.UID {
	h, _ := parseMark(pool, pi.mark)
	return h.UID
}

// markPatch is the patch that sets (value != "") or removes pod's mark,
// guarded by rv, with e, the mark hook's change (WithMarkHook; nil for
// none). Removing the mark removes the recycling stamp too (see
// fenceRecycle).
func (r *round) markPatch(pod, rv, value string, e *podEdit) *podPatch {
	annotations := map[string]any{r.a.cfg.markKey: value}
	if value == "" {
		annotations = map[string]any{r.a.cfg.markKey: nil, r.a.cfg.stampKey: nil}
	}
	p := &podPatch{name: pod, rv: rv, annotations: annotations}
	if e != nil {
		for k, v := range e.annotations {
			annotations[k] = v
		}
		p.labels, p.owners = e.labels, e.owners
	}
	return p
}

// markPatches returns the mark patches of jobs.
func (r *round) markPatches(jobs []*markJob) []*podPatch {
	patches := make([]*podPatch, len(jobs))
	for i, j := range jobs {
		patches[i] = r.markPatch(j.pi.name(), j.pi.rv, j.value, j.edit)
	}
	return patches
}

// tookPatches sets each job's outcome from its patch.
func tookPatches(jobs []*markJob, patches []*podPatch) {
	for i, j := range jobs {
		j.rv, j.mark, j.labels, j.err = patches[i].newRV, patches[i].mark, patches[i].newLabels, patches[i].err
	}
}

// patchMarks makes the mark patches of jobs, concurrently, and sets each
// job's outcome.
func (r *round) patchMarks(jobs []*markJob) {
	e := effects{patches: r.markPatches(jobs)}
	r.exec(&e)
	tookPatches(jobs, e.patches)
}

type markJob struct {
	ci    *claimInfo
	pi    *podInfo
	value string   // the mark to write; "" removes it
	edit  *podEdit // the mark hook's change, nil for none
	rv    string
	mark  string
	// labels are the pod's labels after a patch that changed them, nil
	// if it changed none.
	labels map[string]string
	err    error
}

// markHeld marks held pods that carry no mark yet: pods a record lists
// without a mark, which the claim holds from now on (WithPodMarkMigration)
// or holds until they are recycled. A pod whose mark was refused stays the
// claim's and is marked on a later round; one that is gone, or whose mark
// may or may not have been written, is dropped, and the record's entry is
// a stray.
func (r *round) markHeld() {
	if !r.marks() || len(r.p.tomark) == 0 {
		return
	}
	var jobs []*markJob
	for name, uid := range r.p.tomark {
		pi := r.p.pods.Get(name)
		holder := r.p.holderOf(pi)
		if pi == nil || !pi.present || holder == nil || holder.uid() != uid || pi.mark != "" && !r.p.overruled(pi, holder) {
			delete(r.p.tomark, name)
			delete(r.p.overrule, name)
			continue
		}
		j := &markJob{ci: holder, pi: pi, value: holder.key}
		if r.a.cfg.markMigrate {
			// Held from now on: it carries what a pod handed to the
			// claim carries. Refused, it stays unmarked until the next
			// round tries again.
			var err error
			if j.edit, err = r.hookEdit(pi, holder.holder(), nil, true); err != nil {
				r.errs = append(r.errs, r.claimErr(holder, err))
				continue
			}
		}
		jobs = append(jobs, j)
	}
	slices.SortFunc(jobs, func(x, y *markJob) int { return strings.Compare(x.pi.name(), y.pi.name()) })
	r.patchMarks(jobs)
	for _, j := range jobs {
		pi := j.pi
		delete(r.p.tomark, pi.name())
		old, overruling := r.p.overrule[pi.name()]
		delete(r.p.overrule, pi.name())
		if j.err == nil {
			r.marked(pi, j.rv, j.mark, j.labels)
			continue
		}
		r.errs = append(r.errs, r.claimErr(j.ci, fmt.Errorf("%w: mark pod %s: %w", ErrWrite, pi.name(), j.err)))
		if definite(j.err) && !apierrors.IsNotFound(j.err) {
			// Not marked (the pod changed since it was listed, say): the
			// claim keeps it, of uncertain use as before, and the mark is
			// tried again on the next round's view of the pod.
			r.p.tomark[pi.name()] = j.ci.uid()
			if overruling {
				r.p.overrule[pi.name()] = old
			}
			continue
		}
		r.drop(j.ci, pi)
		r.addStray(j.ci, pi.name())
		if !definite(j.err) {
			// Maybe marked: if so, it is settled for the claim once a
			// listing shows the mark.
			pi.mark, pi.markOwn, pi.markRV = j.value, false, 0
			r.queueUnmark(pi, j.ci.uid(), fenceGone)
			r.p.refresh(pi)
		}
	}
}

// marked records that the allocator wrote pi's mark at resourceVersion rv,
// and, if the write changed them (WithMarkHook), its labels: a listing at
// rv is not read again, so it would not show them.
func (r *round) marked(pi *podInfo, rv, mark string, labels map[string]string) {
	pi.stalePodRV(pi.rv)
	pi.rv, pi.mark = rv, r.p.markString(mark)
	pi.markOwn, pi.markRV = mark != "", 0
	if mark != "" {
		pi.markRV = rvNum(rv)
	}
	if labels != nil {
		node := ""
		if pi.place != nil {
			node = pi.place.node
		}
		pi.place = r.p.placeOf(node, labels, r.a.cfg.nodeLabels)
	}
	r.p.refresh(pi)
}

// markJobs returns the marks w's hand-out needs: one per pod it adds,
// with the mark hook's change. A pod whose change is refused is not
// handed out this round (a gang then gets none).
func (r *round) markJobs(w *write) []*markJob {
	if !r.marks() || len(w.add) == 0 {
		return nil
	}
	var jobs []*markJob
	var refused []string
	for _, name := range w.add {
		pi := r.p.pods.Get(name)
		e, err := r.hookEdit(pi, w.ci.holder(), w.ci.placement().Selector, true)
		if err != nil {
			// Not marked, not handed out: the pod stays free.
			r.errs = append(r.errs, r.claimErr(w.ci, err))
			refused = append(refused, name)
			continue
		}
		jobs = append(jobs, &markJob{ci: w.ci, pi: pi, value: w.ci.key, edit: e})
	}
	switch {
	case len(refused) == 0:
	case w.ci.placement().Gang:
		w.add = nil
		return nil
	default:
		w.add = slices.DeleteFunc(w.add, func(n string) bool { return slices.Contains(refused, n) })
	}
	return jobs
}

// tookMarks takes in the outcomes of w's marks (jobs, made by patches):
// a pod whose mark could not be written is not handed out this round,
// and a gang gets none of its pods unless every mark was written (the
// marks written are removed once apply finds them in no record,
// w.marked).
func (r *round) tookMarks(w *write, jobs []*markJob, patches []*podPatch) {
	tookPatches(jobs, patches)
	n := len(w.add)
	for _, j := range jobs {
		pi := j.pi
		if j.err == nil {
			r.marked(pi, j.rv, j.mark, j.labels)
			w.marked = append(w.marked, pi.name())
			continue
		}
		if !definite(j.err) {
			// Maybe marked: keep it out of the pool until a listing or
			// the unmark says otherwise. No record lists it, and none
			// can while it is marked for the claim.
			pi.mark, pi.markOwn, pi.markRV = j.value, false, 0
			r.queueUnmark(pi, j.ci.uid(), fenceGone)
			r.p.refresh(pi)
		}
		w.add = slices.DeleteFunc(w.add, func(n string) bool { return n == pi.name() })
		r.errs = append(r.errs, r.claimErr(w.ci, fmt.Errorf("%w: mark pod %s: %w", ErrWrite, pi.name(), j.err)))
	}
	if len(w.add) < n && w.ci.placement().Gang {
		w.add = nil
	}
}

// unmarkPods removes the marks queued in the pool's unmark set. A mark that
// names another claim now is not ours to remove, and one newer than the
// record version that justified the removal is looked at again.
func (r *round) unmarkPods() {
	if !r.marks() || len(r.p.unmark) == 0 {
		return
	}
	var jobs []*markJob
	var again []*podInfo
	for name, e := range r.p.unmark {
		pi := r.p.pods.Get(name)
		if pi == nil || !pi.present || pi.mark == "" || pi.markUID(r.p.name) != e.uid ||
			r.p.holderOf(pi) != nil || pi.reservedBy() != nil || pi.settling() != nil {
			delete(r.p.unmark, name)
			if pi != nil {
				r.p.refresh(pi)
				again = append(again, pi)
			}
			continue
		}
		if e.fence != fenceGone && (pi.markRV == 0 || e.fence <= pi.markRV) {
			delete(r.p.unmark, name)
			again = append(again, pi)
			continue
		}
		h, _ := parseMark(r.p.name, pi.mark)
		edit, err := r.hookEdit(pi, h, nil, false)
		if err != nil {
			// Kept marked: a pod goes back to the pool only without the
			// claim's change. Tried again next round.
			r.errs = append(r.errs, fmt.Errorf("pool %s: %w", r.p.name, err))
			continue
		}
		jobs = append(jobs, &markJob{pi: pi, edit: edit})
	}
	slices.SortFunc(jobs, func(x, y *markJob) int { return strings.Compare(x.pi.name(), y.pi.name()) })
	r.patchMarks(jobs) // value "": remove
	for _, j := range jobs {
		pi := j.pi
		switch {
		case j.err == nil:
			r.marked(pi, j.rv, j.mark, j.labels)
			delete(r.p.unmark, pi.name())
		case apierrors.IsNotFound(j.err):
			delete(r.p.unmark, pi.name())
		case apierrors.IsConflict(j.err):
			// The pod changed meanwhile: retried next round, on the pod as
			// the next listing shows it. Nothing went wrong.
			r.warn(fmt.Errorf("pool %s: pod %s: %w: unmark retried next round: %w", r.p.name, pi.name(), ErrWrite, j.err))
		default:
			// Retried next round too, but the API server refused it.
			r.errs = append(r.errs, fmt.Errorf("pool %s: pod %s: %w: unmark: %w", r.p.name, pi.name(), ErrWrite, j.err))
		}
	}
	for _, pi := range again {
		r.resolveMark(pi)
	}
}

// stalePodRV remembers a resourceVersion the pod had before a write of
// ours, so that a lagging listing showing it does not undo the write.
func (pi *podInfo) stalePodRV(rv string) {
	if rv == "" {
		return
	}
	m := pi.edit()
	if len(m.oldRVs) == maxRVs {
		copy(m.oldRVs, m.oldRVs[1:])
		m.oldRVs = m.oldRVs[:maxRVs-1]
	}
	m.oldRVs = append(m.oldRVs, rv)
}
