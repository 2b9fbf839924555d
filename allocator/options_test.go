package allocator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/store"
	"github.com/poolalloc/poolalloc/syncer"
)

// TestNewRefusesBadOptions checks that New refuses every option it cannot
// use with ErrInvalidOption and an error naming it, nil included (also a
// typed nil pointer), and builds nothing.
func TestNewRefusesBadOptions(t *testing.T) {
	c := newFakeClient(t, nil)
	s, err := syncer.NewAnnotationSyncer(c, syncer.DefaultKeys())
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		client client.Client
		opts   []allocator.Option
		says   string
	}{
		{"nil option", c, []allocator.Option{nil}, "nil option"},
		{"nil store", c, []allocator.Option{allocator.WithStore(nil)}, "WithStore(nil)"},
		{"typed nil store", c, []allocator.Option{allocator.WithStore((*store.InMemory)(nil))}, "WithStore(nil)"},
		{"nil syncer", c, []allocator.Option{allocator.WithSyncer(nil)}, "WithSyncer(nil)"},
		{"typed nil syncer", c, []allocator.Option{allocator.WithSyncer((*syncer.AnnotationSyncer)(nil))}, "WithSyncer(nil)"},
		{"nil API reader", c, []allocator.Option{allocator.WithAPIReader(nil)}, "WithAPIReader(nil)"},
		{"nil claim type", c, []allocator.Option{allocator.WithClaimType(nil)}, "WithClaimType(nil)"},
		{"two nils", c, []allocator.Option{allocator.WithStore(nil), allocator.WithAPIReader(nil)}, "WithStore(nil), WithAPIReader(nil)"},
		{"nil algorithm", c, []allocator.Option{allocator.WithAlgorithm(nil)}, "nil algorithm"},
		{"nil readiness", c, []allocator.Option{allocator.WithReadiness(nil)}, "nil readiness rule"},
		{"nil recycler", c, []allocator.Option{allocator.WithRecycler(nil)}, "nil recycler"},
		{"nil clock", c, []allocator.Option{allocator.WithClock(clock.PassiveClock(nil))}, "nil clock"},
		{"no writers", c, []allocator.Option{allocator.WithWriteConcurrency(0)}, "write concurrency 0"},
		{"list claim type", c, []allocator.Option{allocator.WithClaimType(&unstructured.Unstructured{Object: map[string]any{
			"apiVersion": testenv.ClaimGVK.GroupVersion().String(), "kind": "ClaimList", "items": []any{},
		}})}, "is a list"},
		{"unstructured claim type without kind", c, []allocator.Option{allocator.WithClaimType(&unstructured.Unstructured{})}, "apiVersion and kind"},
		{"migration without marks", c, []allocator.Option{allocator.WithPodMarks(false), allocator.WithPodMarkMigration(true)}, "WithPodMarkMigration with WithPodMarks(false)"},
		{"marks without client", nil, []allocator.Option{allocator.WithSyncer(s)}, "pod marks need a client"},
		{"bad mark key", c, []allocator.Option{allocator.WithPodMarkKey("not a key!")}, `pod mark key "not a key!"`},
		{"keys with syncer", c, []allocator.Option{allocator.WithSyncer(s), allocator.WithKeys(syncer.DefaultKeys())}, "cannot be combined with WithSyncer"},
		{"API reader with syncer", c, []allocator.Option{allocator.WithSyncer(s), allocator.WithAPIReader(c)}, "cannot be combined with WithSyncer"},
		{"nil claim pool", c, []allocator.Option{allocator.WithClaimPool(nil)}, "WithClaimPool(nil)"},
		{"OpenSandbox with syncer", c, []allocator.Option{allocator.WithOpenSandbox(), allocator.WithSyncer(s)}, "WithOpenSandbox sets the syncer"},
		{"OpenSandbox with keys", c, []allocator.Option{allocator.WithKeys(syncer.OpenSandboxKeys()), allocator.WithOpenSandbox()}, "WithOpenSandbox sets the syncer"},
		{"no client, no syncer", nil, []allocator.Option{allocator.WithPodMarks(false)}, "nil client and no syncer"},
		{"bad keys", c, []allocator.Option{allocator.WithKeys(syncer.Keys{Allocated: "a/b"})}, "is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := allocator.New(tc.client, tc.opts...)
			require.ErrorIs(t, err, allocator.ErrInvalidOption)
			require.ErrorContains(t, err, tc.says)
			require.Nil(t, a)
		})
	}
	// Bad keys also match the syncer's sentinel.
	_, err = allocator.New(c, allocator.WithKeys(syncer.Keys{}))
	require.True(t, errors.Is(err, syncer.ErrInvalidKeys), "%v", err)

	// What the options allow works.
	for _, opts := range [][]allocator.Option{
		{allocator.WithStore(store.NewSorted()), allocator.WithAPIReader(c), allocator.WithClaimType(&testenv.Claim{})},
		{allocator.WithSyncer(s), allocator.WithPodMarks(false)},
		{allocator.WithAlgorithm(algorithm.Packed{}), allocator.WithReadiness(func(*corev1.Pod) bool { return true })},
	} {
		_, err := allocator.New(c, opts...)
		require.NoError(t, err)
	}
}

// TestWithQuarantineSetsHowLongAMissingClaimKeepsItsPods checks that a
// claim missing from the pool's listings keeps its pods for the quarantine
// set, not the default, and gives them back once it has passed.
func TestWithQuarantineSetsHowLongAMissingClaimKeepsItsPods(t *testing.T) {
	ctx := context.Background()
	c, pool, _ := regressionPool(t, 2, 1)
	missing, err := world.Input(ctx, c, pool)
	require.NoError(t, err)
	missing.Claims = nil
	clk := clocktesting.NewFakeClock(time.Now())
	const q = 10 * time.Second
	a, err := allocator.New(c, allocator.WithClock(clk), allocator.WithQuarantine(q))
	require.NoError(t, err)
	held := firstRound(t, a, c, pool).Allocated[0].Pods

	_, err = a.Round(ctx, missing)
	require.NoError(t, err)
	clk.Step(q - time.Second)
	_, err = a.Round(ctx, missing)
	require.NoError(t, err)
	require.Equal(t, held, recordOn(t, c, "c").Held(), "missing for less than the quarantine: nothing given back")
	clk.Step(time.Second)
	_, err = a.Round(ctx, missing)
	require.NoError(t, err)
	rec := recordOn(t, c, "c")
	require.Empty(t, rec.Held(), "missing for the quarantine: given back")
	require.Equal(t, held, rec.Released)

	for _, d := range []time.Duration{0, -time.Second} {
		_, err := allocator.New(c, allocator.WithQuarantine(d))
		require.ErrorIs(t, err, allocator.ErrInvalidOption)
		require.ErrorContains(t, err, "quarantine")
	}
}

// TestPodMarkSwitches checks WithPodMarks and WithPodMarkKey: the last
// WithPodMarks wins, and marks go under the key set.
func TestPodMarkSwitches(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []allocator.Option
		key  string // where the mark is expected; "" for none
	}{
		{"default", nil, allocator.DefaultPodMarkKey},
		{"off", []allocator.Option{allocator.WithPodMarks(false)}, ""},
		{"off then on", []allocator.Option{allocator.WithPodMarks(false), allocator.WithPodMarks(true)}, allocator.DefaultPodMarkKey},
		{"own key", []allocator.Option{allocator.WithPodMarkKey("example.com/holder")}, "example.com/holder"},
		{"own key, off", []allocator.Option{allocator.WithPodMarkKey("example.com/holder"), allocator.WithPodMarks(false)}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl, pool, _ := regressionPool(t, 1, 1)
			a, err := allocator.New(cl, c.opts...)
			require.NoError(t, err)
			firstRound(t, a, cl, pool)
			var pod corev1.Pod
			require.NoError(t, cl.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "p-0"}, &pod))
			for _, key := range []string{allocator.DefaultPodMarkKey, "example.com/holder"} {
				if key == c.key {
					require.Equal(t, "c/uid-c", pod.Annotations[key])
				} else {
					require.NotContains(t, pod.Annotations, key)
				}
			}
		})
	}
}
