package allocator

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
)

// DefaultEventInterval is how often at most WithEvents records a warning of
// one reason on one claim.
const DefaultEventInterval = 5 * time.Minute

// Reasons of the events WithEvents records on claims.
const (
	// EventAllocated (Normal): pods were handed to the claim.
	EventAllocated = "Allocated"
	// EventReleased (Normal): pods the claim gave back are free again.
	EventReleased = "Released"
	// EventRecordUntrusted (Warning): the claim's record differed from what
	// it holds and is rewritten (ErrUntrustedRecord).
	EventRecordUntrusted = "RecordUntrusted"
	// EventInvalidRelease (Warning): the owner's release list cannot be
	// read and is ignored (ErrInvalidRelease).
	EventInvalidRelease = "InvalidRelease"
	// EventPoolBlocked (Warning): the claim's record cannot be trusted and
	// blocks its pool (ErrPoolBlocked).
	EventPoolBlocked = "PoolBlocked"
)

// WithEvents records events on claims through rec (a controller-runtime
// manager's GetEventRecorder("poolalloc"), say): EventAllocated and
// EventReleased as Normal events naming the pods, EventRecordUntrusted,
// EventInvalidRelease and EventPoolBlocked as Warning events with the
// error. A warning of one reason is recorded at most once per claim in
// interval (DefaultEventInterval if 0), so that a blocked pool, which
// every round finds blocked again, does not flood the API server. rec must
// not be nil. The events library (k8s.io/client-go/tools/events) keeps
// repeats of one reason on one claim as a series of the first event, whose
// note stays the first's.
func WithEvents(rec events.EventRecorder, interval time.Duration) Option {
	return optionFunc(func(c *config) {
		c.checkNil("WithEvents", rec)
		if interval <= 0 {
			interval = DefaultEventInterval
		}
		c.events = &eventSink{rec: rec, interval: interval, last: make(map[eventKey]time.Time)}
	})
}

// eventSink records the events of WithEvents.
type eventSink struct {
	rec      events.EventRecorder
	interval time.Duration

	// last is when a warning was last recorded on a claim; mu guards it.
	mu   sync.Mutex
	last map[eventKey]time.Time
}

type eventKey struct {
	uid    types.UID
	reason string
}

// claimRef is what an event names its claim by.
type claimRef struct {
	apiVersion, kind string
}

// record records the events of a call's result and error on pool, whose
// claims are of kind ref.
func (s *eventSink) record(clk clock.PassiveClock, ref claimRef, res Result, err error) {
	for _, g := range res.Allocated {
		s.emit(clk, ref, g.Claim, g.UID, corev1.EventTypeNormal, EventAllocated, "Allocate", "handed out pods "+strings.Join(g.Pods, ", "))
	}
	for _, g := range res.Released {
		s.emit(clk, ref, g.Claim, g.UID, corev1.EventTypeNormal, EventReleased, "Release", "released pods "+strings.Join(g.Pods, ", "))
	}
	for _, w := range append(slices.Clone(res.Warnings), leaves(err)...) {
		var ce *ClaimError
		if !errors.As(w, &ce) {
			continue
		}
		reason, action := "", ""
		switch {
		case errors.Is(w, ErrPoolBlocked):
			reason, action = EventPoolBlocked, "Allocate"
		case errors.Is(w, ErrUntrustedRecord):
			reason, action = EventRecordUntrusted, "Repair"
		case errors.Is(w, ErrInvalidRelease):
			reason, action = EventInvalidRelease, "Release"
		default:
			continue
		}
		s.emit(clk, ref, ce.Claim, ce.UID, corev1.EventTypeWarning, reason, action, ce.Err.Error())
	}
}

// emit records one event on the claim, a warning only if none of its
// reason was recorded on the claim in the interval.
func (s *eventSink) emit(clk clock.PassiveClock, ref claimRef, claim types.NamespacedName, uid types.UID, typ, reason, action, note string) {
	if typ == corev1.EventTypeWarning {
		now := clk.Now()
		k := eventKey{uid: uid, reason: reason}
		s.mu.Lock()
		if t, ok := s.last[k]; ok && now.Sub(t) < s.interval {
			s.mu.Unlock()
			return
		}
		s.last[k] = now
		if len(s.last) > maxEventKeys {
			for k, t := range s.last {
				if now.Sub(t) >= s.interval {
					delete(s.last, k)
				}
			}
		}
		s.mu.Unlock()
	}
	obj := &corev1.ObjectReference{APIVersion: ref.apiVersion, Kind: ref.kind,
		Namespace: claim.Namespace, Name: claim.Name, UID: uid}
	s.rec.Eventf(obj, nil, typ, reason, action, "%s", truncate(note, maxEventNote))
}

const (
	// maxEventKeys bounds eventSink.last before it is pruned.
	maxEventKeys = 4096
	// maxEventNote is the longest note recorded (the API server refuses
	// notes of more than 1 kB).
	maxEventNote = 1000
)

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// claimRefOf returns what events name the pool's claims by, from a claim
// listed in it.
func (a *defaultAllocator) claimRefOf() (claimRef, error) {
	proto := a.proto()
	if proto == nil {
		return claimRef{}, errors.New("no claim listed yet")
	}
	gvk := proto.GetObjectKind().GroupVersionKind()
	if gvk.Kind == "" && a.cfg.client != nil {
		var err error
		if gvk, err = a.cfg.client.GroupVersionKindFor(proto); err != nil {
			return claimRef{}, fmt.Errorf("kind of claim %T: %w", proto, err)
		}
	}
	return claimRef{apiVersion: gvk.GroupVersion().String(), kind: gvk.Kind}, nil
}
