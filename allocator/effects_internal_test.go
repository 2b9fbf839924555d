package allocator

import (
	"reflect"
	"testing"
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
