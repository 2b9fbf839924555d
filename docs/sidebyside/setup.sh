#!/bin/sh
# setup.sh OPENSANDBOX POOLALLOC OUT: puts poolalloc (the checkout at
# POOLALLOC) and this directory's side-by-side benchmark into OPENSANDBOX
# (a checkout of alibaba/OpenSandbox, measured at commit 4db3a993; its
# kubernetes/go.mod and internal/controller are changed) and builds that
# package's test binary as OUT. Nothing of OpenSandbox is kept in this
# repository.
set -eu
osb=$(cd "$1" && pwd)/kubernetes
pa=$(cd "$2" && pwd)
out=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
here=$(cd "$(dirname "$0")" && pwd)
cd "$osb"
go mod edit -require github.com/poolalloc/poolalloc@v0.0.0 -replace "github.com/poolalloc/poolalloc=$pa"
# The README's adapter, verbatim.
awk '/^\*\*The adapter\.\*\*/{f=1} f&&/^```go/{g=1;next} g&&/^```/{exit} g{print}' "$pa/README.md" > internal/controller/poolalloc_adapter.go
cp "$here/recover_test.go.txt" internal/controller/poolalloc_sidebyside_test.go
go mod tidy
go test -c -o "$out" ./internal/controller/
echo "built $out; run it from $osb/internal/controller"
