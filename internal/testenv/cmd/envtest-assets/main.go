// Command envtest-assets builds, or finds in the cache, the kube-apiserver
// and etcd binaries of poolalloc's test harness and prints their directory.
// CI runs it before the tests so that the first build is not counted against
// any test's timeout:
//
//	go run ./internal/testenv/cmd/envtest-assets
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/poolalloc/poolalloc/internal/testenv"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	dir, err := testenv.Assets(ctx, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(dir)
}
