#!/usr/bin/env bash
# Static checks, run by hack/test.sh (and so by CI) before the tests:
# formatting (gofmt, every module of the repository), go vet (also the
# faultinject build of cmd/kproxy the kernel tests use), and staticcheck
# (a Go tool dependency in go.mod: the default checks plus ST1005 as
# configured in staticcheck.conf). Prints nothing but the problems and a
# last line; exit status 1 when there are any.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

status=0
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './_output/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt: these files need formatting (gofmt -w):"
  echo "$unformatted"
  status=1
fi
go vet ./... || status=1
go vet -tags faultinject ./cmd/kproxy || status=1
go tool staticcheck ./... || status=1
if [ "$status" = 0 ]; then
  echo "verify: gofmt, go vet and staticcheck are clean"
else
  echo "verify: problems above"
fi
exit "$status"
