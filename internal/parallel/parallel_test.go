package parallel_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/poolalloc/poolalloc/internal/parallel"
)

func TestDoRunsEveryBodyWithinTheLimit(t *testing.T) {
	var running, peak, done atomic.Int64
	err := parallel.Do(context.Background(), 50, 4, func(ctx context.Context, i int) error {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		running.Add(-1)
		done.Add(1)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(50), done.Load())
	require.LessOrEqual(t, peak.Load(), int64(4))
}

func TestDoStopsAtTheFirstError(t *testing.T) {
	boom := errors.New("boom")
	var started atomic.Int64
	err := parallel.Do(context.Background(), 1000, 1, func(ctx context.Context, i int) error {
		started.Add(1)
		if i == 3 {
			return boom
		}
		return ctx.Err()
	})
	require.ErrorIs(t, err, boom)
	require.Less(t, started.Load(), int64(1000), "no new bodies after the first error")
}

func TestDoReturnsTheContextsError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	err := parallel.Do(ctx, 3, 2, func(context.Context, int) error { ran = true; return nil })
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, ran)
}

func TestSplitCoversEveryIndexOnce(t *testing.T) {
	for _, n := range []int{0, 1, 7, 100, 1001} {
		seen := make([]atomic.Int32, n)
		parallel.Split(n, 10, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				seen[i].Add(1)
			}
		})
		for i := range seen {
			require.Equal(t, int32(1), seen[i].Load(), "n=%d index %d", n, i)
		}
	}
}

func TestSplitPanicsOnTheCallersGoroutine(t *testing.T) {
	defer func() {
		require.Equal(t, "boom", recover())
	}()
	parallel.Split(1000, 1, func(lo, hi int) {
		if lo <= 500 && 500 < hi {
			panic("boom")
		}
	})
	t.Fatal("Split returned")
}
