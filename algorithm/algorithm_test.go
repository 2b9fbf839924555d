package algorithm_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/algorithm/algorithmtest"
)

var t0 = time.Date(2025, time.March, 1, 12, 0, 0, 0, time.UTC)

var strategies = []struct {
	name string
	alg  algorithm.Algorithm
}{
	{"Packed", algorithm.Packed{}},
	{"Spread", algorithm.Spread{}},
}

func TestConformance(t *testing.T) {
	for _, s := range strategies {
		t.Run(s.name, func(t *testing.T) { algorithmtest.Run(t, s.alg) })
	}
}

// candidates returns candidates with the given names.
func candidates(names ...string) []algorithm.Candidate {
	out := make([]algorithm.Candidate, len(names))
	for i, n := range names {
		out[i] = algorithm.Candidate{Name: n}
	}
	return out
}

// request returns a request of claim ns/name with UID "uid-"+name, created
// age minutes after t0.
// arrived sets r's Arrival.
func arrived(r algorithm.Request, n uint64) algorithm.Request {
	r.Arrival = n
	return r
}

func request(name string, want int, age int) algorithm.Request {
	return algorithm.Request{
		UID:     types.UID("uid-" + name),
		Claim:   types.NamespacedName{Namespace: "ns", Name: name},
		Want:    want,
		Created: t0.Add(time.Duration(age) * time.Minute),
	}
}

// pods maps claim names to the pods of their grants.
func pods(grants []algorithm.Grant) map[string][]string {
	out := make(map[string][]string, len(grants))
	for _, g := range grants {
		out[g.Claim.Name] = g.Pods
	}
	return out
}

func TestPackedVersusSpread(t *testing.T) {
	for _, c := range []struct {
		name           string
		in             algorithm.Input
		packed, spread map[string][]string
		shortfall      int
	}{
		{
			name: "three claims want 2, three candidates",
			in: algorithm.Input{
				Candidates: candidates("p1", "p2", "p3"),
				Requests:   []algorithm.Request{request("c", 2, 2), request("a", 2, 0), request("b", 2, 1)},
			},
			packed:    map[string][]string{"a": {"p1", "p2"}, "b": {"p3"}},
			spread:    map[string][]string{"a": {"p1"}, "b": {"p2"}, "c": {"p3"}},
			shortfall: 3,
		},
		{
			name: "two claims want 3, four candidates",
			in: algorithm.Input{
				Candidates: candidates("p1", "p2", "p3", "p4"),
				Requests:   []algorithm.Request{request("a", 3, 0), request("b", 3, 1)},
			},
			packed:    map[string][]string{"a": {"p1", "p2", "p3"}, "b": {"p4"}},
			spread:    map[string][]string{"a": {"p1", "p3"}, "b": {"p2", "p4"}},
			shortfall: 2,
		},
		{
			name: "enough candidates: same counts, dealt differently",
			in: algorithm.Input{
				Candidates: candidates("p1", "p2", "p3", "p4", "p5"),
				Requests:   []algorithm.Request{request("a", 2, 0), request("b", 1, 1)},
			},
			packed: map[string][]string{"a": {"p1", "p2"}, "b": {"p3"}},
			spread: map[string][]string{"a": {"p1", "p3"}, "b": {"p2"}},
		},
		{
			name: "no candidates",
			in: algorithm.Input{
				Requests: []algorithm.Request{request("a", 2, 0), request("b", 1, 1)},
			},
			packed:    map[string][]string{},
			spread:    map[string][]string{},
			shortfall: 3,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, s := range strategies {
				want := c.packed
				if s.name == "Spread" {
					want = c.spread
				}
				act, err := s.alg.Plan(c.in)
				require.NoError(t, err, s.name)
				require.Equal(t, want, pods(act.Allocate), s.name)
				require.Empty(t, act.Release, s.name)
				require.Equal(t, c.shortfall, act.Shortfall, s.name)
			}
		})
	}
}

func TestOrder(t *testing.T) {
	withPriority := func(r algorithm.Request, p int32) algorithm.Request { r.Priority = p; return r }
	inNamespace := func(r algorithm.Request, ns string) algorithm.Request { r.Claim.Namespace = ns; return r }
	withUID := func(r algorithm.Request, uid types.UID) algorithm.Request { r.UID = uid; return r }
	for _, c := range []struct {
		name   string
		reqs   []algorithm.Request
		winner types.UID // the request that gets the only candidate
	}{
		{
			name:   "higher priority before older",
			reqs:   []algorithm.Request{request("old", 1, 0), withPriority(request("new", 1, 9), 1)},
			winner: "uid-new",
		},
		{
			name:   "zero priority before negative",
			reqs:   []algorithm.Request{withPriority(request("neg", 1, 0), -1), request("zero", 1, 5)},
			winner: "uid-zero",
		},
		{
			name:   "older before newer at equal priority",
			reqs:   []algorithm.Request{request("newer", 1, 2), request("older", 1, 1)},
			winner: "uid-older",
		},
		{
			name:   "earlier arrival before name at equal age",
			reqs:   []algorithm.Request{arrived(request("a", 1, 0), 2), arrived(request("z", 1, 0), 1)},
			winner: "uid-z",
		},
		{
			name:   "namespace before name at equal age",
			reqs:   []algorithm.Request{inNamespace(request("a", 1, 0), "ns-b"), inNamespace(request("z", 1, 0), "ns-a")},
			winner: "uid-z",
		},
		{
			name:   "name at equal namespace",
			reqs:   []algorithm.Request{request("b", 1, 0), request("a", 1, 0)},
			winner: "uid-a",
		},
		{
			name:   "UID when a claim was recreated under the same name",
			reqs:   []algorithm.Request{withUID(request("a", 1, 0), "uid-2"), withUID(request("a", 1, 0), "uid-1")},
			winner: "uid-1",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.True(t, algorithm.Less(&c.reqs[1], &c.reqs[0]) != algorithm.Less(&c.reqs[0], &c.reqs[1]),
				"Less must order the two requests")
			for _, s := range strategies {
				act, err := s.alg.Plan(algorithm.Input{Candidates: candidates("p1"), Requests: c.reqs})
				require.NoError(t, err, s.name)
				require.Len(t, act.Allocate, 1, s.name)
				require.Equal(t, c.winner, act.Allocate[0].UID, s.name)
				require.Equal(t, []string{"p1"}, act.Allocate[0].Pods, s.name)
				require.Equal(t, 1, act.Shortfall, s.name)
			}
		})
	}
}

func TestRelease(t *testing.T) {
	holding := func(want int, held, release []string) algorithm.Request {
		r := request("a", want, 0)
		r.Held, r.Release = held, release
		return r
	}
	for _, c := range []struct {
		name      string
		cands     []string
		req       algorithm.Request
		release   []string
		allocate  []string
		shortfall int
	}{
		{
			name:    "surplus gives back the greatest names",
			req:     holding(2, []string{"pod-c", "pod-a", "pod-d", "pod-b"}, nil),
			release: []string{"pod-c", "pod-d"},
		},
		{
			name:    "owner release first, then surplus",
			req:     holding(2, []string{"pod-a", "pod-b", "pod-c", "pod-d"}, []string{"pod-b"}),
			release: []string{"pod-b", "pod-d"},
		},
		{
			name:     "owner release is replaced",
			cands:    []string{"pod-x", "pod-y"},
			req:      holding(2, []string{"pod-a", "pod-b"}, []string{"pod-a"}),
			release:  []string{"pod-a"},
			allocate: []string{"pod-x"},
		},
		{
			name:      "owner release with an empty pool",
			req:       holding(2, []string{"pod-a", "pod-b"}, []string{"pod-a"}),
			release:   []string{"pod-a"},
			shortfall: 1,
		},
		{
			name:    "claim being deleted gives back everything",
			cands:   []string{"pod-x"},
			req:     holding(0, []string{"pod-b", "pod-a", "pod-c"}, []string{"pod-c"}),
			release: []string{"pod-c", "pod-a", "pod-b"},
		},
		{
			name:  "holding exactly Want changes nothing",
			cands: []string{"pod-x"},
			req:   holding(2, []string{"pod-a", "pod-b"}, nil),
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, s := range strategies {
				act, err := s.alg.Plan(algorithm.Input{Candidates: candidates(c.cands...), Requests: []algorithm.Request{c.req}})
				require.NoError(t, err, s.name)
				want := map[string][]string{}
				if c.release != nil {
					want["a"] = c.release
				}
				require.Equal(t, want, pods(act.Release), s.name)
				want = map[string][]string{}
				if c.allocate != nil {
					want["a"] = c.allocate
				}
				require.Equal(t, want, pods(act.Allocate), s.name)
				require.Equal(t, c.shortfall, act.Shortfall, s.name)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	claim := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }
	valid := algorithm.Input{
		Candidates: candidates("p1", "p2"),
		Requests: []algorithm.Request{
			{UID: "u1", Claim: claim("a"), Want: 2, Held: []string{"h1", "h2"}, Release: []string{"h2"}},
			{UID: "u2", Claim: claim("a"), Want: 0, Held: []string{"h3"}},
		},
	}
	require.NoError(t, algorithm.Validate(valid))
	require.NoError(t, algorithm.Validate(algorithm.Input{}))

	for _, c := range []struct {
		name string
		in   algorithm.Input
	}{
		{"empty candidate name", algorithm.Input{Candidates: candidates("p1", "")}},
		{"candidate listed twice", algorithm.Input{Candidates: candidates("p1", "p2", "p1")}},
		{"empty UID", algorithm.Input{Requests: []algorithm.Request{{Claim: claim("a"), Want: 1}}}},
		{"UID twice", algorithm.Input{Requests: []algorithm.Request{
			{UID: "u1", Claim: claim("a")}, {UID: "u1", Claim: claim("b")},
		}}},
		{"negative want", algorithm.Input{Requests: []algorithm.Request{{UID: "u1", Claim: claim("a"), Want: -1}}}},
		{"held pod is a candidate", algorithm.Input{
			Candidates: candidates("p1"),
			Requests:   []algorithm.Request{{UID: "u1", Claim: claim("a"), Want: 1, Held: []string{"p1"}}},
		}},
		{"pod held twice by one claim", algorithm.Input{Requests: []algorithm.Request{
			{UID: "u1", Claim: claim("a"), Want: 2, Held: []string{"h1", "h1"}},
		}}},
		{"pod held by two claims", algorithm.Input{Requests: []algorithm.Request{
			{UID: "u1", Claim: claim("a"), Want: 1, Held: []string{"h1"}},
			{UID: "u2", Claim: claim("b"), Want: 1, Held: []string{"h1"}},
		}}},
		{"released pod not held", algorithm.Input{Requests: []algorithm.Request{
			{UID: "u1", Claim: claim("a"), Want: 1, Held: []string{"h1"}, Release: []string{"h2"}},
		}}},
		{"pod released twice", algorithm.Input{Requests: []algorithm.Request{
			{UID: "u1", Claim: claim("a"), Want: 1, Held: []string{"h1", "h2"}, Release: []string{"h1", "h1"}},
		}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := algorithm.Validate(c.in)
			require.Error(t, err)
			require.True(t, errors.Is(err, algorithm.ErrInvalidInput), "error %v does not wrap ErrInvalidInput", err)
		})
	}
}

func TestPlanInvalidInput(t *testing.T) {
	bad := func(want int, held, release []string) algorithm.Input {
		r := request("a", want, 0)
		r.Held, r.Release = held, release
		return algorithm.Input{Candidates: candidates("p1", "p2"), Requests: []algorithm.Request{r}}
	}
	for _, c := range []struct {
		name string
		in   algorithm.Input
	}{
		{"negative want", bad(-1, nil, nil)},
		{"negative want with held pods", bad(-1, []string{"h1"}, nil)},
		{"pod held twice, surplus", bad(1, []string{"h1", "h1", "h1"}, []string{"h1"})},
		{"released pod not held", bad(1, []string{"h1", "h2", "h3"}, []string{"x"})},
		{"pod released twice", bad(1, []string{"h1", "h2"}, []string{"h1", "h1"})},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, s := range strategies {
				_, err := s.alg.Plan(c.in)
				require.ErrorIs(t, err, algorithm.ErrInvalidInput, s.name)
			}
		})
	}

	t.Run("candidate listed twice is handed out once", func(t *testing.T) {
		in := algorithm.Input{
			Candidates: candidates("p1", "p1", "p2"),
			Requests:   []algorithm.Request{request("a", 2, 0), request("b", 2, 1)},
		}
		for _, s := range strategies {
			act, err := s.alg.Plan(in)
			require.NoError(t, err, s.name)
			var got []string
			for _, g := range act.Allocate {
				got = append(got, g.Pods...)
			}
			require.ElementsMatch(t, []string{"p1", "p2"}, got, s.name)
			require.Equal(t, 2, act.Shortfall, s.name)
		}
	})
}

// BenchmarkPlan shows that a round costs what it hands out, not what the
// pool holds: ns/op and allocs/op stay flat from 1,000 to 100,000
// candidates.
func BenchmarkPlan(b *testing.B) {
	for _, s := range strategies {
		for _, nReq := range []int{1, 100} {
			for _, nCand := range []int{1_000, 10_000, 100_000} {
				in := algorithm.Input{
					Candidates: make([]algorithm.Candidate, nCand),
					Requests:   make([]algorithm.Request, nReq),
				}
				for i := range in.Candidates {
					in.Candidates[i] = algorithm.Candidate{Name: fmt.Sprintf("pod-%06d", i), Node: fmt.Sprintf("node-%d", i%100)}
				}
				for i := range in.Requests {
					in.Requests[i] = request(fmt.Sprintf("claim-%03d", i), 1, i)
				}
				b.Run(fmt.Sprintf("%s/requests=%d/candidates=%d", s.name, nReq, nCand), func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						if _, err := s.alg.Plan(in); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// TestAvoidedPodsGoLast checks that both strategies give a claim the pods
// it gave back recently (Avoid) only when no other candidate is left, and
// that those pods stay available to other claims.
func TestAvoidedPodsGoLast(t *testing.T) {
	avoiding := func(r algorithm.Request, pods ...string) algorithm.Request {
		r.Avoid = pods
		return r
	}
	for _, s := range strategies {
		t.Run(s.name, func(t *testing.T) {
			for _, c := range []struct {
				name       string
				candidates []algorithm.Candidate
				reqs       []algorithm.Request
				want       map[types.UID][]string
			}{
				{"another pod first", candidates("p1", "p2"),
					[]algorithm.Request{avoiding(request("a", 1, 0), "p1")},
					map[types.UID][]string{"uid-a": {"p2"}}},
				{"the avoided pod when no other is left", candidates("p1"),
					[]algorithm.Request{avoiding(request("a", 1, 0), "p1")},
					map[types.UID][]string{"uid-a": {"p1"}}},
				{"the avoided pod last", candidates("p1", "p2"),
					[]algorithm.Request{avoiding(request("a", 2, 0), "p1")},
					map[types.UID][]string{"uid-a": {"p2", "p1"}}},
				{"the avoided pod to the next claim", candidates("p1", "p2"),
					[]algorithm.Request{avoiding(request("a", 1, 0), "p1"), request("b", 1, 1)},
					map[types.UID][]string{"uid-a": {"p2"}, "uid-b": {"p1"}}},
			} {
				t.Run(c.name, func(t *testing.T) {
					act, err := s.alg.Plan(algorithm.Input{Candidates: c.candidates, Requests: c.reqs})
					require.NoError(t, err)
					got := map[types.UID][]string{}
					for _, g := range act.Allocate {
						got[g.UID] = g.Pods
					}
					require.Equal(t, c.want, got)
				})
			}
		})
	}
}
