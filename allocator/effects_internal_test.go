package allocator

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// poolState are the types that make up a pool's state.
var poolState = map[reflect.Type]bool{
	reflect.TypeFor[pool]():             true,
	reflect.TypeFor[round]():            true,
	reflect.TypeFor[podInfo]():          true,
	reflect.TypeFor[claimInfo]():        true,
	reflect.TypeFor[defaultAllocator](): true,
	reflect.TypeFor[write]():            true,
}

// reachesPoolState returns the paths by which a value of type root can
// reach the pool's state through its fields.
func reachesPoolState(root reflect.Type) []string {
	var out []string
	seen := map[reflect.Type]bool{}
	var walk func(typ reflect.Type, path string)
	walk = func(typ reflect.Type, path string) {
		if poolState[typ] {
			out = append(out, path+" ("+typ.String()+")")
			return
		}
		if seen[typ] {
			return
		}
		seen[typ] = true
		switch typ.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Chan:
			walk(typ.Elem(), path+"[*]")
		case reflect.Map:
			walk(typ.Key(), path+"[key]")
			walk(typ.Elem(), path+"[elem]")
		case reflect.Struct:
			for f := range typ.Fields() {
				walk(f.Type, path+"."+f.Name)
			}
		}
	}
	walk(root, root.Name())
	return out
}

// TestExecutorHoldsNoPoolState checks the construction docs/design.md §10
// rests on: nothing the executor or an effects value holds can reach the
// pool's state, so the API calls a round makes concurrently cannot change
// what it decided on, nor race on it. A field added to a call that points
// into the pool (a *podInfo, say) fails this test.
func TestExecutorHoldsNoPoolState(t *testing.T) {
	for _, root := range []reflect.Type{reflect.TypeFor[executor](), reflect.TypeFor[effects]()} {
		if paths := reachesPoolState(root); len(paths) > 0 {
			t.Errorf("%s reaches the pool's state: %v", root, paths)
		}
	}
	// The check sees such a field, however deep.
	type leaky struct {
		calls []*struct{ by map[string]*podInfo }
	}
	_ = leaky{}.calls
	if paths := reachesPoolState(reflect.TypeFor[leaky]()); len(paths) != 1 {
		t.Errorf("a *podInfo three levels down: found %v, want one path", paths)
	}
}

// pipelineExecutor returns an executor whose recycles call f with the
// pod's name, for pipeline's tests; recycles returns such calls.
func pipelineExecutor(limit int, f func(pod string)) *executor {
	return &executor{ctx: context.Background(), limit: limit, recycler: func(_ context.Context, req RecycleRequest) (bool, error) {
		f(req.Pod)
		return true, nil
	}}
}

func recycles(pods ...string) *effects {
	e := &effects{}
	for _, p := range pods {
		e.recycles = append(e.recycles, &recycleCall{req: RecycleRequest{Pod: p}})
	}
	return e
}

// TestPipelineTakesGroupsInOrder: a group is taken in only once it and
// every group before it are done, in the order of the groups, also when
// the first group finishes last; the calls then returns are made; no more
// calls run at once than the limit.
func TestPipelineTakesGroupsInOrder(t *testing.T) {
	lastDone := make(chan struct{})
	var mu sync.Mutex
	var running, most int
	var ran []string
	x := pipelineExecutor(3, func(pod string) {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		if pod == "a1" {
			<-lastDone // group 0 finishes after every other call
		}
		mu.Lock()
		running--
		ran = append(ran, pod)
		mu.Unlock()
		if pod == "c3" {
			close(lastDone)
		}
	})
	groups := []*effects{recycles("a1", "a2"), recycles("b1"), recycles(), recycles("c1", "c2", "c3")}
	var order []int
	x.pipeline(groups, func(g int) *effects {
		for _, c := range groups[g].recycles {
			if !c.done {
				t.Errorf("group %d taken in before its call %s was done", g, c.req.Pod)
			}
		}
		order = append(order, g)
		return recycles(fmt.Sprintf("then%d", g))
	})
	if !slices.Equal(order, []int{0, 1, 2, 3}) {
		t.Errorf("groups taken in as %v, want in order", order)
	}
	at := func(p string) int { return slices.Index(ran, p) }
	if len(ran) != 10 || at("a1") < at("c3") || at("then0") < at("a1") {
		t.Errorf("want ten calls, a1 after c3 and then0 after a1: %v", ran)
	}
	for g := range groups {
		if p := fmt.Sprintf("then%d", g); !slices.Contains(ran, p) {
			t.Errorf("call %s that then returned did not run: %v", p, ran)
		}
	}
	if most > 3 {
		t.Errorf("%d calls at once, limit 3", most)
	}
}

// panicReader panics on a Get of the pod named boom.
type panicReader struct{ client.Reader }

func (panicReader) Get(_ context.Context, key client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	if key.Name == "boom" {
		panic("boom")
	}
	return nil
}

func podReads(pods ...string) *effects {
	e := &effects{}
	for _, p := range pods {
		e.podReads = append(e.podReads, &podGet{name: p})
	}
	return e
}

// TestPipelineRaisesAPanicOnce: a panic in a call is raised in the caller
// once the calls in flight are done, and neither its group nor a later
// one is taken in.
func TestPipelineRaisesAPanicOnce(t *testing.T) {
	x := &executor{ctx: context.Background(), limit: 1, pods: panicReader{}}
	var taken []int
	defer func() {
		if v := recover(); v != "boom" {
			t.Errorf("recovered %v, want boom", v)
		}
		if !slices.Equal(taken, []int{0}) {
			t.Errorf("groups taken in: %v, want only the one before the panic", taken)
		}
	}()
	x.pipeline([]*effects{podReads("a"), podReads("boom"), podReads("c")}, func(g int) *effects {
		taken = append(taken, g)
		return nil
	})
	t.Error("no panic")
}
