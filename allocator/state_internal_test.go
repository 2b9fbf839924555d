package allocator

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/internal/testenv"
)

// stateFixture is an allocator, without the self-check, on a fake client
// with pool ns/p of n Ready pods after its first Round.
func stateFixture(t *testing.T, n int) (*defaultAllocator, Input) {
	t.Helper()
	ctx := context.Background()
	scheme, err := testenv.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithGlobalResourceVersionCounter().WithScheme(scheme).WithStatusSubresource(&corev1.Pod{}).Build()
	pods, err := testenv.CreatePods(ctx, c, "ns", "p", n, true)
	if err != nil {
		t.Fatal(err)
	}
	al, err := New(c, WithInvariantChecks(false))
	if err != nil {
		t.Fatal(err)
	}
	in := Input{Pool: types.NamespacedName{Namespace: "ns", Name: "p"}, Pods: pods}
	if _, err := al.Round(ctx, in); err != nil {
		t.Fatal(err)
	}
	return al.(*defaultAllocator), in
}

// A move the state diagram does not have is refused, and the call fails
// the pool closed; the next Round rebuilds it.
func TestSetStateRefusesAMoveOffTheDiagram(t *testing.T) {
	a, in := stateFixture(t, 2)
	p := a.lookupPool(in.Pool)
	p.mu.Lock()
	pi := p.pods.Get("p-0")
	if pi.state != stateFree {
		t.Fatalf("p-0 is %s, want free", pi.state)
	}
	ci := &claimInfo{}
	ci.setIdent(p, "c", "uid-c")
	p.setState(pi, stateRecycling, ci, false) // a free pod is held by no one
	if pi.state != stateFree || !errors.Is(p.violation, ErrInconsistent) {
		t.Fatalf("moved to %s, violation %v", pi.state, p.violation)
	}
	p.mu.Unlock()

	_, err := a.Update(context.Background(), Changes{Pool: in.Pool})
	if !errors.Is(err, ErrInconsistent) {
		t.Fatalf("Update after a refused move: %v, want ErrInconsistent", err)
	}
	if _, err := a.Update(context.Background(), Changes{Pool: in.Pool}); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("Update on a pool failed closed: %v, want ErrInvalidInput until a Round", err)
	}
	res, err := a.Round(context.Background(), in)
	if err != nil || res.IdleCount != 2 {
		t.Fatalf("Round rebuilding the pool: %v, %d idle", err, res.IdleCount)
	}
}

// A pod whose state disagrees with what it is derived from is caught at
// the end of the call that moved it, whatever WithInvariantChecks says.
func TestCheckMovedCatchesAStaleState(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(p *pool, pi *podInfo)
	}{
		{"state", func(p *pool, pi *podInfo) { pi.state = stateStarting }},
		{"free list", func(p *pool, pi *podInfo) { p.removeFree(pi) }},
		{"lost set", func(p *pool, pi *podInfo) { p.lost[pi] = struct{}{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, in := stateFixture(t, 2)
			p := a.lookupPool(in.Pool)
			p.mu.Lock()
			pi := p.pods.Get("p-1")
			tc.corrupt(p, pi)
			p.moved = append(p.moved, pi) // as if this call had moved it
			err := a.finish(p, nil)
			p.mu.Unlock()
			if !errors.Is(err, ErrInconsistent) || !p.dead {
				t.Fatalf("finish: %v, dead %t; want ErrInconsistent and the pool dropped", err, p.dead)
			}
			if res, err := a.Round(context.Background(), in); err != nil || res.IdleCount != 2 {
				t.Fatalf("Round rebuilding the pool: %v, %d idle", err, res.IdleCount)
			}
		})
	}
}
