// Package fuzzround holds the fuzz target for a round's input: pods,
// claims and claim records as hostile or broken as a fuzzer can make them.
// It lives apart from package allocator's tests so that fuzz workers do not
// each start the API server that those tests share.
package fuzzround
