// Package sandboxv1 stands in for an operator's own API package in the
// README's reconciler (allocator/example_reconciler_test.go compiles and
// runs it): its claim types are the test harness's Claim CRD.
package sandboxv1

import "github.com/poolalloc/poolalloc/internal/testenv"

// SandboxClaim is a claim: spec.poolRef, spec.replicas, spec.priority.
type SandboxClaim = testenv.Claim

// SandboxClaimList is a list of SandboxClaims.
type SandboxClaimList = testenv.ClaimList
