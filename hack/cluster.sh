#!/usr/bin/env bash
# A Kubernetes v1.37 cluster from real parts on this machine, for trying
# kproxy as users deploy it: the control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) and 3 nodes (containerd 2.x with
# runc and the CNI bridge, a kubelet), each in a network namespace of its
# own, no kube-proxy. Package test/cluster has the layout; nothing reaches
# outside the namespaces (no default route anywhere).
#
#   sudo hack/cluster.sh up [--nodes N]     start it; returns when every node is Ready
#   sudo hack/cluster.sh status             is it up, where are its parts
#   sudo hack/cluster.sh kubectl get pods -A  kubectl as admin (run inside the control plane's netns)
#   sudo hack/cluster.sh deploy kproxy [--mode nftables|iptables] [--backend legacy|nft]
#                                           import the kproxy image on every node, apply
#                                           deploy/kproxy.yaml, wait for the rollout; then
#                                           the cluster DNS (test/tools/coredns/coredns.yaml)
#   sudo hack/cluster.sh deploy kube-proxy [--mode ...] [--backend legacy|nft]
#                                           upstream kube-proxy v1.37.2 as kubeadm deploys it
#                                           (its image: kproxy's with the binary of KPROXY_E2E_BIN)
#   sudo hack/cluster.sh down               stop it and remove everything it made
#
# Needs root; the binaries in KPROXY_E2E_BIN (default _output/bin:
# test/tools/build.sh builds them), the image archives (pause, agnhost) in
# KPROXY_IMAGES_DIR (default _output/images), Debian's runc and
# containernetworking-plugins, and for deploy the kproxy image archive
# (hack/image.sh; KPROXY_IMAGE_ARCHIVE overrides). "up" on a leftover of a
# cluster whose server was killed removes it first. KPROXY_CLUSTER names
# another cluster (default kproxy-cluster: /var/lib/kproxy-cluster,
# /run/kproxy-cluster, the server's log in /tmp/kproxy-cluster.log).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export PATH="/usr/local/go/bin:$PATH"
if [ "$(id -u)" != 0 ]; then
	echo "hack/cluster.sh: needs root (network namespaces, containerd, kubelets)" >&2
	exit 2
fi
name=${KPROXY_CLUSTER:-kproxy-cluster}
bin=_output/kcluster
go build -o "$bin" ./test/cluster/kcluster
global=(--name="$name")
if [ "${1:-}" = up ]; then
	shift
	while [ $# -gt 0 ]; do
		case "$1" in
		--nodes) global+=(--nodes="$2"); shift 2 ;;
		--nodes=*) global+=("$1"); shift ;;
		*) echo "hack/cluster.sh up: unknown flag $1" >&2; exit 2 ;;
		esac
	done
	set -- up
fi
exec "$bin" "${global[@]}" "$@"
