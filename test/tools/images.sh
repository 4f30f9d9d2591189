#!/usr/bin/env bash
# Builds the container images upstream's sig-network e2e tests run, from
# sources and Debian packages (no registry, no docker), as OCI archives that
# the test cluster (test/cluster) imports into every node's containerd:
#
#   ctr -n k8s.io images import ARCHIVE
#
# stores each under exactly the name the e2e framework v1.37.2 asks for
# (cmd/e2eimages prints them from k8s.io/kubernetes/test/utils/image), so
# with imagePullPolicy IfNotPresent nothing is ever pulled:
#
#   pause                   registry.k8s.io/pause: cmd/pause, alone (the pod sandbox)
#   agnhost                 registry.k8s.io/e2e-test-images/agnhost: upstream's
#                           agnhost on Debian minbase with the tools its Dockerfile
#                           installs (sh, bash, curl, nc, dig, ip/ss, iperf, socat)
#                           and iptables, conntrack, wget; entrypoint /agnhost,
#                           /agnhost-2, /uploads, porter's certificate, the
#                           image-defined user 1000 and group 50000
#   busybox                 registry.k8s.io/e2e-test-images/busybox: Debian's
#                           busybox-static, every applet linked in /bin
#   nginx                   registry.k8s.io/e2e-test-images/nginx: Debian's nginx on
#                           port 80, in the foreground
#   regression-issue-74839  its upstream program alone
#   distroless-iptables     registry.k8s.io/build-image/distroless-iptables: Debian
#                           minbase with iptables, nftables and conntrack
#   coredns                 registry.k8s.io/coredns/coredns: the cluster's DNS
#                           (test/tools/coredns: CoreDNS with the plugins a cluster
#                           needs, deployed by test/tools/coredns/coredns.yaml),
#                           the version kubeadm v1.37.2 deploys
#
# Each archive is OUT/KEY-TAG-INPUTS.oci.tar, INPUTS a hash of what goes into
# that image (its recipe below and the functions every image is built with,
# hack/lib/oci.sh, and for the Go programs their module's go.mod, go.sum and
# own sources; not the rest of this file, so editing one recipe rebuilds
# one image). An archive whose inputs are
# unchanged is kept and not rebuilt; archives of older inputs are removed.
# OUT/images.txt lists "NAME ARCHIVE" for every image. Go programs are built
# static (CGO_ENABLED=0) under nice.
#
# Usage: test/tools/images.sh [--force] [KEY...]   (default: every image)
#        test/tools/images.sh --list                 KEY NAME of every image
# Needs root (mmdebstrap --mode=root, ownership of the layers' files);
# installs mmdebstrap, umoci and jq when missing.
# Environment: KPROXY_IMAGES_DIR, the output directory (default
# _output/images of the repository); KPROXY_IMAGE_MIRROR as for
# hack/image.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${KPROXY_IMAGES_DIR:-$repo/_output/images}"
export PATH="/usr/local/go/bin:$PATH"

log() { printf 'test/tools/images.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=../../hack/lib/oci.sh
source "$repo/hack/lib/oci.sh"

force=0
keys=()
for a in "$@"; do
	case "$a" in
	--force) force=1 ;;
	--list) (cd "$here" && go run ./cmd/e2eimages); exit 0 ;;
	-*) die "unknown option $a (see the top of test/tools/images.sh)" ;;
	*) keys+=("$a") ;;
	esac
done

# names[KEY] is the image's full name.
declare -A names
while read -r key name; do
	names[$key]=$name
done < <(cd "$here" && go run ./cmd/e2eimages)
((${#names[@]})) || die "cmd/e2eimages listed no image"
if ((${#keys[@]} == 0)); then
	mapfile -t keys < <(cd "$here" && go run ./cmd/e2eimages | cut -d' ' -f1)
fi
for key in "${keys[@]}"; do
	[[ -n ${names[$key]:-} ]] || die "no image $key (test/tools/images.sh --list)"
done

# inputs KEY lists the files that go into image KEY, relative to the
# repository.
inputs() {
	printf '%s\n' hack/lib/oci.sh
	case "$1" in
	pause) printf '%s\n' test/tools/go.mod test/tools/go.sum test/tools/cmd/pause/main.go ;;
	agnhost | regression-issue-74839) printf '%s\n' test/tools/go.mod test/tools/go.sum ;;
	coredns) printf '%s\n' test/tools/coredns/go.mod test/tools/coredns/go.sum test/tools/coredns/main.go ;;
	esac
}

# archive KEY prints the path of image KEY's archive for the current inputs.
archive() {
	local key=$1 name=${names[$1]} id
	id=$({
		printf '%s\n' "$name"
		declare -f "rootfs_$key" build gobuild
		(cd "$repo" && inputs "$key" | xargs sha256sum --)
	} | sha256sum | cut -c1-12)
	printf '%s/%s-%s-%s.oci.tar\n' "$out" "$key" "${name##*:}" "$id"
}

# gobuild PACKAGE OUTPUT [MODULE-DIR] builds a static Go program of the
# test/tools module (or the module in MODULE-DIR).
gobuild() {
	(cd "${3:-$here}" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$2" "$1")
}

# Each rootfs_KEY fills the root filesystem $1 (work directory $2) and
# prints the umoci config arguments of its image, one a line.
rootfs_pause() {
	gobuild ./cmd/pause "$2/pause"
	install -D -m 0755 "$2/pause" "$1/pause"
	# As upstream's pause image: an unprivileged user of its own.
	printf '%s\n' --config.entrypoint=/pause --config.user=65535:65535
}

rootfs_agnhost() {
	local src
	src=$(cd "$here" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost
	gobuild k8s.io/kubernetes/test/images/agnhost "$2/agnhost"
	oci_rootfs "$1" "$out/cache" \
		--include=bash,bind9-dnsutils,conntrack,curl,iperf,iproute2,iptables,netcat-openbsd,procps,socat,wget
	install -m 0755 "$2/agnhost" "$1/agnhost"
	ln -s agnhost "$1/agnhost-2"
	mkdir -p "$1/usr/local/bin"
	ln -s /usr/bin/iperf "$1/usr/local/bin/iperf"
	mkdir -p "$1/uploads"
	install -m 0644 "$src/porter/localhost.crt" "$src/porter/localhost.key" "$1/"
	# The image-defined user and group of the SupplementalGroups tests.
	echo 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh' >>"$1/etc/passwd"
	echo 'user-defined-in-image:x:1000:' >>"$1/etc/group"
	echo 'group-defined-in-image:x:50000:user-defined-in-image' >>"$1/etc/group"
	printf '%s\n' --config.entrypoint=/agnhost --config.cmd=pause
}

rootfs_busybox() {
	oci_rootfs "$2/deb" "$out/cache" --variant=extract --include=busybox-static
	install -D -m 0755 "$2/deb/usr/bin/busybox" "$1/bin/busybox"
	local a
	for a in $("$1/bin/busybox" --list); do
		[[ $a == busybox ]] || ln -s busybox "$1/bin/$a"
	done
	mkdir -p "$1/etc" "$1/root" "$1/tmp" "$1/var" "$1/home"
	chmod 1777 "$1/tmp"
	printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/home:/bin/false' >"$1/etc/passwd"
	printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$1/etc/group"
	printf '%s\n' --config.cmd=sh
}

rootfs_nginx() {
	oci_rootfs "$1" "$out/cache" --include=nginx
	printf '%s\n' --config.cmd=nginx --config.cmd=-g '--config.cmd=daemon off;'
}

rootfs_regression-issue-74839() {
	gobuild k8s.io/kubernetes/test/images/regression-issue-74839 "$2/regression-issue-74839"
	install -D -m 0755 "$2/regression-issue-74839" "$1/regression-issue-74839"
	printf '%s\n' --config.entrypoint=/regression-issue-74839
}

rootfs_distroless-iptables() {
	oci_rootfs "$1" "$out/cache" --include=conntrack,iptables,nftables
}

rootfs_coredns() {
	local v
	v=$(cd "$here/coredns" && go list -m -f '{{.Version}}' github.com/coredns/coredns)
	[[ $v == "${names[coredns]##*:}" ]] ||
		die "test/tools/coredns requires CoreDNS $v, kubeadm deploys ${names[coredns]}: update test/tools/coredns/go.mod"
	gobuild . "$2/coredns" "$here/coredns"
	install -D -m 0755 "$2/coredns" "$1/coredns"
	printf '%s\n' --config.entrypoint=/coredns
}

# build KEY builds image KEY's archive unless it is up to date.
build() {
	local key=$1 name=${names[$1]} arc
	arc=$(archive "$key")
	if [[ $force == 0 && -f $arc ]]; then
		log "$name: $arc is up to date"
		return
	fi
	local t=$SECONDS tag=${name##*:} work="$tmp/$key" cfg
	mkdir -p "$work"
	log "building $name"
	oci_new "$work/layout" "$tag" "$work/bundle"
	"rootfs_$key" "$work/bundle/rootfs" "$work" >"$work/config"
	mapfile -t cfg <"$work/config"
	oci_commit "$work/layout" "$tag" "$work/bundle" "$name" \
		--config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--config.label="org.opencontainers.image.ref.name=$name" \
		--config.label="org.opencontainers.image.description=built by kproxy's test/tools/images.sh for upstream's e2e tests" \
		"${cfg[@]}"
	oci_pack "$work/layout" "$work/image.oci.tar"
	find "$out" -maxdepth 1 -name "$key-$tag-*.oci.tar" -delete
	mv "$work/image.oci.tar" "$arc"
	rm -rf "$work"
	log "built $arc ($(du -h "$arc" | cut -f1)) in $((SECONDS - t))s"
}

[[ $(id -u) == 0 ]] || die "building the images needs root (mmdebstrap --mode=root, file ownership in the layers)"
oci_tools
mkdir -p "$out"
tmp=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}
for key in "${keys[@]}"; do
	build "$key"
done

# The list of every image whose archive exists for the current inputs.
list=$(for key in "${!names[@]}"; do
	arc=$(archive "$key")
	[[ ! -f $arc ]] || printf '%s %s\n' "${names[$key]}" "${arc##*/}"
done | sort)
printf '%s\n' "$list" >"$out/images.txt"
