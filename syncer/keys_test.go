package syncer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/poolalloc/poolalloc/syncer"
)

func TestKeyPresets(t *testing.T) {
	require.Equal(t, syncer.Keys{
		Allocated: "poolalloc.io/allocated",
		Release:   "poolalloc.io/release",
		Released:  "poolalloc.io/released",
		Finalizer: "poolalloc.io/allocation",
		Touched:   "poolalloc.io/touched",
	}, syncer.DefaultKeys())
	require.Equal(t, syncer.Keys{
		Allocated: "sandbox.opensandbox.io/alloc-status",
		Release:   "sandbox.opensandbox.io/alloc-release",
		Released:  "sandbox.opensandbox.io/alloc-released",
		Finalizer: "pool.sandbox.opensandbox.io/pool-allocation",
		Touched:   "poolalloc.io/touched",
	}, syncer.OpenSandboxKeys())
	require.NoError(t, syncer.DefaultKeys().Validate())
	require.NoError(t, syncer.OpenSandboxKeys().Validate())
}

func TestKeysValidate(t *testing.T) {
	with := func(f func(*syncer.Keys)) syncer.Keys {
		k := syncer.DefaultKeys()
		f(&k)
		return k
	}
	for _, tc := range []struct {
		keys syncer.Keys
		msg  string
	}{
		{with(func(k *syncer.Keys) { k.Allocated = "" }), "Allocated is empty"},
		{with(func(k *syncer.Keys) { k.Release = "" }), "Release is empty"},
		{with(func(k *syncer.Keys) { k.Released = "" }), "Released is empty"},
		{with(func(k *syncer.Keys) { k.Finalizer = "" }), "Finalizer is empty"},
		{with(func(k *syncer.Keys) { k.Touched = "" }), "Touched is empty"},
		{with(func(k *syncer.Keys) { k.Touched = "a b" }), `Touched "a b"`},
		{with(func(k *syncer.Keys) { k.Allocated = "has space" }), `Allocated "has space"`},
		{with(func(k *syncer.Keys) { k.Release = "a/b/c" }), `Release "a/b/c"`},
		{with(func(k *syncer.Keys) { k.Released = "/released" }), `Released "/released": prefix part`},
		{with(func(k *syncer.Keys) { k.Finalizer = "Example.com/x" }), `Finalizer "Example.com/x": prefix part`},
		{with(func(k *syncer.Keys) { k.Finalizer = "example.com/-x" }), `Finalizer "example.com/-x": name part`},
		{with(func(k *syncer.Keys) { k.Release = k.Allocated }), `Allocated and Release are both "poolalloc.io/allocated"`},
		{with(func(k *syncer.Keys) { k.Released = k.Allocated }), `Allocated and Released are both`},
		{with(func(k *syncer.Keys) { k.Released = k.Release }), `Release and Released are both`},
		{with(func(k *syncer.Keys) { k.Touched = k.Released }), `Released and Touched are both`},
	} {
		err := tc.keys.Validate()
		require.ErrorIs(t, err, syncer.ErrInvalidKeys, "%+v", tc.keys)
		require.ErrorContains(t, err, tc.msg)
	}
	// The finalizer may equal an annotation key: they live apart.
	require.NoError(t, with(func(k *syncer.Keys) { k.Finalizer = k.Allocated }).Validate())
	// Names without a prefix are qualified names too.
	require.NoError(t, syncer.Keys{Allocated: "a", Release: "b", Released: "c", Touched: "t", Finalizer: "d"}.Validate())
}
