package allocator_test

// Placement in the single-allocator machine (issue 23): claims draw a
// selector on a pod label, a gang flag and a layout over nodes; pods are
// labelled by their index. Checked after every step: no record lists a
// pod outside its claim's selector. Checked after every round on a current
// listing: a gang handed pods holds all it wants, and a spread claim that
// held nothing holds its pods within its skew.

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/model"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/store"
)

// podSize is the "size" label of the machine's pod number i.
func podSize(i int) string {
	if i%2 == 0 {
		return "small"
	}
	return "large"
}

// podIndex is the number of the machine's pod named name ("<pool>-<i>").
func podIndex(name string) (int, bool) {
	j := strings.LastIndexByte(name, '-')
	if j < 0 {
		return 0, false
	}
	i, err := strconv.Atoi(name[j+1:])
	return i, err == nil
}

// podNode is the node of the machine's pod named name (see addPod).
func podNode(name string) string {
	i, _ := podIndex(name)
	return "node-" + strconv.Itoa(i%3)
}

// drawPlacement draws a claim's placement: often none; else a selector on
// size (with the size as its class), a gang, or a layout over nodes.
func drawPlacement(t *rapid.T) testenv.ClaimSpec {
	var spec testenv.ClaimSpec
	if !rapid.Bool().Draw(t, "placed") {
		return spec
	}
	if size := rapid.SampledFrom([]string{"", "small", "large"}).Draw(t, "selector"); size != "" {
		spec.Selector, spec.Class = map[string]string{"size": size}, size
	}
	spec.Gang = rapid.Bool().Draw(t, "gang")
	switch rapid.IntRange(0, 2).Draw(t, "layout") {
	case 1:
		spec.Topology = &testenv.ClaimTopology{Mode: "Spread", MaxSkew: 1, Relax: rapid.Bool().Draw(t, "relax")}
	case 2:
		spec.Topology = &testenv.ClaimTopology{Mode: "Pack"}
	}
	return spec
}

func placementString(spec testenv.ClaimSpec) string {
	var parts []string
	if len(spec.Selector) > 0 {
		parts = append(parts, fmt.Sprintf("selector %v", spec.Selector))
	}
	if spec.Gang {
		parts = append(parts, "gang")
	}
	if t := spec.Topology; t != nil {
		parts = append(parts, fmt.Sprintf("%s(relax %t)", t.Mode, t.Relax))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// checkSelectors: no record lists, as held, a pod its claim's selector
// does not match (the machine never relabels a pod, so none ever stops
// matching).
func (m *machine) checkSelectors(recs model.Records) error {
	for uid, r := range recs {
		want := m.place[uid].Selector["size"]
		if want == "" {
			continue
		}
		for _, pod := range r.Held {
			if i, ok := podIndex(pod); ok && podSize(i) != want {
				return fmt.Errorf("claim %s selects size=%s and its record holds pod %s of size %s", r.Name, want, pod, podSize(i))
			}
		}
	}
	return nil
}

// checkHandOuts checks a round on a current listing whose writes all
// succeeded: a gang given pods holds all it wants after the round, and a
// spread claim without Relax that held nothing before holds its pods on
// nodes that differ by at most one pod (its MaxSkew).
func (m *machine) checkHandOuts(in allocator.Input, res allocator.Result, pre map[model.Key]types.UID, post map[string]store.Holder) error {
	recycling := make(map[string]bool, len(res.Recycling))
	for _, p := range res.Recycling {
		recycling[p] = true
	}
	wants := make(map[types.UID]int, len(in.Claims))
	for _, c := range in.Claims {
		wants[c.Object.GetUID()] = c.Want
	}
	if err := m.checkGangsServed(in, res, pre, post, recycling, wants); err != nil {
		return err
	}
	for _, g := range res.Allocated {
		spec := m.place[g.UID]
		perNode := map[string]int{}
		n := 0
		for pod, h := range post {
			if h.UID == g.UID && !recycling[pod] {
				n++
				perNode[podNode(pod)]++
			}
		}
		if spec.Gang && n != wants[g.UID] {
			return fmt.Errorf("gang %s was handed %v and holds %d of the %d it wants", g.Claim, g.Pods, n, wants[g.UID])
		}
		if t := spec.Topology; t != nil && t.Mode == "Spread" && !t.Relax {
			heldBefore := false
			for k, uid := range pre {
				if uid == g.UID && k.Namespace == in.Pool.Namespace {
					heldBefore = true
				}
			}
			lo, hi := -1, 0
			for _, c := range perNode {
				if lo < 0 || c < lo {
					lo = c
				}
				hi = max(hi, c)
			}
			if !heldBefore && hi-lo > 1 {
				return fmt.Errorf("spread claim %s was handed %v from nothing and holds %v pods per node, a skew of %d", g.Claim, g.Pods, perNode, hi-lo)
			}
		}
	}
	return nil
}

// checkGangsServed checks the gangs' starvation bound after a clean round
// (docs/design.md §6): a gang left waiting had fewer idle pods its
// selector matches than it lacks, plus what the other waiting gangs may
// hold back (at most what each lacks). Gangs that spread without Relax may
// wait for the skew instead, and are not checked.
func (m *machine) checkGangsServed(in allocator.Input, res allocator.Result, pre map[model.Key]types.UID, post map[string]store.Holder, recycling map[string]bool, wants map[types.UID]int) error {
	lacks := map[types.UID]int{}
	for _, c := range in.Claims {
		uid := c.Object.GetUID()
		if !m.place[uid].Gang || c.Object.GetDeletionTimestamp() != nil {
			continue
		}
		n := 0
		for pod, h := range post {
			if h.UID == uid && !recycling[pod] {
				n++
			}
		}
		if l := wants[uid] - n; l > 0 {
			lacks[uid] = l
		}
	}
	// Pods the round gave back, or that were held or marked before it,
	// became free after its plan.
	freedNow := map[string]bool{}
	for _, g := range res.Released {
		for _, pod := range g.Pods {
			freedNow[pod] = true
		}
	}
	for k := range pre {
		if k.Namespace == in.Pool.Namespace {
			freedNow[k.Name] = true
		}
	}
	for _, pod := range in.Pods {
		if pod.Annotations[allocator.DefaultPodMarkKey] != "" {
			freedNow[pod.Name] = true
		}
	}
	// A gang with a pod marked for it that it does not hold may have that
	// pod on its way (a hand-out of unknown outcome): it waits for the
	// pod to settle (docs/design.md §6).
	onItsWay := map[types.UID]bool{}
	for _, pod := range in.Pods {
		mark := pod.Annotations[allocator.DefaultPodMarkKey]
		if i := strings.LastIndexByte(mark, '/'); i >= 0 {
			if uid := types.UID(mark[i+1:]); post[pod.Name].UID != uid {
				onItsWay[uid] = true
			}
		}
	}
	for uid, l := range lacks {
		spec := m.place[uid]
		if t := spec.Topology; (t != nil && t.Mode == "Spread" && !t.Relax) || onItsWay[uid] {
			continue
		}
		idle := 0
		for _, pod := range res.Idle {
			if freedNow[pod] {
				continue // free only once the plan was made
			}
			if i, ok := podIndex(pod); ok && (spec.Selector["size"] == "" || podSize(i) == spec.Selector["size"]) {
				idle++
			}
		}
		heldBack := 0
		for other, ol := range lacks {
			if other != uid {
				heldBack += ol
			}
		}
		if idle >= l+heldBack {
			return fmt.Errorf("gang %s lacks %d pods while %d idle pods match it and the other waiting gangs hold back at most %d", uid, l, idle, heldBack)
		}
	}
	return nil
}

// checkHookLabels checks, with WithMarkHook(routeHook), that a pod carries
// the hook's label and owner reference only while it is marked, for the
// claim its mark names: a pod is never free (or another claim's) while it
// routes to a claim.
func (m *machine) checkHookLabels() error {
	if !m.hook {
		return nil
	}
	for _, ns := range m.ns {
		var pods corev1.PodList
		if err := m.b.raw.List(m.ctx, &pods, client.InNamespace(ns)); err != nil {
			return fmt.Errorf("list pods: %w", err)
		}
		for _, p := range pods.Items {
			mark := p.Annotations[allocator.DefaultPodMarkKey]
			name, uid, _ := strings.Cut(mark, "/")
			if v, ok := p.Labels[routeLabel]; ok && (mark == "" || v != name) {
				return fmt.Errorf("pod %s/%s carries %s=%s with mark %q", ns, p.Name, routeLabel, v, mark)
			}
			for _, o := range p.OwnerReferences {
				if mark == "" || string(o.UID) != uid {
					return fmt.Errorf("pod %s/%s is owned by claim %s (uid %s) with mark %q", ns, p.Name, o.Name, o.UID, mark)
				}
			}
		}
	}
	return nil
}
