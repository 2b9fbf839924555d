package index

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

type indexEntry struct{ k, v string }

// The index against a Go map: every get, set and del in any order, with
// keys drawn from a small set so that probes collide and wrap.
func TestIsAMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		x := New(func(e *indexEntry) string { return e.k }, rapid.IntRange(0, 20).Draw(t, "size hint"))
		model := map[string]*indexEntry{}
		keys := rapid.SampledFrom(func() []string {
			ks := make([]string, 40)
			for i := range ks {
				ks[i] = fmt.Sprintf("k%d", i)
			}
			return ks
		}())
		t.Repeat(map[string]func(*rapid.T){
			"set": func(t *rapid.T) {
				e := &indexEntry{k: keys.Draw(t, "key"), v: rapid.String().Draw(t, "value")}
				x.Set(e)
				model[e.k] = e
			},
			"insert": func(t *rapid.T) {
				e := &indexEntry{k: keys.Draw(t, "key"), v: rapid.String().Draw(t, "value")}
				got, added := x.Insert(e)
				if old, ok := model[e.k]; ok {
					if added || got != old {
						t.Fatalf("insert %s over %v: %v, %v; want the entry there, false", e.k, old, got, added)
					}
					return
				}
				if !added || got != e {
					t.Fatalf("insert %s: %v, %v; want it, true", e.k, got, added)
				}
				model[e.k] = e
			},
			"grow": func(t *rapid.T) {
				x.Grow(rapid.IntRange(0, 50).Draw(t, "n"))
			},
			"del": func(t *rapid.T) {
				k := keys.Draw(t, "key")
				x.Del(k)
				delete(model, k)
			},
			"getMany": func(t *rapid.T) {
				ks := rapid.SliceOfN(keys, 0, ManyMax).Draw(t, "keys")
				out := make([]*indexEntry, len(ks))
				x.GetMany(ks, out)
				for i, k := range ks {
					if out[i] != model[k] {
						t.Fatalf("getMany %v: %s is %v, want %v", ks, k, out[i], model[k])
					}
				}
			},
			"get": func(t *rapid.T) {
				k := keys.Draw(t, "key")
				if got, want := x.Get(k), model[k]; got != want {
					t.Fatalf("get %s: %v, want %v", k, got, want)
				}
			},
			"": func(t *rapid.T) {
				if x.Len() != len(model) {
					t.Fatalf("len %d, want %d", x.Len(), len(model))
				}
				all := slices.Collect(x.All())
				if len(all) != len(model) {
					t.Fatalf("all yields %d entries, want %d", len(all), len(model))
				}
				for _, e := range all {
					if model[e.k] != e {
						t.Fatalf("all yields %v, not in the model", e)
					}
				}
				for _, k := range slices.Sorted(maps.Keys(model)) {
					if x.Get(k) != model[k] {
						t.Fatalf("get %s: %v, want %v", k, x.Get(k), model[k])
					}
				}
				if free := x.size() - x.n; x.size() > 0 && free < x.size()/8 {
					t.Fatalf("%d entries in %d slots", x.n, x.size())
				}
			},
		})
	})
}

// An index with only its key set is empty and grows on first use.
func TestKeyOnly(t *testing.T) {
	var x Index[*indexEntry]
	x.Key = func(e *indexEntry) string { return e.k }
	if x.Get("a") != nil || x.Len() != 0 {
		t.Fatal("the zero index is not empty")
	}
	x.Del("a")
	e := &indexEntry{k: "a"}
	x.Set(e)
	if x.Get("a") != e || x.Len() != 1 {
		t.Fatal("set on the zero index is lost")
	}
}
