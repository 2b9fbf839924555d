// Package parallel runs a loop's bodies at once, a bounded number at a
// time, on sync.WaitGroup.Go: what the harness and the examples need of
// errgroup, without golang.org/x/sync; and splits a loop over the cores
// (Split).
package parallel

import (
	"context"
	"runtime"
	"sync"
)

// Do runs body(ctx, i) for every i in [0, n), at most limit at a time (at
// least one). The first body to fail cancels the context the others get
// and stops new ones from starting; Do returns that first error once every
// started body has returned. If ctx ends first, Do starts no more bodies
// and returns ctx's error unless a body failed.
func Do(ctx context.Context, n, limit int, body func(ctx context.Context, i int) error) error {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	slots := make(chan struct{}, max(limit, 1))
	for i := range n {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := body(ctx, i); err != nil {
				once.Do(func() {
					first = err
					stop(err)
				})
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// Split runs body over [0, n) cut into consecutive ranges [lo, hi), one
// per core (runtime.GOMAXPROCS), each of at least minChunk indexes: a
// loop of n < 2*minChunk runs as one body, on the calling goroutine. It
// returns once every body has returned. A body that panics makes Split
// panic with the same value on the calling goroutine, after the others
// returned, so that the caller's recover sees it.
func Split(n, minChunk int, body func(lo, hi int)) {
	parts := min(runtime.GOMAXPROCS(0), n/max(minChunk, 1))
	if parts <= 1 {
		body(0, n)
		return
	}
	var (
		wg       sync.WaitGroup
		once     sync.Once
		panicked any
		failed   bool
	)
	for k := range parts {
		lo, hi := k*n/parts, (k+1)*n/parts
		wg.Go(func() {
			defer func() {
				if v := recover(); v != nil {
					once.Do(func() { panicked, failed = v, true })
				}
			}()
			body(lo, hi)
		})
	}
	wg.Wait()
	if failed {
		panic(panicked)
	}
}
