package sharding

// NamespaceOwner is the owner of ns's pools among members with
// ByNamespace, for the tests.
func NamespaceOwner(members []string, ns string) string { return ringOwner(members, fnv1a(ns)) }
