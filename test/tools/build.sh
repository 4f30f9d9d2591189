#!/usr/bin/env bash
# Builds the upstream binaries the end-to-end and compatibility tests run
# (kube-apiserver, a small embedded etcd, kube-proxy as the oracle for
# test/compat and listgates, which lists every gate kube-proxy registers)
# into _output/bin of the repository, unless they are already there. Idempotent: a second run does nothing. Pass --force to
# rebuild.
#
# The binaries come from this separate module (test/tools) so kproxy's own
# go.mod never pulls in k8s.io/kubernetes. A cold kube-apiserver build takes
# about 10 minutes on 2 cores; kube-proxy shares most of its packages and
# takes a few minutes after it. Builds run under `nice` because the machine
# is shared.
#
# Environment: KPROXY_E2E_BIN overrides the output directory (the test
# harness reads the same variable).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${KPROXY_E2E_BIN:-$repo/_output/bin}"
export PATH="/usr/local/go/bin:$PATH"

force=0
[ "${1:-}" = "--force" ] && force=1

# The version the API server reports; must match go.mod's k8s.io/kubernetes.
kube_version="$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"

mkdir -p "$out"
cd "$here"

build() { # build NAME PACKAGE [go build args...]
  local name="$1" pkg="$2"
  shift 2
  if [ "$force" = 0 ] && [ -x "$out/$name" ]; then
    echo "== $name: present in $out"
    return
  fi
  echo "== building $name ($pkg)"
  local start=$SECONDS
  # Build to a temporary name and rename, so an interrupted build never
  # leaves a half-written binary that looks present.
  nice -n 10 go build -trimpath "$@" -o "$out/.$name.tmp" "$pkg"
  mv -f "$out/.$name.tmp" "$out/$name"
  echo "== $name built in $((SECONDS - start))s"
}

build etcd ./cmd/etcd
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver \
  -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$kube_version"
build kube-proxy k8s.io/kubernetes/cmd/kube-proxy \
  -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$kube_version"
build listgates ./cmd/listgates
build kubemark k8s.io/kubernetes/cmd/kubemark -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$kube_version"
