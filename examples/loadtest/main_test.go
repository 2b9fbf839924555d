package main

import (
	"context"
	"testing"
	"time"
)

// TestLoadtestSmall runs the load test at a small size on an embedded API
// server, with pod marks and without: every claim is served within the
// timeout and the records check out (verify). Its figures are not checked:
// speed is measured by running the command, not by a test.
func TestLoadtestSmall(t *testing.T) {
	t.Setenv("KUBECONFIG", "") // the embedded API server, never a cluster of yours
	for _, marks := range []bool{true, false} {
		f := flags{claims: 60, pods: 70, concurrency: 8, writers: 4, timeout: 2 * time.Minute, marks: marks}
		if err := run(context.Background(), f); err != nil {
			t.Fatalf("marks=%t: %v", marks, err)
		}
	}
}
