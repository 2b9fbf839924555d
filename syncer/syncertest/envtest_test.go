package syncertest_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/syncer"
	"github.com/poolalloc/poolalloc/syncer/syncertest"
)

// This package's tests run the suite against a real API server. They live
// here rather than in package syncer's tests so that those (and their fuzz
// workers, which rerun TestMain) need no control plane.
var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// TestAnnotationSyncerOnAPIServer runs the conformance suite on
// AnnotationSyncer with typed and unstructured claims of the test CRD,
// under both key presets, each subtest in a namespace of its own.
func TestAnnotationSyncerOnAPIServer(t *testing.T) {
	kinds := []struct {
		name     string
		newClaim func(ns, name string) client.Object
	}{
		{"Typed", func(ns, name string) client.Object { return testenv.NewClaim(ns, name, "pool-a", 1) }},
		{"Unstructured", func(ns, name string) client.Object { return testenv.NewUnstructuredClaim(ns, name, "pool-a", 1) }},
	}
	presets := []struct {
		name string
		keys syncer.Keys
	}{
		{"DefaultKeys", syncer.DefaultKeys()},
		{"OpenSandboxKeys", syncer.OpenSandboxKeys()},
	}
	for _, kind := range kinds {
		for _, preset := range presets {
			t.Run(kind.name+"/"+preset.name, func(t *testing.T) {
				t.Parallel()
				syncertest.Run(t, func(t *testing.T) (syncer.AllocationSyncer, client.Client, func(string) client.Object) {
					ns := env.Namespace(t.Context(), t)
					s, err := syncer.NewAnnotationSyncer(env.Client, preset.keys, syncer.WithAPIReader(env.Client))
					require.NoError(t, err)
					return s, env.Client, func(name string) client.Object { return kind.newClaim(ns, name) }
				})
			})
		}
	}
}
