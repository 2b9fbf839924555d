// Package v1 is the operator example's API, group test.poolalloc.io,
// version v1: a Pool keeps at least spec.replicas pods and grows to serve
// its claims; a Claim names its pool in spec.poolRef and wants
// spec.replicas pods, spec.priority first when the pool is short, placed by
// spec.selector, spec.class, spec.topology and spec.gang. A pool's pods are
// the pods of its namespace labelled PoolLabel=<pool name>.
//
// Claim and ClaimList are typed (AddToScheme registers them); Pool has no
// Go type and is read as unstructured through PoolGVK. The CRDs that serve
// them ship as YAML in ../../config/crd (package config loads them).
//
// A fork renames the group (Group), replaces the types with its own and
// regenerates the CRDs; nothing else in this package refers to poolalloc's
// tests.
//
//	s := runtime.NewScheme()
//	if err := v1.AddToScheme(s); err != nil { ... }
//	claim := v1.NewClaim("default", "web", "warm", 2)
//	err := c.Create(ctx, claim) // c: a client with scheme s
package v1
