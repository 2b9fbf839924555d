package main

import (
	"context"
	"testing"
)

// TestQuickstart runs the walkthrough on an embedded API server: every step
// checks who holds what (expect), and the restart checks recovery pod for
// pod.
func TestQuickstart(t *testing.T) {
	t.Setenv("KUBECONFIG", "") // the embedded API server, never a cluster of yours
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}
