// Package parallel runs a loop's bodies at once, a bounded number at a
// time, on sync.WaitGroup.Go: what the harness and the examples need of
// errgroup, without golang.org/x/sync.
package parallel

import (
	"context"
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
