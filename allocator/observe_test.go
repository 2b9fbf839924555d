package allocator_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/require"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/world"
)

// capture returns a context whose logger keeps every line at verbosity v
// or below, and the lines.
func capture(v int) (context.Context, *[]string) {
	var lines []string
	log := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: v})
	return logr.NewContext(context.Background(), log), &lines
}

// TestRoundLogsThroughTheContextsLogger checks the levels the Allocator
// documents: nothing at the default level, a summary at V(4), each claim's
// hand-outs at V(5).
func TestRoundLogsThroughTheContextsLogger(t *testing.T) {
	for _, c := range []struct {
		verbosity int
		want      []string // substrings, one line each, in order
	}{
		{0, nil},
		{4, []string{`"msg"="Round" "pool"="ns/p" "allocated"=1`}},
		{5, []string{`"msg"="Round" "pool"="ns/p" "allocated"=1`, `"msg"="allocated" "pool"="ns/p" "claim"="ns/c"`}},
	} {
		c0, pool, _ := regressionPool(t, 2, 1)
		a, err := allocator.New(c0)
		require.NoError(t, err)
		ctx, lines := capture(c.verbosity)
		in, err := world.Input(ctx, c0, pool)
		require.NoError(t, err)
		_, err = a.Round(ctx, in)
		require.NoError(t, err)
		require.Len(t, *lines, len(c.want), "verbosity %d: %q", c.verbosity, *lines)
		for i, w := range c.want {
			require.Contains(t, (*lines)[i], w, "verbosity %d", c.verbosity)
		}
	}
}

// cancelling is a strategy that cancels the round's context while it plans.
type cancelling struct {
	algorithm.Packed
	cancel context.CancelFunc
}

func (s cancelling) Plan(in algorithm.Input) (algorithm.Action, error) {
	s.cancel()
	return s.Packed.Plan(in)
}

// TestCancelledContextWritesNothing cancels a round's context before it
// starts and while it plans, on the real API server: the round returns the
// context's error and writes nothing; a later round serves the claim.
func TestCancelledContextWritesNothing(t *testing.T) {
	f := newFixture(t)
	pool := f.pool("p", 2)
	f.claim("c", "p", 1)
	rv := f.get("c").ResourceVersion

	ctx, cancel := context.WithCancel(f.ctx)
	cancel()
	a := f.alloc()
	in, err := world.Input(f.ctx, f.c, pool)
	require.NoError(t, err)
	_, err = a.Round(ctx, in)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, rv, f.get("c").ResourceVersion, "nothing written")

	ctx, cancel = context.WithCancel(f.ctx)
	defer cancel()
	b := f.alloc(allocator.WithAlgorithm(cancelling{cancel: cancel}))
	_, err = b.Round(ctx, in)
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, errors.Is(err, context.Canceled) && strings.Contains(err.Error(), pool.String()), "%v", err)
	require.Equal(t, rv, f.get("c").ResourceVersion, "cancelled while planning: nothing written")
	for name, mark := range f.marks("p") {
		require.Empty(t, mark, "pod %s marked", name)
	}

	res := f.round(b, pool) // the strategy cancels only the context it was given first
	require.Len(t, grantsTo(res, "c"), 1)
}
