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
# filesystem, umoci commits it as a single-layer OCI image. Needs root;
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
suite=bookworm

log() { printf 'hack/image.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

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
		git ls-files -z -co --exclude-standard -- go.mod go.sum cmd internal "$pkgfile" hack/image.sh ':!:*_test.go' |
			while IFS= read -r -d '' f; do [[ -f $f ]] && printf '%s\0' "$f"; done
	else
		find go.mod go.sum cmd internal "$pkgfile" hack/image.sh -type f ! -name '*_test.go' -print0
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

# Tools, installed only when missing.
missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v umoci >/dev/null || missing+=(umoci)
command -v jq >/dev/null || missing+=(jq)
if ((${#missing[@]})); then
	command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
		{ apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; } ||
		die "could not install ${missing[*]}"
fi
gobin=$(command -v go || true)
[[ -n $gobin ]] || gobin=/usr/local/go/bin/go
[[ -x $gobin ]] || die "no Go toolchain (go in PATH or /usr/local/go/bin/go)"

mapfile -t pkgs < <(packages)
((${#pkgs[@]})) || die "$pkgfile lists no package"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $revision != unknown ]] && [[ -n $(git status --porcelain -- go.mod go.sum cmd internal "$pkgfile" hack/image.sh) ]]; then
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
umoci init --layout "$work/layout"
umoci new --image "$work/layout:$version"
umoci unpack --image "$work/layout:$version" "$work/bundle" >/dev/null

mirror=${KPROXY_IMAGE_MIRROR:-"deb http://deb.debian.org/debian $suite main
deb http://deb.debian.org/debian $suite-updates main
deb http://deb.debian.org/debian-security $suite-security main"}

log "root filesystem: Debian $suite minbase + ${pkgs[*]}"
# The .deb files are kept in _output/image/cache between builds (synced in
# before, out after apt ran) and removed from the image itself.
cache=$root/$out/cache
# merged-usr: /bin, /lib, /sbin as symlinks into /usr, as debootstrap (and
# so bookworm-slim) makes them; without the hook mmdebstrap installs
# usrmerge, which pulls in perl (~50 MB).
mmdebstrap --quiet --mode=root --variant=minbase --format=directory \
	--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
	--include="$(IFS=,; echo "${pkgs[*]}")" \
	--aptopt='APT::Install-Recommends "false"' \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--dpkgopt='path-exclude=/usr/share/lintian/*' \
	--skip=download/empty \
	--setup-hook="mkdir -p \"\$1\"/var/cache/apt/archives && cp -a '$cache'/. \"\$1\"/var/cache/apt/archives/" \
	--customize-hook="find \"\$1\"/var/cache/apt/archives -maxdepth 1 -name '*.deb' -exec cp -a -t '$cache' {} +" \
	--customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/* "$1"/var/log/*.log "$1"/var/log/apt/*' \
	"$suite" "$work/bundle/rootfs" "$mirror" >"$work/mmdebstrap.log" 2>&1 ||
	{ cat "$work/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
install -D -m 0755 "$work/kproxy" "$work/bundle/rootfs/usr/local/bin/kproxy"
log "  root filesystem: $((SECONDS - t))s, $(du -sh "$work/bundle/rootfs" | cut -f1) unpacked"

t=$SECONDS
umoci repack --image "$work/layout:$version" "$work/bundle"
umoci config --image "$work/layout:$version" \
	--os linux --architecture "$("$gobin" env GOARCH)" --created "$created" \
	--author kproxy \
	--config.entrypoint /usr/local/bin/kproxy \
	--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	--config.label org.opencontainers.image.title=kproxy \
	--config.label "org.opencontainers.image.description=A Kubernetes service proxy: a drop-in replacement for kube-proxy (nftables, iptables and ipvs modes)" \
	--config.label "org.opencontainers.image.version=$version" \
	--config.label "org.opencontainers.image.revision=$revision" \
	--config.label "org.opencontainers.image.created=$created" \
	--config.label "org.opencontainers.image.ref.name=$image:$version" \
	--config.label "org.opencontainers.image.base.name=debian:$suite (mmdebstrap minbase)"
umoci gc --layout "$work/layout"
# umoci names the manifest by its tag alone; give the index entry the full
# name in both annotations (see the top of this file).
jq --arg name "$image:$version" '.manifests |= map(.annotations += {"org.opencontainers.image.ref.name": $name, "io.containerd.image.name": $name})' \
	"$work/layout/index.json" >"$work/index.json"
mv "$work/index.json" "$work/layout/index.json"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
	-C "$work/layout" -cf "$work/image.oci.tar" .
log "  OCI image: $((SECONDS - t))s"

# Replace the archives of older source states by this one.
find "$out" -maxdepth 1 -name 'kproxy-*.oci.tar' -delete
mv "$work/image.oci.tar" "$archive"
log "built $archive: image $image:$version, $(du -h "$archive" | cut -f1), in $((SECONDS - start))s"
printf '%s\n' "$root/$archive"
