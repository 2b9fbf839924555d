package allocator

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/store"
)

// Pod marks (WithPodMarks). A mark is an annotation on the pod naming the
// claim it was handed to, as "<claim name>/<claim uid>". It is written,
// guarded by the pod's resourceVersion, before the claim's record, and
// removed after the pod's release is recorded. A marked pod is never a
// candidate.

func markValue(h store.Holder) string { return h.Claim.Name + "/" + string(h.UID) }

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

// patchMark sets (value != "") or removes the mark of pod, guarded by rv.
// It returns the pod's new resourceVersion and mark.
func (r *round) patchMark(pod, rv, value string) (string, string, error) {
	var v any
	if value != "" {
		v = value
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": rv,
		"annotations":     map[string]any{r.a.cfg.markKey: v},
	}})
	if err != nil {
		return "", "", err
	}
	p := &corev1.Pod{}
	p.Namespace, p.Name = r.p.name.Namespace, pod
	if err := r.a.cfg.client.Patch(r.ctx, p, client.RawPatch(types.MergePatchType, body)); err != nil {
		return "", "", err
	}
	return p.ResourceVersion, p.Annotations[r.a.cfg.markKey], nil
}

type markJob struct {
	w     *write // nil for a recovered pod marked after the fact
	pi    *podInfo
	value string
	rv    string
	mark  string
	err   error
}

// markPods marks the pods the round is about to hand out, and recovered
// held pods that carry no mark yet. A pod whose mark cannot be written is
// not handed out this round.
func (r *round) markPods(writes []*write) {
	if r.a.cfg.markKey == "" {
		return
	}
	var jobs []*markJob
	for _, w := range writes {
		for _, name := range w.add {
			jobs = append(jobs, &markJob{w: w, pi: r.p.pods[name], value: markValue(w.ci.holder())})
		}
	}
	for name, uid := range r.p.tomark {
		pi := r.p.pods[name]
		if pi == nil || !pi.present || pi.holder == nil || pi.holder.uid != uid || pi.mark != "" {
			delete(r.p.tomark, name)
			continue
		}
		jobs = append(jobs, &markJob{pi: pi, value: markValue(pi.holder.holder())})
	}
	r.parallel(len(jobs), func(i int) {
		j := jobs[i]
		j.rv, j.mark, j.err = r.patchMark(j.pi.name, j.pi.rv, j.value)
	})
	for _, j := range jobs {
		pi := j.pi
		if j.w == nil {
			delete(r.p.tomark, pi.name)
		}
		if j.err == nil {
			pi.stalePodRV(pi.rv)
			pi.rv, pi.mark = j.rv, j.mark
			if j.w != nil {
				j.w.marked = append(j.w.marked, pi.name)
			}
			continue
		}
		if !definite(j.err) {
			// Maybe marked: keep it out of the pool until a listing or
			// the unmark below says otherwise.
			pi.mark = j.value
			r.p.unmark[pi.name] = types.UID(j.value[strings.LastIndexByte(j.value, '/')+1:])
			r.p.refreshFree(pi)
		}
		if j.w != nil {
			j.w.add = slices.DeleteFunc(j.w.add, func(n string) bool { return n == pi.name })
			r.errs = append(r.errs, r.claimErr(j.w.ci, fmt.Errorf("%w: mark pod %s: %w", ErrWrite, pi.name, j.err)))
		}
	}
}

// unmarkPods removes the marks of pods this allocator freed. A mark that
// names another claim now is not ours to remove.
func (r *round) unmarkPods() {
	if r.a.cfg.markKey == "" || len(r.p.unmark) == 0 {
		return
	}
	var jobs []*markJob
	for name, uid := range r.p.unmark {
		pi := r.p.pods[name]
		if pi == nil || !pi.present || pi.mark == "" || pi.markUID(r.p.name) != uid || pi.holder != nil || pi.reservedBy != nil {
			delete(r.p.unmark, name)
			if pi != nil {
				r.p.refreshFree(pi)
			}
			continue
		}
		jobs = append(jobs, &markJob{pi: pi})
	}
	r.parallel(len(jobs), func(i int) {
		j := jobs[i]
		j.rv, j.mark, j.err = r.patchMark(j.pi.name, j.pi.rv, "")
	})
	for _, j := range jobs {
		pi := j.pi
		switch {
		case j.err == nil:
			pi.stalePodRV(pi.rv)
			pi.rv, pi.mark = j.rv, j.mark
			delete(r.p.unmark, pi.name)
			r.p.refreshFree(pi)
		case apierrors.IsNotFound(j.err):
			delete(r.p.unmark, pi.name)
		default:
			// Retried next round, on the pod as the next listing shows it.
			r.errs = append(r.errs, fmt.Errorf("pool %s: pod %s: unmark: %w", r.p.name, pi.name, j.err))
		}
	}
}

// stalePodRV remembers a resourceVersion the pod had before a write of
// ours, so that a lagging listing showing it does not undo the write.
func (pi *podInfo) stalePodRV(rv string) {
	if rv == "" {
		return
	}
	if len(pi.oldRVs) == maxRVs {
		copy(pi.oldRVs, pi.oldRVs[1:])
		pi.oldRVs = pi.oldRVs[:maxRVs-1]
	}
	pi.oldRVs = append(pi.oldRVs, rv)
}

// recoverMarks reconciles the records read at recovery with the pods'
// marks:
//   - a pod a record lists but whose mark names another claim, or that
//     carries no mark, is not believed to be the record's (reported as
//     untrusted); with WithPodMarkMigration an unmarked one is believed
//     (records from before marks were enabled) and gets marked;
//   - a pod marked for a claim that is not listed at all (force-deleted or
//     moved while no allocator ran) is adopted for that claim, which is an
//     orphan: the pod is recycled before anyone gets it;
//   - a pod marked for a listed claim whose record does not list it (a
//     record edited by hand, or a write that failed or was cut short after
//     the mark) goes back to that claim if it may still take it; otherwise
//     it is settled like a write of unknown outcome.
func (r *round) recoverMarks(all []found) []found {
	p := r.p
	listed := make(map[types.UID]*found, len(all))
	for i := range all {
		listed[all[i].ci.uid] = &all[i]
	}
	heldBy := make(map[string]types.UID)
	for i := range all {
		f := &all[i]
		var untrusted []string
		f.held = slices.DeleteFunc(f.held, func(pod string) bool {
			pi := p.pods[pod]
			if pi == nil || !pi.present {
				return false // lost; it cannot be handed out anyway
			}
			if pi.mark == "" {
				if !r.a.cfg.markMigrate {
					untrusted = append(untrusted, pod)
					return true
				}
				p.tomark[pod] = f.ci.uid
				return false
			}
			if pi.markUID(p.name) == f.ci.uid {
				return false
			}
			untrusted = append(untrusted, pod)
			return true
		})
		for _, pod := range f.held {
			heldBy[pod] = f.ci.uid
		}
		if len(untrusted) > 0 {
			f.ci.rewrite = true
			f.ci.untrusted = r.claimErr(f.ci, fmt.Errorf("%w: %v do not carry its mark", ErrUntrustedRecord, untrusted))
			r.errs = append(r.errs, f.ci.untrusted)
		}
	}
	orphans := make(map[types.UID]*found)
	for name, pi := range p.pods {
		if pi.mark == "" {
			continue
		}
		h, ok := parseMark(p.name, pi.mark)
		if !ok {
			// Not a mark of ours: leave the pod out of the pool.
			r.errs = append(r.errs, fmt.Errorf("pool %s: pod %s: mark %q is not a claim", p.name, name, pi.mark))
			continue
		}
		if heldBy[name] == h.UID {
			continue
		}
		if f := listed[h.UID]; f != nil {
			// Only the allocator writes marks, so the pod was handed to the
			// claim, or about to be when a write failed or the process
			// stopped. If the claim may still take it (live, room left, the
			// pod ready), the hand-out is completed and the record written
			// again; otherwise it is settled like a write of unknown outcome.
			if !f.ci.terminating && pi.present && pi.ready && len(f.held) < f.ci.want {
				f.held = append(f.held, name)
				f.ci.rewrite = true
			} else {
				pi.reservedBy, pi.reservedUntil = f.ci, r.now
				p.reserved[name] = pi
			}
			continue
		}
		f := orphans[h.UID]
		if f == nil {
			ci := &claimInfo{uid: h.UID, name: h.Claim, held: make(map[string]*podInfo)}
			f = &found{ci: ci}
			orphans[h.UID] = f
		}
		f.held = append(f.held, name)
	}
	for _, f := range orphans {
		all = append(all, *f)
	}
	return all
}
