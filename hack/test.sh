#!/usr/bin/env bash
# kproxy's whole test suite: the README's second command, and what CI runs
# (.ci/run calls it and adds nothing).
#
#   sudo hack/test.sh                 everything; first installs and builds what is missing
#   hack/test.sh --unit               the unit tests alone: no root, nothing installed
#   sudo hack/test.sh -run TestFoo    extra flags go to every `go test`
#
# As root, set-up installs and builds what the suite needs, each step only
# when missing: Debian's nftables, iptables, iproute2, conntrack, ipset and
# containerd (TestImageContainerdImport imports the image with its ctr),
# runc and containernetworking-plugins (the test cluster's nodes); the
# test VM (test/vm/prepare.sh: qemu and Debian's kernel with SCTP and IPVS
# modules); kube-apiserver and etcd for the end-to-end tests
# (test/tools/build.sh, ~10 minutes the first time); the container image
# (hack/image.sh: mmdebstrap and umoci, a few minutes the first time). Then KPROXY_VM=1 and
# KPROXY_E2E=1 make a missing VM or control plane a failure, never a skip;
# what cannot be installed fails the run, naming it. Without root the
# whole suite refuses to start (use --unit).
#
# Groups: unit (every package but the ones below; as root their kernel
# tests run too), kernel (test/kernel), vm (internal/testutil/vm; test/vmsuite:
# every test that needs the VM's kernel, in one boot), fuzz
# (each fuzz target for a fixed number of executions; FUZZTIME overrides), e2e
# (test/e2e and test/compat, upstream kube-proxy as the oracle, and
# test/cluster, kproxy deployed into a multi-node cluster; run beside
# the others: they mostly wait), then test/monitoring and test/tools
# (modules of their own). It prints where the time went and one closing
# line: N passed, N failed, N skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
export DEBIAN_FRONTEND=noninteractive

unit=0
if [ "${1:-}" = "--unit" ]; then
  unit=1
  shift
fi
out="$(mktemp -d -t kproxy-test-XXXXXX)"
e2e_pid=""
cleanup() {
  if [ -n "$e2e_pid" ]; then kill "$e2e_pid" 2>/dev/null || true; fi
  rm -rf "$out"
}
trap cleanup EXIT
start=$SECONDS
timing=()
took() { timing+=("$(printf '  %-8s %6ds' "$1" $((SECONDS - $2)))"); }

if [ "$unit" = 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "hack/test.sh: the whole suite needs root (network namespaces, nftables, the test VM, the end-to-end control plane)." >&2
    echo "Run it with sudo, or 'hack/test.sh --unit' for the unit tests alone." >&2
    exit 2
  fi
  t=$SECONDS
  echo "== set-up"
  pkgs=()
  command -v nft >/dev/null 2>&1 || pkgs+=(nftables)
  command -v iptables >/dev/null 2>&1 || pkgs+=(iptables)
  command -v ip >/dev/null 2>&1 || pkgs+=(iproute2)
  command -v conntrack >/dev/null 2>&1 || pkgs+=(conntrack)
  # Upstream kube-proxy's ipvs mode runs ipset (TestUpstreamIPVSToKproxy).
  command -v ipset >/dev/null 2>&1 || pkgs+=(ipset)
  command -v containerd >/dev/null 2>&1 || pkgs+=(containerd)
  # The test cluster's nodes (test/cluster): runc under containerd 2.x
  # (test/tools/build.sh) and the CNI plugins bridge, host-local, loopback
  # and portmap.
  command -v runc >/dev/null 2>&1 || pkgs+=(runc)
  cni_plugins=(bridge host-local loopback portmap)
  for p in "${cni_plugins[@]}"; do
    if [ ! -x "/usr/lib/cni/$p" ]; then
      pkgs+=(containernetworking-plugins)
      break
    fi
  done
  if [ "${#pkgs[@]}" -gt 0 ]; then
    echo "== installing ${pkgs[*]}"
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; }; then
      echo "hack/test.sh: could not install ${pkgs[*]} with apt-get; install them and run again" >&2
      exit 1
    fi
  fi
  for b in nft iptables iptables-legacy iptables-nft ip conntrack ipset containerd ctr runc; do
    if ! command -v "$b" >/dev/null 2>&1; then
      echo "hack/test.sh: $b is still missing after set-up" >&2
      exit 1
    fi
  done
  for p in "${cni_plugins[@]}"; do
    if [ ! -x "/usr/lib/cni/$p" ]; then
      echo "hack/test.sh: the CNI plugin /usr/lib/cni/$p is still missing after set-up" >&2
      exit 1
    fi
  done
  nft --version
  go version
  bash test/vm/prepare.sh
  bash test/tools/build.sh
  # The images test/cluster's nodes import (pause, agnhost, CoreDNS, ...;
  # a no-op for each archive whose inputs are unchanged).
  bash test/tools/images.sh
  # The container image TestImage runs kproxy from (a no-op when the
  # archive for this source state exists).
  bash hack/image.sh
  export KPROXY_VM=1 KPROXY_E2E=1
  took set-up "$t"
fi

t=$SECONDS
echo "== verify: gofmt, go vet, staticcheck"
bash hack/verify.sh
took verify "$t"

# gts NAME [go test args...]: one group through gotestsum, its events kept
# for the summary.
gts() {
  local name="$1"
  shift
  go tool gotestsum --format pkgname-and-test-fails --jsonfile "$out/$name.json" -- -count=1 -timeout 45m "$@"
}

all=$(go list ./...)
e2e_pkgs=$(grep -E '/test/(e2e|compat|cluster)(/|$)' <<<"$all" || true)
kernel_pkgs=$(grep -E '/test/kernel$' <<<"$all" || true)
vm_pkgs=$(grep -E '/internal/testutil/vm$|/test/vmsuite$' <<<"$all" || true)
unit_pkgs=$(grep -vE '/test/(e2e|compat|cluster)(/|$)|/test/kernel$|/internal/testutil/vm$|/test/vmsuite$' <<<"$all")
# The tests that need the VM's kernel run in one boot (test/vmsuite,
# listed in its tests.txt); the host's groups leave them out.
vm_only="^($(sed -e 's/#.*//' -e 's/gate=/ /g' -e 's/,/ /g' test/vmsuite/tests.txt | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^Test/) print $i}' | paste -sd'|'))\$"

status=0
if [ "$unit" = 0 ]; then
  # The end-to-end tests mostly wait (API server outages, watch
  # expiry): they run beside the other groups, their output kept apart.
  (
    t=$SECONDS
    rc=0
    # shellcheck disable=SC2086
    gts e2e -skip "$vm_only" "$@" $e2e_pkgs >"$out/e2e.log" 2>&1 || rc=$?
    echo "$((SECONDS - t))" >"$out/e2e.seconds"
    exit "$rc"
  ) &
  e2e_pid=$!
fi

t=$SECONDS
echo "== unit tests"
# shellcheck disable=SC2086
gts unit -p 2 -skip "$vm_only" "$@" $unit_pkgs || status=1
took unit "$t"

if [ "$unit" = 0 ]; then
  t=$SECONDS
  echo "== kernel tests"
  # shellcheck disable=SC2086
  gts kernel -skip "$vm_only" "$@" $kernel_pkgs || status=1
  took kernel "$t"
  t=$SECONDS
  echo "== VM tests"
  # shellcheck disable=SC2086
  gts vm "$@" $vm_pkgs || status=1
  took vm "$t"
  # Fuzzing, bounded: each target for a number of executions (go test
  # -fuzz takes one target at a time), after its seed corpus ran with the
  # unit tests. Counts, not durations: Go 1.26's fuzz coordinator can fail
  # a time-bounded run with "context deadline exceeded" when the deadline
  # fires while a worker is busy (golang/go#75804, fixed in Go 1.27), which
  # a loaded machine makes likely; a count has no deadline to race.
  # FUZZTIME (e.g. 30s or 5000x) replaces every target's budget. Longer
  # runs are made by hand (docs/reliability.md, "Fuzzing").
  t=$SECONDS
  if [ "$#" -gt 0 ]; then
    echo "== fuzzing: skipped (extra go test flags given)"
  else
    echo "== fuzzing: each target ${FUZZTIME:-for its execution count}"
    for target in FuzzConvertObjects:./internal/model:3000x FuzzLoad:./internal/source/file:1000x \
      FuzzLoadConfigFile:./internal/config:3000x FuzzRender:./internal/proxy/nftables:150x \
      FuzzRender:./internal/proxy/iptables:60x; do
      fn=${target%%:*} rest=${target#*:}
      pkg=${rest%%:*} budget=${FUZZTIME:-${rest#*:}}
      gts "fuzz-${fn}-${pkg##*/}" -run '^$' -fuzz "^${fn}\$" -fuzztime "$budget" -parallel 1 "$pkg" || status=1
    done
  fi
  took fuzz "$t"
  echo "== end-to-end tests (started with the unit tests)"
  if ! wait "$e2e_pid"; then status=1; fi
  e2e_pid=""
  cat "$out/e2e.log"
  timing+=("$(printf '  %-8s %6ds (beside the others)' e2e "$(cat "$out/e2e.seconds" 2>/dev/null || echo 0)")")
  # test/monitoring is a module of its own (Prometheus's parser stays out
  # of kproxy's go.mod): the dashboard and alerts name only metrics a
  # running kproxy exports, in every mode.
  t=$SECONDS
  echo "== test/monitoring: the dashboard and alerts against a running kproxy"
  go tool gotestsum --format pkgname-and-test-fails --jsonfile "$out/monitoring.json" \
    --raw-command -- bash -c 'cd test/monitoring && exec go test -json -count=1 ./...' || status=1
  took monitor "$t"
  # test/tools is a module of its own (it depends on k8s.io/kubernetes):
  # the feature gate table kproxy accepts must be upstream's, the pause
  # program keeps pause's contract, and every image upstream's sig-network
  # tests use is built under the name the e2e framework asks for.
  t=$SECONDS
  echo "== test/tools: feature gates, pause, the e2e images"
  (cd test/tools && go vet ./cmd/...) || status=1
  go tool gotestsum --format pkgname-and-test-fails --jsonfile "$out/tools.json" \
    --raw-command -- bash -c 'cd test/tools && exec go test -json -count=1 ./cmd/...' || status=1
  took tools "$t"
fi

echo "== where the time went"
printf '%s\n' "${timing[@]}"
printf '  %-8s %6ds\n' total $((SECONDS - start))
if [ "$unit" = 1 ]; then
  echo "left out (--unit): set-up, the kernel tests (test/kernel), the VM tests, the end-to-end tests;"
  echo "without root the unit packages' own kernel tests skip themselves"
fi
echo "== summary"
go run ./hack/testsummary "$out"/*.json || status=1
exit "$status"
