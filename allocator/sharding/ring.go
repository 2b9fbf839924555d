package sharding

import (
	"context"
	"fmt"
	"hash/fnv"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
)

// vnodes is how many points each member has on the ring (ByNamespace).
const vnodes = 16

// fnv1a is the 64-bit FNV-1a hash of s, the API server's shard hash.
func fnv1a(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

type point struct {
	at     uint64
	member string
}

// ring places vnodes points per member, sorted.
func ring(members []string) []point {
	pts := make([]point, 0, len(members)*vnodes)
	for _, id := range members {
		for v := range vnodes {
			pts = append(pts, point{at: mix(fnv1a(id + "#" + strconv.Itoa(v))), member: id})
		}
	}
	slices.SortFunc(pts, func(x, y point) int {
		switch {
		case x.at < y.at:
			return -1
		case x.at > y.at:
			return 1
		}
		return strings.Compare(x.member, y.member)
	})
	return pts
}

// ringOwner is the member of the first point above h, the first point if
// none is.
func ringOwner(members []string, h uint64) string { return pointOwner(ring(members), h) }

// pointOwner is ringOwner on the ring pts.
func pointOwner(pts []point, h uint64) string {
	if len(pts) == 0 {
		return ""
	}
	i, _ := slices.BinarySearchFunc(pts, h, func(p point, h uint64) int {
		if p.at <= h {
			return -1
		}
		return 1
	})
	if i == len(pts) {
		i = 0
	}
	return pts[i].member
}

// span is a half-open range [start, end) of the hash space; end 0 stands
// for 2^64.
type span struct{ start, end uint64 }

// ranges returns the spans of the hash space that id owns among members,
// merged and sorted.
func ranges(members []string, id string) []span {
	pts := ring(members)
	var out []span
	add := func(s span) {
		if n := len(out); n > 0 && out[n-1].end == s.start && out[n-1].end != 0 {
			out[n-1].end = s.end
			return
		}
		out = append(out, s)
	}
	if len(pts) == 0 {
		return nil
	}
	if pts[0].member == id && pts[0].at > 0 {
		add(span{0, pts[0].at}) // wraps: below the first point
	}
	for k := 1; k < len(pts); k++ {
		if pts[k].member == id && pts[k-1].at < pts[k].at {
			add(span{pts[k-1].at, pts[k].at})
		}
	}
	if pts[0].member == id {
		add(span{pts[len(pts)-1].at, 0}) // wraps: from the last point to 2^64
	}
	return out
}

// ShardSelector returns the API server's shard selector for the
// namespaces whose pools this replica owns (ByNamespace), for the
// shardSelector of a list or watch: one shardRange per range, joined with
// "||". It is empty before the first Sync or without ByNamespace; an
// empty selector selects everything.
func (m *Membership) ShardSelector() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.opts.ByNamespace || len(m.cur.members) == 0 {
		return ""
	}
	var parts []string
	for _, s := range ranges(m.cur.members, m.opts.Identity) {
		end := "0x10000000000000000"
		if s.end != 0 {
			end = fmt.Sprintf("0x%016x", s.end)
		}
		parts = append(parts, fmt.Sprintf("shardRange(object.metadata.namespace, '0x%016x', '%s')", s.start, end))
	}
	if len(parts) == 0 {
		return "shardRange(object.metadata.namespace, '0x0000000000000000', '0x0000000000000000')" // owns nothing
	}
	return strings.Join(parts, " || ")
}

// NewInformer is for controller-runtime's cache.Options.NewInformer: the
// informers of the kinds of sharded (pods, claims, pools: every kind that
// lives in the pools' namespaces) list and watch only this replica's
// namespaces (ShardSelector); others are made as usual. When the members
// change, their watches end, and the informers list again with the new
// selector. It needs ByNamespace and an API server with the
// ShardedListAndWatch feature gate on; without the gate the server ignores
// the selector and the informers hold every namespace, which costs memory
// and events but not correctness (Owns still filters).
func (m *Membership) NewInformer(sharded ...runtime.Object) func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer {
	types := map[reflect.Type]bool{}
	for _, o := range sharded {
		types[reflect.TypeOf(o)] = true
	}
	return func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, idx toolscache.Indexers) toolscache.SharedIndexInformer {
		if types[reflect.TypeOf(obj)] {
			lw = m.listerWatcher(lw)
		}
		return toolscache.NewSharedIndexInformer(lw, obj, resync, idx)
	}
}

// selectorChanged returns a channel closed at the next change of members.
func (m *Membership) selectorChanged() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changedCh
}

// listerWatcher wraps lw so that its lists and watches carry the current
// shard selector, and its watches end when the selector changes.
func (m *Membership) listerWatcher(lw toolscache.ListerWatcher) toolscache.ListerWatcher {
	return &shardedLW{m: m, lw: toolscache.ToListerWatcherWithContext(lw)}
}

type shardedLW struct {
	m  *Membership
	lw toolscache.ListerWatcherWithContext
}

func (s *shardedLW) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	opts.ShardSelector = s.m.ShardSelector()
	return s.lw.ListWithContext(ctx, opts)
}

func (s *shardedLW) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	sel := s.m.ShardSelector()
	opts.ShardSelector = sel
	w, err := s.lw.WatchWithContext(ctx, opts)
	if err != nil {
		return nil, err
	}
	done, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		for {
			select {
			case <-done.Done():
				return
			case <-s.m.selectorChanged():
			}
			if s.m.ShardSelector() != sel {
				w.Stop() // the reflector lists again, with the new selector
				return
			}
		}
	}()
	return &stopWatch{Interface: w, cancel: cancel}, nil
}

// List and Watch are ListerWatcher's methods without a context.
func (s *shardedLW) List(opts metav1.ListOptions) (runtime.Object, error) {
	return s.ListWithContext(context.Background(), opts)
}

func (s *shardedLW) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return s.WatchWithContext(context.Background(), opts)
}

// stopWatch ends the selector's watcher goroutine with the watch.
type stopWatch struct {
	watch.Interface
	cancel context.CancelFunc
	once   sync.Once
}

func (w *stopWatch) Stop() {
	w.once.Do(w.cancel)
	w.Interface.Stop()
}
