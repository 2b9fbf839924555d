package allocator_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

// osModel is what TestPropertyOpenSandboxMode remembers of one claim
// between steps: its records as last seen, and the largest replicas it
// had since it was created.
type osModel struct {
	uid         types.UID
	status      []string
	released    []string
	maxReplicas int32
	deleted     bool
}

// TestPropertyOpenSandboxMode runs random histories of sandboxes created,
// scaled, releasing pods (as OpenSandbox's sandbox controller writes
// alloc-release: the union of what it listed before and the new pods),
// deleted, and allocator restarts, against WithOpenSandbox on the fake
// client. After every round it checks what an OpenSandbox controller
// relies on: alloc-status and alloc-released only grow at their end; a
// sandbox never lists more distinct pods than the largest replicas it had;
// no pod is listed twice by one sandbox nor held by two; the store agrees
// with the records; the finalizer is on every live sandbox that lists a
// pod. Once the pool settles, no sandbox is short while a pod it may take
// is idle.
func TestPropertyOpenSandboxMode(t *testing.T) {
	propertyBudget(t, 300, 30)
	rapid.Check(t, func(rt *rapid.T) {
		ctx := context.Background()
		c := newFakeClient(t, nil)
		const ns, poolName, nPods = "ns", "p", 6
		pool := types.NamespacedName{Namespace: ns, Name: poolName}
		if _, err := testenv.CreatePods(ctx, c, ns, poolName, nPods, true); err != nil {
			rt.Fatal(err)
		}
		marks := rapid.Bool().Draw(rt, "marks")
		newAlloc := func() allocator.Allocator {
			a, err := allocator.New(c, allocator.WithOpenSandbox(), allocator.WithPodMarks(marks))
			if err != nil {
				rt.Fatal(err)
			}
			return a
		}
		a := newAlloc()
		s, err := syncer.NewAnnotationSyncer(c, syncer.OpenSandboxKeys(), syncer.WithOpenSandboxFormat())
		if err != nil {
			rt.Fatal(err)
		}
		models := map[string]*osModel{}
		gen := 0
		get := func(name string) (*testenv.Claim, bool) {
			cl := &testenv.Claim{}
			err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, cl)
			if apierrors.IsNotFound(err) {
				return nil, false
			}
			if err != nil {
				rt.Fatal(err)
			}
			return cl, true
		}

		check := func(res allocator.Result, settled bool) {
			heldBy := map[string]string{}
			for name, m := range models {
				cl, ok := get(name)
				if !ok || cl.UID != m.uid {
					if !m.deleted {
						rt.Fatalf("claim %s vanished without being deleted", name)
					}
					continue
				}
				rec, err := s.Read(cl)
				if err != nil {
					rt.Fatalf("claim %s: %v", name, err)
				}
				if !slices.Equal(rec.Allocated[:min(len(m.status), len(rec.Allocated))], m.status) || len(rec.Allocated) < len(m.status) {
					rt.Fatalf("claim %s: alloc-status %v does not extend %v", name, rec.Allocated, m.status)
				}
				if !slices.Equal(rec.Released[:min(len(m.released), len(rec.Released))], m.released) || len(rec.Released) < len(m.released) {
					rt.Fatalf("claim %s: alloc-released %v does not extend %v", name, rec.Released, m.released)
				}
				if sets.New(rec.Allocated...).Len() != len(rec.Allocated) {
					rt.Fatalf("claim %s: alloc-status %v lists a pod twice", name, rec.Allocated)
				}
				listed := sets.New(rec.Allocated...).Insert(rec.Released...)
				if int32(listed.Len()) > m.maxReplicas {
					rt.Fatalf("claim %s: lists %d pods %v, more than its largest replicas %d", name, listed.Len(), sets.List(listed), m.maxReplicas)
				}
				if len(rec.Allocated) > 0 && cl.DeletionTimestamp == nil && !slices.Contains(cl.Finalizers, osFinalizer) {
					rt.Fatalf("claim %s: live, lists pods, has no finalizer", name)
				}
				for _, pod := range rec.Held() {
					if other, dup := heldBy[pod]; dup {
						rt.Fatalf("pod %s held by %s and %s", pod, other, name)
					}
					heldBy[pod] = name
				}
				m.status, m.released = rec.Allocated, rec.Released
				if settled && cl.DeletionTimestamp == nil && int32(listed.Len()) < cl.Spec.Replicas {
					for _, pod := range res.Idle {
						if !listed.Has(pod) {
							rt.Fatalf("settled: claim %s lists %d of %d replicas while pod %s is idle", name, listed.Len(), cl.Spec.Replicas, pod)
						}
					}
				}
			}
			snap, err := a.Store().Snapshot(pool)
			if err != nil {
				rt.Fatal(err)
			}
			got := map[string]string{}
			for pod, h := range snap {
				got[pod] = h.Claim.Name
			}
			if !maps.Equal(got, heldBy) {
				rt.Fatalf("store %v, records %v", got, heldBy)
			}
		}
		round := func() allocator.Result {
			res, err := world.Round(ctx, a, c, pool)
			if err != nil {
				rt.Fatalf("round: %v", err)
			}
			if err := allocator.CheckInvariants(a); err != nil {
				rt.Fatal(err)
			}
			return res
		}

		names := []string{"a", "b", "c"}
		steps := rapid.IntRange(5, 30).Draw(rt, "steps")
		for range steps {
			name := rapid.SampledFrom(names).Draw(rt, "claim")
			m := models[name]
			live := m != nil && !m.deleted
			switch rapid.IntRange(0, 5).Draw(rt, "action") {
			case 0: // create
				if m != nil && !m.deleted {
					continue
				}
				if _, exists := get(name); exists {
					continue // still being deleted
				}
				replicas := rapid.Int32Range(0, 4).Draw(rt, "replicas")
				gen++
				cl := testenv.NewClaim(ns, name, poolName, replicas)
				cl.UID = types.UID(fmt.Sprintf("uid-%s-%d", name, gen))
				if err := c.Create(ctx, cl); err != nil {
					rt.Fatal(err)
				}
				models[name] = &osModel{uid: cl.UID, maxReplicas: replicas}
			case 1: // scale
				if !live {
					continue
				}
				cl, ok := get(name)
				if !ok || cl.DeletionTimestamp != nil {
					continue
				}
				cl.Spec.Replicas = rapid.Int32Range(0, 4).Draw(rt, "replicas")
				if err := c.Update(ctx, cl); err != nil {
					rt.Fatal(err)
				}
				m.maxReplicas = max(m.maxReplicas, cl.Spec.Replicas)
			case 2: // the owner releases some of what its record holds
				if !live {
					continue
				}
				cl, ok := get(name)
				if !ok {
					continue
				}
				rec, err := s.Read(cl)
				if err != nil {
					rt.Fatal(err)
				}
				held := rec.Held()
				if len(held) == 0 {
					continue
				}
				pick := rapid.SliceOfNDistinct(rapid.SampledFrom(held), 1, len(held), rapid.ID[string]).Draw(rt, "release")
				v, err := syncer.EncodePods(sets.List(sets.New(rec.Release...).Insert(pick...)))
				if err != nil {
					rt.Fatal(err)
				}
				patch := client.MergeFrom(cl.DeepCopy())
				if cl.Annotations == nil {
					cl.Annotations = map[string]string{}
				}
				cl.Annotations[osAllocRelease] = v
				if err := c.Patch(ctx, cl, patch); err != nil {
					rt.Fatal(err)
				}
			case 3: // delete
				if !live {
					continue
				}
				cl, ok := get(name)
				if !ok {
					continue
				}
				if err := c.Delete(ctx, cl); err != nil && !apierrors.IsNotFound(err) {
					rt.Fatal(err)
				}
				m.deleted = true
			case 4: // restart
				a = newAlloc()
				check(round(), false)
			default:
				check(round(), false)
			}
		}
		// Settle: rounds until one changes nothing.
		for i := 0; ; i++ {
			res := round()
			quiet := len(res.Allocated) == 0 && len(res.Released) == 0 && len(res.Recycling) == 0
			check(res, quiet)
			if quiet {
				break
			}
			if i == 10 {
				rt.Fatal("the pool did not settle in 10 rounds")
			}
		}
		for name, m := range models {
			if cl, ok := get(name); m.deleted && ok && cl.UID == m.uid {
				rt.Fatalf("deleted claim %s is still there once the pool settled (finalizers %v)", name, cl.Finalizers)
			}
		}
	})
}
