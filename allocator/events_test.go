package allocator_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

// countingRecorder counts the events by reason before it passes them on.
type countingRecorder struct {
	next events.EventRecorder
	mu   sync.Mutex
	n    map[string]int
}

func (c *countingRecorder) Eventf(regarding, related runtime.Object, typ, reason, action, note string, args ...any) {
	c.mu.Lock()
	c.n[reason]++
	c.mu.Unlock()
	c.next.Eventf(regarding, related, typ, reason, action, note, args...)
}

func (c *countingRecorder) count(reason string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[reason]
}

// On the real API server: a claim gets Allocated, RecordUntrusted,
// PoolBlocked (once per interval however many rounds find the pool
// blocked) and Released events, as events.k8s.io/v1 Events naming it.
func TestEventsOnClaims(t *testing.T) {
	f := newFixture(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	stop := make(chan struct{})
	b.StartRecordingToSink(stop)
	t.Cleanup(func() { close(stop); b.Shutdown() })
	rec := &countingRecorder{next: b.NewRecorder(env.Scheme, "poolalloc-test"), n: map[string]int{}}
	clk := clocktesting.NewFakeClock(time.Now())
	pool := f.pool("p", 3)
	f.claim("c", "p", 1)
	a := f.alloc(allocator.WithEvents(rec, time.Minute), allocator.WithClock(clk))

	res := f.round(a, pool)
	require.Len(t, res.Allocated, 1)
	pod := res.Allocated[0].Pods[0]
	require.Equal(t, 1, rec.count(allocator.EventAllocated))
	onServer := func(reason, text string) bool {
		var list eventsv1.EventList
		if err := f.c.List(f.ctx, &list, client.InNamespace(f.ns)); err != nil {
			return false
		}
		return slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool {
			return e.Reason == reason && e.Regarding.Name == "c" && e.Regarding.Kind == "Claim" && strings.Contains(e.Note, text)
		})
	}
	require.Eventually(t, func() bool { return onServer(allocator.EventAllocated, pod) }, 30*time.Second, 100*time.Millisecond)

	// The record is edited to list a pod more: repaired, with a warning
	// (the unmarked pod is recycled, and released).
	other := "p-0"
	if pod == other {
		other = "p-1"
	}
	v, err := syncer.EncodePods([]string{pod, other})
	require.NoError(t, err)
	f.setAnnotation("c", f.keys.Allocated, v)
	f.round(a, pool)
	require.Equal(t, 1, rec.count(allocator.EventRecordUntrusted))
	require.Eventually(t, func() bool { return onServer(allocator.EventRecordUntrusted, other) }, 30*time.Second, 100*time.Millisecond)

	// A record that cannot be read blocks the pool: one warning per
	// interval, however many rounds find it so.
	f.setAnnotation("c", f.keys.Allocated, `{"pods":["`+pod+`","`+pod+`"]}`)
	for range 3 {
		_, err := a.Round(f.ctx, mustInput(t, f, pool))
		require.ErrorIs(t, err, allocator.ErrPoolBlocked)
	}
	require.Equal(t, 1, rec.count(allocator.EventPoolBlocked))
	clk.Step(time.Minute)
	_, err = a.Round(f.ctx, mustInput(t, f, pool))
	require.ErrorIs(t, err, allocator.ErrPoolBlocked)
	require.Equal(t, 2, rec.count(allocator.EventPoolBlocked))
	require.Eventually(t, func() bool { return onServer(allocator.EventPoolBlocked, pod) }, 30*time.Second, 100*time.Millisecond)

	// Put right, the owner gives the pod back.
	v, err = syncer.EncodePods([]string{pod})
	require.NoError(t, err)
	f.setAnnotation("c", f.keys.Allocated, v)
	released := rec.count(allocator.EventReleased) // p-1 or p-0, recycled by the repair
	f.release("c", pod)
	f.scale("c", 0)
	for i := 0; i < 5 && rec.count(allocator.EventReleased) == released; i++ {
		f.round(a, pool)
	}
	require.Equal(t, released+1, rec.count(allocator.EventReleased))
	// The API server shows the first Released event: the events library
	// records later ones of the same reason on the claim as its series.
	require.Eventually(t, func() bool { return onServer(allocator.EventReleased, "released pods") }, 30*time.Second, 100*time.Millisecond)
	var list eventsv1.EventList
	require.NoError(t, f.c.List(f.ctx, &list, client.InNamespace(f.ns)))
	for _, e := range list.Items {
		want := corev1.EventTypeNormal
		if e.Reason != allocator.EventAllocated && e.Reason != allocator.EventReleased {
			want = corev1.EventTypeWarning
		}
		require.Equal(t, want, e.Type, "event %s", e.Reason)
	}
}

// WithEvents refuses a nil recorder.
func TestWithEventsRefusesNil(t *testing.T) {
	_, err := allocator.New(newFakeClient(t, nil), allocator.WithEvents(nil, 0))
	require.ErrorIs(t, err, allocator.ErrInvalidOption)
}

// mustInput lists the pool as world.Round would.
func mustInput(t *testing.T, f *fixture, pool types.NamespacedName) allocator.Input {
	t.Helper()
	in, err := world.Input(f.ctx, f.c, pool)
	require.NoError(t, err)
	return in
}
