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

// TestWriteCostSmall runs the write-cost mode at a small size: every kind
// of write succeeds on the real API server, each leaving the pods and
// claims as the next kind needs them, over two repetitions.
func TestWriteCostSmall(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	f := flags{claims: 1, pods: 12, concurrency: 4, writers: 4, timeout: time.Minute, marks: true, writeCost: 10, costReps: 2}
	if err := run(context.Background(), f); err != nil {
		t.Fatal(err)
	}
}
