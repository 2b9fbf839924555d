package allocator

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/internal/testenv"
)

// lookupScan is what scan means, without its shortcuts: each pod, then
// each claim, of the listing in its order, found by a lookup in the pool's
// index, a pod's UID compared by content (its entry's uidRef left as it
// was). It returns the places of those to observe, or the first error.
func lookupScan(r *round, pods []corev1.Pod, claims []Claim) (podsTaken, claimsTaken []int, err error) {
	var newPods map[string]struct{}
	for j := range pods {
		hd := headOfPod(&pods[j])
		var pi *podInfo
		if hd.name != "" {
			pi = r.p.pods.Get(hd.name)
		}
		var uidRef string
		if pi != nil {
			uidRef, pi.uidRef = pi.uidRef, ""
		}
		take, err := r.scanPod(j, &pods[j], &hd, pi, nil, &newPods)
		if pi != nil {
			pi.uidRef = uidRef
		}
		if err != nil {
			return nil, nil, err
		}
		if take {
			podsTaken = append(podsTaken, j)
		}
	}
	var newClaims map[types.UID]struct{}
	for i := range claims {
		hd := headOfClaim(&claims[i])
		var ci *claimInfo
		if hd.uid != "" {
			ci = r.p.claims.Get(string(hd.uid))
		}
		take, err := r.scanClaim(i, &claims[i], &hd, ci, nil, &newClaims)
		if err != nil {
			return nil, nil, err
		}
		if take {
			claimsTaken = append(claimsTaken, i)
		}
	}
	return podsTaken, claimsTaken, nil
}

// unorderedScanOf is scan with the hint off from the start: the whole
// listing through scanUnordered.
func unorderedScanOf(r *round, pods []corev1.Pod, claims []Claim) (podsTaken, claimsTaken []int, err error) {
	var newPods map[string]struct{}
	changed, err := r.scanPodsUnordered(pods, 0, nil, &newPods)
	if err != nil {
		return nil, nil, err
	}
	var newClaims map[types.UID]struct{}
	claimsTaken, err = r.scanClaimsUnordered(claims, 0, nil, &newClaims)
	return placesOfPods(pods, changed), claimsTaken, err
}

// placesOfPods returns the places in pods of the pods changed points to.
func placesOfPods(pods []corev1.Pod, changed []*corev1.Pod) []int {
	var places []int
	for _, pod := range changed {
		for j := range pods {
			if &pods[j] == pod {
				places = append(places, j)
			}
		}
	}
	return places
}

// scanOf is scan as a round calls it (the hint, then scanUnordered if it
// misses too often), with the pods to observe as places in pods.
func scanOf(r *round, pods []corev1.Pod, claims []Claim) (podsTaken, claimsTaken []int, err error) {
	changed, claimsTaken, err := r.scan(pods, claims)
	if err != nil {
		return nil, nil, err
	}
	return placesOfPods(pods, changed), claimsTaken, nil
}

// listingDraw makes listings of a pool for the property below: its pods
// and claims as listed last, changed, copied, doubled or spoilt.
type listingDraw struct {
	ns   string
	next int
}

func (d *listingDraw) pod(name string) corev1.Pod {
	d.next++
	pod := corev1.Pod{}
	pod.Namespace, pod.Name = d.ns, name
	pod.UID = types.UID("pod-uid-" + strconv.Itoa(d.next))
	pod.ResourceVersion = strconv.Itoa(d.next)
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	return pod
}

func (d *listingDraw) claim(name string) Claim {
	d.next++
	cl := testenv.NewClaim(d.ns, name, "p", 0)
	cl.UID = types.UID("claim-uid-" + strconv.Itoa(d.next))
	cl.ResourceVersion = strconv.Itoa(d.next)
	return Claim{Object: cl}
}

// copied is s with the same bytes at another address.
func copied(s string) string { return strings.Clone(s + "x")[:len(s)] }

// listing draws a listing from base: each pod and claim kept as it is,
// with its strings copied, changed, left out or listed twice; new ones;
// once in a while one that is refused; all in a drawn order.
func (d *listingDraw) listing(t *rapid.T, base Input) Input {
	out := Input{Pool: base.Pool}
	for i, pod := range base.Pods {
		switch rapid.IntRange(0, 9).Draw(t, fmt.Sprintf("pod %d", i)) {
		case 0:
			continue // gone
		case 1:
			pod.Name, pod.UID = copied(pod.Name), types.UID(copied(string(pod.UID)))
		case 2:
			d.next++
			pod.ResourceVersion = strconv.Itoa(d.next) // changed
		case 3:
			pod = d.pod(pod.Name) // a new pod under the name
		case 6:
			d.next++
			pod.UID = types.UID("pod-uid-" + strconv.Itoa(d.next)) // a new pod, the other strings the same
		case 4:
			out.Pods = append(out.Pods, pod) // twice, the same strings
		case 5:
			twin := pod
			twin.Name = copied(pod.Name)
			out.Pods = append(out.Pods, twin) // twice, another string
		}
		out.Pods = append(out.Pods, pod)
	}
	for range rapid.IntRange(0, 3).Draw(t, "new pods") {
		out.Pods = append(out.Pods, d.pod("new-"+strconv.Itoa(d.next)))
	}
	for i, c := range base.Claims {
		switch rapid.IntRange(0, 9).Draw(t, fmt.Sprintf("claim %d", i)) {
		case 0:
			continue
		case 1:
			cl := c.Object.DeepCopyObject().(*testenv.Claim)
			cl.UID = types.UID(copied(string(cl.UID)))
			c.Object = cl
		case 2:
			cl := c.Object.DeepCopyObject().(*testenv.Claim)
			d.next++
			cl.ResourceVersion = strconv.Itoa(d.next)
			c.Object = cl
		case 3:
			c.Want = 1 - c.Want // Want alone changed
		case 4:
			out.Claims = append(out.Claims, c)
		}
		out.Claims = append(out.Claims, c)
	}
	for range rapid.IntRange(0, 2).Draw(t, "new claims") {
		out.Claims = append(out.Claims, d.claim("new-"+strconv.Itoa(d.next)))
	}
	if len(out.Pods) > 0 && rapid.IntRange(0, 5).Draw(t, "spoil a pod") == 0 {
		j := rapid.IntRange(0, len(out.Pods)-1).Draw(t, "spoilt pod")
		if rapid.Bool().Draw(t, "no name") {
			out.Pods[j].Name = ""
		} else {
			out.Pods[j].Namespace = "other"
		}
	}
	if len(out.Claims) > 0 && rapid.IntRange(0, 5).Draw(t, "spoil a claim") == 0 {
		j := rapid.IntRange(0, len(out.Claims)-1).Draw(t, "spoilt claim")
		if rapid.Bool().Draw(t, "nil") {
			out.Claims[j].Object = nil
		} else {
			out.Claims[j].Want = -1
		}
	}
	if rapid.Bool().Draw(t, "shuffled") {
		out.Pods = rapid.Permutation(out.Pods).Draw(t, "pod order")
		out.Claims = rapid.Permutation(out.Claims).Draw(t, "claim order")
	}
	return out
}

// TestPropertyUnorderedScanAgreesWithLookups: whatever the listing (pods
// and claims as last listed, with their strings copied, changed, new,
// listed twice, refused) and whatever its order, scanUnordered finds the
// same pods and claims to observe as a lookup of each in the listing's
// order, or refuses the listing with the same error (docs/design.md §13).
// Rounds on the listings between the checks move the pool on, so that the
// entries' refs and places (and the refTables) are those of a pool that has
// lived.
func TestPropertyUnorderedScanAgreesWithLookups(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ctx := context.Background()
		scheme, err := testenv.NewScheme()
		if err != nil {
			t.Fatal(err)
		}
		c := fake.NewClientBuilder().WithScheme(scheme).Build()
		al, err := New(c, WithPodMarks(false))
		if err != nil {
			t.Fatal(err)
		}
		a := al.(*defaultAllocator)
		d := &listingDraw{ns: "ns"}
		base := Input{Pool: types.NamespacedName{Namespace: "ns", Name: "p"}}
		for i := range rapid.IntRange(0, 150).Draw(t, "pods") {
			base.Pods = append(base.Pods, d.pod("pod-"+strconv.Itoa(i)))
		}
		for i := range rapid.IntRange(0, 60).Draw(t, "claims") {
			base.Claims = append(base.Claims, d.claim("claim-"+strconv.Itoa(i)))
		}
		if _, err := a.Round(ctx, base); err != nil {
			t.Fatal(err)
		}
		for step := range rapid.IntRange(1, 5).Draw(t, "steps") {
			in := d.listing(t, base)
			p := a.lookupPool(in.Pool)
			p.mu.Lock()
			r := &round{a: a, p: p, ctx: ctx, now: time.Now(), res: &Result{Pool: in.Pool}}
			p.gen++
			wantPods, wantClaims, wantErr := lookupScan(r, in.Pods, in.Claims)
			p.gen++
			gotPods, gotClaims, gotErr := unorderedScanOf(r, in.Pods, in.Claims)
			p.gen++
			hintPods, hintClaims, hintErr := scanOf(r, in.Pods, in.Claims)
			p.mu.Unlock()
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
				t.Fatalf("step %d: scanUnordered refuses the listing with %v, lookups with %v", step, gotErr, wantErr)
			}
			if wantErr == nil && (!slices.Equal(gotPods, wantPods) || !slices.Equal(gotClaims, wantClaims)) {
				t.Fatalf("step %d: scanUnordered takes pods %v and claims %v, lookups %v and %v", step, gotPods, gotClaims, wantPods, wantClaims)
			}
			if fmt.Sprint(hintErr) != fmt.Sprint(wantErr) {
				t.Fatalf("step %d: scan refuses the listing with %v, lookups with %v", step, hintErr, wantErr)
			}
			if wantErr == nil && (!slices.Equal(hintPods, wantPods) || !slices.Equal(hintClaims, wantClaims)) {
				t.Fatalf("step %d: scan takes pods %v and claims %v, lookups %v and %v", step, hintPods, hintClaims, wantPods, wantClaims)
			}
			if err := a.checkInvariants(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			if rapid.Bool().Draw(t, fmt.Sprintf("round %d", step)) {
				if _, err := a.Round(ctx, in); err == nil {
					base = in
				}
			}
		}
	})
}
