#!/usr/bin/env bash
# Upstream's sig-network e2e tests (e2e.test v1.37.2) against the test
# cluster of hack/cluster.sh, and docs/conformance.md from their reports.
# A thin wrapper of test/cluster/e2erun/cmd/e2erun:
#
#   hack/conformance.sh run --selection conformance-services \
#       --kubeconfig K --netns NS --report-dir D --proxy kproxy --mode nftables [--procs 4]
#   hack/conformance.sh list --selection sig-network [--verify]    what a selection runs
#   hack/conformance.sh doc REPORT-DIR...                           writes docs/conformance.md
#
# Selections: conformance-services (the [Conformance] tests of [sig-network]
# Services) and sig-network (the Services, kube-proxy, Conntrack and
# Networking tests that fit a cluster without a cloud provider); the tests
# that reach outside the sandbox are skipped by name
# (test/cluster/e2erun/selection.go lists them with the reason). `run`
# needs root for --netns (ip netns exec / nsenter). The binaries come from
# KPROXY_E2E_BIN (default _output/bin; test/tools/build.sh builds them),
# the images the tests run from test/tools/images.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
if [ "${1:-}" = run ]; then
  shift
  exec go run ./test/cluster/e2erun/cmd/e2erun run --record-command="hack/conformance.sh run $*" "$@"
fi
exec go run ./test/cluster/e2erun/cmd/e2erun "$@"
