#!/bin/sh
# setup.sh OPENSANDBOX POOLALLOC: puts poolalloc and this directory's
# side-by-side benchmarks into OPENSANDBOX (a checkout of
# alibaba/OpenSandbox, measured at commit 4db3a993) and builds its
# controller package's test binary as ./osb.test. Nothing of OpenSandbox
# is kept in this repository.
set -eu
osb=$(cd "$1" && pwd)/kubernetes
pa=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
cd "$osb"
go mod edit -require github.com/poolalloc/poolalloc@v0.0.0 -replace "github.com/poolalloc/poolalloc=$pa"
# The README's adapter, verbatim.
awk '/^\*\*The adapter\.\*\*/{f=1} f&&/^```go/{g=1;next} g&&/^```/{exit} g{print}' "$pa/README.md" > internal/controller/poolalloc_adapter.go
cp "$here/recover_test.go.txt" internal/controller/poolalloc_sidebyside_test.go
go mod tidy
go test -c -o "$here/osb.test" ./internal/controller/
echo "built $here/osb.test; run it from $osb/internal/controller"
