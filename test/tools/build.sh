#!/usr/bin/env bash
# Builds the upstream binaries the end-to-end, compatibility and cluster
# tests run into _output/bin of the repository, unless they are already
# there. Idempotent: a second run does nothing. Pass --force to rebuild.
#
#   etcd, kube-apiserver     the control plane of test/e2e (a small embedded etcd)
#   kube-proxy               the oracle of test/compat, the control of the cluster runs
#   listgates                lists every gate kube-proxy registers
#   kubelet, kube-controller-manager, kube-scheduler, kubectl
#                            the rest of test/cluster's cluster (hack/cluster.sh)
#   containerd, containerd-shim-runc-v2, ctr
#                            its nodes' container runtime, 2.x (Debian's 1.6 is too
#                            old for kubelet 1.37); runc and the CNI plugins are
#                            Debian's (hack/test.sh installs them)
#   e2e.test, ginkgo         upstream's e2e suite and the ginkgo CLI that runs it
#                            in parallel (test/cluster/e2erun, hack/conformance.sh)
#
# The images those tests run are built by images.sh beside this script.
#
# The binaries come from this separate module (test/tools) so kproxy's own
# go.mod never pulls in k8s.io/kubernetes, and containerd from a module of
# its own (test/tools/containerd) so its dependency versions never meet
# k8s.io/kubernetes's. A cold kube-apiserver build takes about 10 minutes on
# 2 cores; the other Kubernetes binaries share most of its packages and take
# a few minutes each after it (kubelet ~4, e2e.test the longest). Builds run
# under `nice` because the machine is shared.
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
moddir=$here

build() { # build NAME PACKAGE [go build args...], in module directory $moddir
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
  # NAME.test: the test binary of PACKAGE.
  local gocmd=(build)
  [[ $name != *.test ]] || gocmd=(test -c)
  (cd "$moddir" && nice -n 10 go "${gocmd[@]}" -trimpath "$@" -o "$out/.$name.tmp" "$pkg")
  mv -f "$out/.$name.tmp" "$out/$name"
  echo "== $name built in $((SECONDS - start))s"
}

# Kubernetes binaries report the version of go.mod's k8s.io/kubernetes.
kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version"

build etcd ./cmd/etcd
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver -ldflags "$kube_ldflags"
build kube-proxy k8s.io/kubernetes/cmd/kube-proxy -ldflags "$kube_ldflags"
build listgates ./cmd/listgates
# The rest of a cluster (test/cluster, hack/cluster.sh): a node's kubelet,
# the controller manager, the scheduler and kubectl.
build kubelet k8s.io/kubernetes/cmd/kubelet -ldflags "$kube_ldflags"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager -ldflags "$kube_ldflags"
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler -ldflags "$kube_ldflags"
build kubectl k8s.io/kubernetes/cmd/kubectl -ldflags "$kube_ldflags"
# Upstream's hollow node: --morph=proxy is the hollow proxy the many-node
# harness (test/bench/harness) runs beside kproxy's hollow nodes.
build kubemark k8s.io/kubernetes/cmd/kubemark -ldflags "$kube_ldflags"
# containerd 2.x, static (CGO_ENABLED=0: no btrfs, which needs cgo and
# libbtrfs; devmapper and zfs left out as the nodes use overlayfs), stamped
# with its module version as containerd's Makefile does. The shim without
# gRPC (ttrpc only), as the Makefile builds it.
moddir=$here/containerd
containerd_version="$(cd "$moddir" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)"
containerd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
CGO_ENABLED=0 build containerd github.com/containerd/containerd/v2/cmd/containerd \
  -tags "urfave_cli_no_docs no_btrfs no_devmapper no_zfs" -ldflags "$containerd_ldflags"
CGO_ENABLED=0 build containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  -tags "urfave_cli_no_docs no_grpc" -ldflags "$containerd_ldflags"
CGO_ENABLED=0 build ctr github.com/containerd/containerd/v2/cmd/ctr \
  -tags "urfave_cli_no_docs" -ldflags "$containerd_ldflags"

moddir=$here
build e2e.test k8s.io/kubernetes/test/e2e -ldflags "$kube_ldflags"
build ginkgo github.com/onsi/ginkgo/v2/ginkgo -ldflags "-s -w"
