#!/usr/bin/env bash
# Runs kproxy's whole test suite: unit tests, and (as root) the kernel tests
# that create network namespaces and send real traffic through kproxy's rules.
# Not root: kernel tests skip themselves with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

echo "== go vet"
go vet ./...
echo "== go test"
# -p 2: the reference machine has 2 cores; kernel tests use their own netns.
go test -p 2 -count=1 -timeout 45m ./... "$@"
echo "== feature gate table matches upstream (test/tools)"
(cd test/tools && go vet ./cmd/featuregates && go test -count=1 ./cmd/featuregates/)
