package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/syncer"
)

// Kind names a kind of disagreement. The values are part of the JSON
// output and do not change.
type Kind string

const (
	// RecordWithoutMark: a claim's record holds a pod whose mark is
	// missing or names another claim, or a pod that is not in the pool.
	RecordWithoutMark Kind = "record-without-mark"
	// MarkWithoutRecord: a pod is marked for a claim whose record does not
	// hold it, for a claim that does not exist, for a claim of another
	// pool, or its mark is not "<claim name>/<claim uid>".
	MarkWithoutRecord Kind = "mark-without-record"
	// PodInTwoRecords: the records of two or more claims hold the pod.
	PodInTwoRecords Kind = "pod-in-two-records"
	// RecordNearLimit: a claim's annotations total more than 80% of
	// syncer.MaxAnnotationsSize; the allocator refuses a record write that
	// would pass the limit, so the claim can hold only a few more pods.
	RecordNearLimit Kind = "record-near-limit"
	// RecordRefused: the syncer refuses the claim's record (malformed, too
	// large, or the owner's release list unreadable); Detail is the
	// syncer's error.
	RecordRefused Kind = "record-refused"
)

// Pod states, PodReport.State.
const (
	StateReady       = "ready"       // the allocator's default readiness rule (allocator.PodReady) holds
	StateNotReady    = "not-ready"   // listed, not being deleted, not ready
	StateTerminating = "terminating" // being deleted
	StateAbsent      = "absent"      // named by a record but not among the pool's pods
)

// nearLimitPercent is the share of syncer.MaxAnnotationsSize above which a
// claim's annotations are reported as RecordNearLimit.
const nearLimitPercent = 80

// Report is what inspect found in one pool. It is also the -json output:
// fields may be added, but none is renamed or removed, and lists are sorted
// (pods and claims by name) so that two runs on the same state print the
// same bytes.
type Report struct {
	// Demo is true when the pool is a demo the command set up itself on an
	// embedded API server, not a pool of a cluster of yours.
	Demo bool `json:"demo"`
	// Namespace and Pool name the pool inspected.
	Namespace string `json:"namespace"`
	Pool      string `json:"pool"`
	// RecordKeys are the claim annotations the records were read from.
	RecordKeys RecordKeys `json:"recordKeys"`
	// MarkKey is the pod annotation read as the pod's mark; empty when the
	// pool is inspected without marks (-marks=false), and then no mark
	// findings are made.
	MarkKey string `json:"markKey"`
	// Pods are the pool's pods (by the pool label), and the pods a record
	// holds that are not in the pool (State "absent").
	Pods []PodReport `json:"pods"`
	// Claims are the claims whose spec.poolRef names the pool.
	Claims []ClaimReport `json:"claims"`
	// Problems are the disagreements found, sorted by pod, kind and
	// claims; empty (never null) when there are none. The command exits 1
	// when there is any.
	Problems []Finding `json:"problems"`
}

// RecordKeys are the annotations of a claim's record (syncer.Keys).
type RecordKeys struct {
	Allocated string `json:"allocated"`
	Release   string `json:"release"`
	Released  string `json:"released"`
}

// PodReport is one row of the pod table.
type PodReport struct {
	Name string `json:"name"`
	// UID is the pod's UID; empty when the pod is absent.
	UID types.UID `json:"uid,omitempty"`
	// State is one of "ready", "not-ready", "terminating", "absent".
	State string `json:"state"`
	// Holders are the claims whose readable records hold the pod (listed
	// as allocated and not as released), sorted. More than one is a
	// PodInTwoRecords finding.
	Holders []string `json:"holders"`
	// ReleaseRequested are the holders whose owner lists the pod in the
	// release annotation: it is being given back.
	ReleaseRequested []string `json:"releaseRequested,omitempty"`
	// Mark is the pod's mark annotation as found; empty when unmarked.
	Mark string `json:"mark,omitempty"`
	// MarkClaim is the claim name the mark names; empty when the pod is
	// unmarked or the mark does not parse as "<claim name>/<claim uid>".
	MarkClaim string `json:"markClaim,omitempty"`
	// HolderUnknown is set when the pod is marked for a claim of the pool
	// whose record the syncer refused: that claim may hold it, and the
	// record's RecordRefused finding says why it cannot be told.
	HolderUnknown bool `json:"holderUnknown,omitempty"`
	// Problems are the kinds of the findings that name this pod.
	Problems []Kind `json:"problems"`
}

// ClaimReport is what a claim's record says.
type ClaimReport struct {
	Name string    `json:"name"`
	UID  types.UID `json:"uid"`
	// Want is spec.replicas.
	Want int32 `json:"want"`
	// Deleting is set when the claim is being deleted.
	Deleting bool `json:"deleting,omitempty"`
	// Held are the pods the record holds (allocated minus released), in
	// the record's order; null when the record was refused.
	Held []string `json:"held"`
	// Release is the owner's release list.
	Release []string `json:"release,omitempty"`
	// AnnotationsBytes is the claim's annotations' total size as the API
	// server counts it (key and value lengths), against
	// syncer.MaxAnnotationsSize.
	AnnotationsBytes int `json:"annotationsBytes"`
	// Error is the syncer's error when it refused the record.
	Error string `json:"error,omitempty"`
	// Problems are the kinds of the findings that name this claim.
	Problems []Kind `json:"problems"`
}

// Finding is one disagreement.
type Finding struct {
	Kind Kind `json:"kind"`
	// Pod is the pod concerned; empty for findings about a claim alone
	// (RecordNearLimit, RecordRefused).
	Pod string `json:"pod,omitempty"`
	// Claims are the claims concerned, by name, sorted; for a mark, the
	// name the mark gives.
	Claims []string `json:"claims"`
	// Detail says what was found, for people.
	Detail string `json:"detail"`
}

func (f Finding) String() string { return string(f.Kind) + ": " + f.Detail }

// options say what to inspect and how its records and marks are kept.
type options struct {
	Pool types.NamespacedName
	// MarkKey is the pods' mark annotation; "" inspects the pool as kept
	// by an allocator with allocator.WithPodMarks(false): records only.
	MarkKey string
	// OpenSandbox reads records under syncer.OpenSandboxKeys() in
	// OpenSandbox's format (syncer.WithOpenSandboxFormat: a pod listed more
	// than once is read as one), as allocator.WithOpenSandbox keeps them.
	OpenSandbox bool
}

// inspect reads the pool's pods and claims through c and reports who holds
// what according to the records and the marks, and where they disagree.
// It only reads (List); c is a client.Client because the syncer that reads
// the records is built on one. An error means the pool could not be listed;
// anything wrong with the records or marks is a finding in the report.
func inspect(ctx context.Context, c client.Client, opts options) (Report, error) {
	s, err := newSyncer(c, opts.OpenSandbox)
	if err != nil {
		return Report{}, err
	}
	ns := opts.Pool.Namespace
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{testenv.PoolLabel: opts.Pool.Name}); err != nil {
		return Report{}, fmt.Errorf("list pods of pool %s: %w", opts.Pool, err)
	}
	var claims testenv.ClaimList
	if err := c.List(ctx, &claims, client.InNamespace(ns)); err != nil {
		if meta.IsNoMatchError(err) {
			err = fmt.Errorf("the claim CRD (%s) is not installed: %w", testenv.ClaimGVK.GroupKind(), err)
		}
		return Report{}, fmt.Errorf("list claims of namespace %s: %w", ns, err)
	}
	return analyze(s, opts, pods.Items, claims.Items), nil
}

func newSyncer(c client.Client, openSandbox bool) (*syncer.AnnotationSyncer, error) {
	if openSandbox {
		return syncer.NewAnnotationSyncer(c, syncer.OpenSandboxKeys(), syncer.WithOpenSandboxFormat())
	}
	return syncer.NewAnnotationSyncer(c, syncer.DefaultKeys())
}

// claimState is what analyze knows of a claim of the namespace.
type claimState struct {
	obj    *testenv.Claim
	inPool bool
	rec    syncer.Record
	// readable is false when the syncer refused the record's allocated or
	// released list: which pods the claim holds cannot be told.
	readable bool
}

// analyze is inspect without the API server: pods are the pool's pods,
// claims all claims of the pool's namespace.
func analyze(s *syncer.AnnotationSyncer, opts options, pods []corev1.Pod, claims []testenv.Claim) Report {
	keys := s.Keys()
	rep := Report{
		Namespace:  opts.Pool.Namespace,
		Pool:       opts.Pool.Name,
		RecordKeys: RecordKeys{Allocated: keys.Allocated, Release: keys.Release, Released: keys.Released},
		MarkKey:    opts.MarkKey,
		Pods:       []PodReport{},
		Claims:     []ClaimReport{},
	}
	var problems []Finding
	add := func(kind Kind, pod string, claims []string, format string, args ...any) {
		problems = append(problems, Finding{Kind: kind, Pod: pod, Claims: claims, Detail: fmt.Sprintf(format, args...)})
	}

	// The claims: the namespace's by UID (a mark names a UID), the pool's
	// records read through the syncer.
	byUID := make(map[types.UID]*claimState, len(claims))
	byName := make(map[string]*claimState, len(claims))
	holders := map[string][]*claimState{} // pod name -> claims whose record holds it
	var poolClaims []*claimState
	for i := range claims {
		cs := &claimState{obj: &claims[i], inPool: claims[i].Spec.PoolRef == opts.Pool.Name}
		byUID[cs.obj.UID], byName[cs.obj.Name] = cs, cs
		if cs.inPool {
			poolClaims = append(poolClaims, cs)
		}
	}
	slices.SortFunc(poolClaims, func(a, b *claimState) int { return strings.Compare(a.obj.Name, b.obj.Name) })
	for _, cs := range poolClaims {
		cl := cs.obj
		cr := ClaimReport{Name: cl.Name, UID: cl.UID, Want: cl.Spec.Replicas, Deleting: cl.DeletionTimestamp != nil,
			AnnotationsBytes: annotationsSize(cl.Annotations)}
		if cr.AnnotationsBytes*100 > syncer.MaxAnnotationsSize*nearLimitPercent {
			add(RecordNearLimit, "", []string{cl.Name}, "claim %s's annotations total %d bytes, %d%% of the API server's limit of %d: a record write that would pass it is refused",
				cl.Name, cr.AnnotationsBytes, cr.AnnotationsBytes*100/syncer.MaxAnnotationsSize, syncer.MaxAnnotationsSize)
		}
		rec, err := s.Read(cl)
		// An unreadable release list alone leaves the record usable (the
		// allocator ignores the list for that claim); anything else does not.
		cs.readable = err == nil || errors.Is(err, syncer.ErrMalformedRelease)
		if err != nil {
			cr.Error = err.Error()
			add(RecordRefused, "", []string{cl.Name}, "%v", err)
		}
		if cs.readable {
			cs.rec = rec
			cr.Held = rec.Held()
			if cr.Held == nil {
				cr.Held = []string{} // null means refused
			}
			cr.Release = rec.Release
			for _, pod := range cr.Held {
				holders[pod] = append(holders[pod], cs)
			}
		}
		rep.Claims = append(rep.Claims, cr)
	}

	// The pods: every pod of the pool, and every pod a record holds.
	byPod := make(map[string]*corev1.Pod, len(pods))
	for i := range pods {
		byPod[pods[i].Name] = &pods[i]
	}
	names := slices.Sorted(maps.Keys(byPod))
	for pod := range holders {
		if byPod[pod] == nil {
			names = append(names, pod)
		}
	}
	slices.Sort(names)
	marks := opts.MarkKey != ""
	for _, name := range names {
		p := byPod[name]
		pr := PodReport{Name: name, State: podState(p), Holders: []string{}}
		hs := holders[name]
		for _, cs := range hs {
			pr.Holders = append(pr.Holders, cs.obj.Name)
			if slices.Contains(cs.rec.Release, name) {
				pr.ReleaseRequested = append(pr.ReleaseRequested, cs.obj.Name)
			}
		}
		if len(hs) > 1 {
			add(PodInTwoRecords, name, pr.Holders, "pod %s is held in the records of claims %s", name, strings.Join(pr.Holders, ", "))
		}
		if marks && p != nil {
			pr.Mark = p.Annotations[opts.MarkKey]
		}
		markName, markUID, parsed := parseMark(pr.Mark)
		pr.MarkClaim = markName
		if !marks {
			rep.Pods = append(rep.Pods, pr)
			continue
		}
		for _, cs := range hs {
			switch {
			case p == nil:
				add(RecordWithoutMark, name, []string{cs.obj.Name}, "claim %s's record holds pod %s, which is not in the pool", cs.obj.Name, name)
			case pr.Mark == "":
				add(RecordWithoutMark, name, []string{cs.obj.Name}, "claim %s's record holds pod %s, which has no mark", cs.obj.Name, name)
			case !parsed:
				add(RecordWithoutMark, name, []string{cs.obj.Name}, "claim %s's record holds pod %s, whose mark %q names no claim", cs.obj.Name, name, pr.Mark)
			case markUID != cs.obj.UID:
				add(RecordWithoutMark, name, []string{cs.obj.Name}, "claim %s's record holds pod %s, whose mark names %s", cs.obj.Name, name, describeMark(markName, markUID, byUID))
			}
		}
		if pr.Mark != "" && !slices.ContainsFunc(hs, func(cs *claimState) bool { return parsed && cs.obj.UID == markUID }) {
			cs := byUID[markUID]
			switch {
			case !parsed:
				add(MarkWithoutRecord, name, []string{}, "pod %s's mark %q is not <claim name>/<claim uid>", name, pr.Mark)
			case cs == nil:
				detail := fmt.Sprintf("pod %s is marked for claim %s (uid %s), which does not exist", name, markName, markUID)
				if other := byName[markName]; other != nil {
					detail += fmt.Sprintf(" (a claim %s with uid %s does: recreated under the old name)", markName, other.obj.UID)
				}
				add(MarkWithoutRecord, name, []string{markName}, "%s", detail)
			case !cs.inPool:
				add(MarkWithoutRecord, name, []string{markName}, "pod %s is marked for claim %s, a claim of pool %q, not of this one", name, markName, cs.obj.Spec.PoolRef)
			case !cs.readable:
				pr.HolderUnknown = true // the claim's RecordRefused finding covers it
			case slices.Contains(cs.rec.Released, name):
				add(MarkWithoutRecord, name, []string{markName}, "pod %s is marked for claim %s, whose record lists it as released", name, markName)
			default:
				add(MarkWithoutRecord, name, []string{markName}, "pod %s is marked for claim %s, whose record does not hold it", name, markName)
			}
		}
		rep.Pods = append(rep.Pods, pr)
	}

	slices.SortStableFunc(problems, func(a, b Finding) int {
		return cmp.Or(strings.Compare(a.Pod, b.Pod), strings.Compare(string(a.Kind), string(b.Kind)),
			slices.Compare(a.Claims, b.Claims), strings.Compare(a.Detail, b.Detail))
	})
	rep.Problems = append([]Finding{}, problems...)
	podRow := make(map[string]*PodReport, len(rep.Pods))
	for i := range rep.Pods {
		podRow[rep.Pods[i].Name] = &rep.Pods[i]
		rep.Pods[i].Problems = []Kind{}
	}
	claimRow := make(map[string]*ClaimReport, len(rep.Claims))
	for i := range rep.Claims {
		claimRow[rep.Claims[i].Name] = &rep.Claims[i]
		rep.Claims[i].Problems = []Kind{}
	}
	for _, f := range rep.Problems {
		if pr := podRow[f.Pod]; pr != nil && !slices.Contains(pr.Problems, f.Kind) {
			pr.Problems = append(pr.Problems, f.Kind)
		}
		for _, name := range f.Claims {
			if cr := claimRow[name]; cr != nil && !slices.Contains(cr.Problems, f.Kind) {
				cr.Problems = append(cr.Problems, f.Kind)
			}
		}
	}
	return rep
}

// parseMark splits a mark, "<claim name>/<claim uid>", as the allocator
// writes it; ok is false for anything else.
func parseMark(v string) (name string, uid types.UID, ok bool) {
	i := strings.LastIndexByte(v, '/')
	if i <= 0 || i == len(v)-1 {
		return "", "", false
	}
	return v[:i], types.UID(v[i+1:]), true
}

// describeMark names the claim a mark names, for a finding.
func describeMark(name string, uid types.UID, byUID map[types.UID]*claimState) string {
	if cs := byUID[uid]; cs != nil {
		return "claim " + cs.obj.Name
	}
	return fmt.Sprintf("claim %s (uid %s), which does not exist", name, uid)
}

func podState(p *corev1.Pod) string {
	switch {
	case p == nil:
		return StateAbsent
	case p.DeletionTimestamp != nil:
		return StateTerminating
	case allocator.PodReady(p):
		return StateReady
	default:
		return StateNotReady
	}
}

// annotationsSize is the size of annotations as the API server counts it
// against syncer.MaxAnnotationsSize.
func annotationsSize(ann map[string]string) int {
	n := 0
	for k, v := range ann {
		n += len(k) + len(v)
	}
	return n
}
