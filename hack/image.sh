#!/usr/bin/env bash
# Builds kproxy's container image without docker, podman or a registry and
# writes it as an OCI archive (a tar of an OCI image layout):
#
#   _output/image/kproxy-VERSION-SOURCE.oci.tar   image localhost/kproxy:VERSION
#
# VERSION is what cmd/kproxy/main.go reports (also the image's tag and its
# org.opencontainers.image.version label), SOURCE a hash of everything that
# goes into the image (go.mod, go.sum, cmd/, internal/ without tests, the
# package list and this script): when the archive of the current source
# state exists, nothing is done. Older archives are removed.
#
# The image is the Dockerfile's: a static kproxy (CGO_ENABLED=0) in
# /usr/local/bin on a Debian bookworm minbase root filesystem (what
# bookworm-slim is made of: no docs, man pages or locales) with the
# packages of deploy/image-packages.txt. mmdebstrap makes the root
# filesystem, umoci commits it as a single-layer OCI image (functions of
# hack/lib/oci.sh, shared with test/tools/images.sh). Needs root;
# installs mmdebstrap, umoci and jq with apt-get when they are missing.
#
# The index names the image localhost/kproxy:VERSION twice, in the two
# annotations importers read: io.containerd.image.name (containerd's
# importer, used by `ctr images import`, takes it as the full name before
# anything else; podman's libimage reads it first too) and
# org.opencontainers.image.ref.name (containers/image, skopeo, older
# podman). So each of these stores it under the name deploy/kproxy.yaml
# uses, without a tag or --base-name:
#   ctr -n k8s.io images import _output/image/kproxy-....oci.tar
#   podman load -i _output/image/kproxy-....oci.tar
#   skopeo copy oci-archive:_output/image/kproxy-....oci.tar containers-storage:localhost/kproxy:VERSION
# (on RKE2: /var/lib/rancher/rke2/bin/ctr --address /run/k3s/containerd/containerd.sock
# -n k8s.io images import ..., see docs/rke2.md).
#
# Options:
#   --print-archive  print the archive path of the current source state, build nothing
#   --packages       print the package list as this script reads it
# Environment:
#   KPROXY_IMAGE_MIRROR  apt sources for mmdebstrap, one per line
#                        (default: deb.debian.org bookworm, -updates, -security)
set -euo pipefail

start=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=_output/image
pkgfile=deploy/image-packages.txt
image=localhost/kproxy

log() { printf 'hack/image.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=lib/oci.sh
source hack/lib/oci.sh

# packages prints the package list: comments and blank lines dropped (the
# Dockerfile reads the file with the same sed expression).
packages() { sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$pkgfile" | tr -d '[:blank:]'; }

# version is main.version's default in cmd/kproxy/main.go.
version() {
	local v
	v=$(sed -n 's/^var version = "\(.*\)"$/\1/p' cmd/kproxy/main.go)
	[[ -n $v ]] || die "no 'var version = \"...\"' in cmd/kproxy/main.go"
	printf '%s\n' "$v"
}

# inputs lists (NUL-separated) the files that go into the image.
inputs() {
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		git ls-files -z -co --exclude-standard -- go.mod go.sum cmd internal "$pkgfile" hack/image.sh hack/lib/oci.sh ':!:*_test.go' |
			while IFS= read -r -d '' f; do [[ -f $f ]] && printf '%s\0' "$f"; done
	else
		find go.mod go.sum cmd internal "$pkgfile" hack/image.sh hack/lib/oci.sh -type f ! -name '*_test.go' -print0
	fi
}

source_id() {
	inputs | LC_ALL=C sort -z | xargs -0 -r sha256sum -- | sha256sum | cut -c1-12
}

version=$(version)
archive=$out/kproxy-$version-$(source_id).oci.tar

case "${1:-}" in
--print-archive) printf '%s\n' "$root/$archive"; exit 0 ;;
--packages) packages; exit 0 ;;
"") ;;
*) die "unknown argument $1 (see the comment at the top of hack/image.sh)" ;;
esac

if [[ -f $archive ]]; then
	log "$archive is up to date ($(du -h "$archive" | cut -f1)), nothing to do"
	printf '%s\n' "$root/$archive"
	exit 0
fi

[[ $(id -u) == 0 ]] || die "building the image needs root (mmdebstrap --mode=root, file ownership in the layer)"

oci_tools
gobin=$(command -v go || true)
[[ -n $gobin ]] || gobin=/usr/local/go/bin/go
[[ -x $gobin ]] || die "no Go toolchain (go in PATH or /usr/local/go/bin/go)"

mapfile -t pkgs < <(packages)
((${#pkgs[@]})) || die "$pkgfile lists no package"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $revision != unknown ]] && [[ -n $(git status --porcelain -- go.mod go.sum cmd internal "$pkgfile" hack/image.sh hack/lib/oci.sh) ]]; then
	revision+=-dirty
fi
# Timestamps of the image and its files: the commit's time, so that a
# rebuild of the same commit differs as little as possible.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

mkdir -p "$out/cache"
work=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

log "building kproxy $version (CGO_ENABLED=0)"
t=$SECONDS
CGO_ENABLED=0 "$gobin" build -trimpath -ldflags "-s -w -X main.version=$version" -o "$work/kproxy" ./cmd/kproxy
log "  binary: $((SECONDS - t))s"

t=$SECONDS
oci_new "$work/layout" "$version" "$work/bundle"
log "root filesystem: Debian $oci_suite minbase + ${pkgs[*]}"
# The .deb files are kept in _output/image/cache between builds.
oci_rootfs "$work/bundle/rootfs" "$root/$out/cache" \
	--include="$(IFS=,; echo "${pkgs[*]}")"
install -D -m 0755 "$work/kproxy" "$work/bundle/rootfs/usr/local/bin/kproxy"
log "  root filesystem: $((SECONDS - t))s, $(du -sh "$work/bundle/rootfs" | cut -f1) unpacked"

t=$SECONDS
oci_goarch=$("$gobin" env GOARCH)
oci_commit "$work/layout" "$version" "$work/bundle" "$image:$version" \
	--author kproxy \
	--config.entrypoint /usr/local/bin/kproxy \
	--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	--config.label org.opencontainers.image.title=kproxy \
	--config.label "org.opencontainers.image.description=A Kubernetes service proxy: a drop-in replacement for kube-proxy (nftables, iptables and ipvs modes)" \
	--config.label "org.opencontainers.image.version=$version" \
	--config.label "org.opencontainers.image.revision=$revision" \
	--config.label "org.opencontainers.image.created=$created" \
	--config.label "org.opencontainers.image.ref.name=$image:$version" \
	--config.label "org.opencontainers.image.base.name=debian:$oci_suite (mmdebstrap minbase)"
oci_pack "$work/layout" "$work/image.oci.tar"
log "  OCI image: $((SECONDS - t))s"

# Replace the archives of older source states by this one.
find "$out" -maxdepth 1 -name 'kproxy-*.oci.tar' -delete
mv "$work/image.oci.tar" "$archive"
log "built $archive: image $image:$version, $(du -h "$archive" | cut -f1), in $((SECONDS - start))s"
printf '%s\n' "$root/$archive"
