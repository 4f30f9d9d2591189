# shellcheck shell=bash
# Functions shared by the scripts that build OCI image archives without
# docker, podman or a registry: hack/image.sh (kproxy's image) and
# test/tools/images.sh (the images upstream's e2e tests run). Source it
# after defining log and die.
#
# An image is a root filesystem (mmdebstrap from Debian's packages, or
# files of the caller's) that umoci commits as one layer of an OCI image
# layout; the layout's index names the image in the annotations importers
# read, and the layout is packed into a tar (an "OCI archive") that
#   ctr -n k8s.io images import ARCHIVE
#   podman load -i ARCHIVE
# store under that name, with no tag or --base-name.

# oci_suite is the Debian release the root filesystems are made of.
oci_suite=bookworm

# oci_tools installs mmdebstrap, umoci and jq with apt-get when missing.
oci_tools() {
	local missing=()
	command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
	command -v umoci >/dev/null || missing+=(umoci)
	command -v jq >/dev/null || missing+=(jq)
	((${#missing[@]})) || return 0
	command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
	log "installing ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
		{ apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; } ||
		die "could not install ${missing[*]}"
}

# oci_mirror prints the apt sources mmdebstrap reads: KPROXY_IMAGE_MIRROR
# (one per line) or deb.debian.org's release, -updates and -security.
oci_mirror() {
	printf '%s\n' "${KPROXY_IMAGE_MIRROR:-"deb http://deb.debian.org/debian $oci_suite main
deb http://deb.debian.org/debian $oci_suite-updates main
deb http://deb.debian.org/debian-security $oci_suite-security main"}"
}

# oci_rootfs ROOTFS CACHE [MMDEBSTRAP-ARGS...] makes a Debian minbase root
# filesystem in ROOTFS (what bookworm-slim is made of: no docs, man pages or
# locales, no recommended packages); MMDEBSTRAP-ARGS add to it (--include=,
# --variant=, hooks). The .deb files are kept in CACHE between builds
# (synced in before, out after apt ran) and removed from the root
# filesystem. mmdebstrap's output is shown when it fails.
oci_rootfs() {
	local rootfs=$1 cache=$2 logf
	shift 2
	mkdir -p "$cache"
	logf=$(mktemp)
	# merged-usr: /bin, /lib, /sbin as symlinks into /usr, as debootstrap (and
	# so bookworm-slim) makes them; without the hook mmdebstrap installs
	# usrmerge, which pulls in perl (~50 MB).
	mmdebstrap --quiet --mode=root --variant=minbase --format=directory \
		--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
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
		"$@" \
		"$oci_suite" "$rootfs" "$(oci_mirror)" >"$logf" 2>&1 ||
		{ cat "$logf" >&2; rm -f "$logf"; die "mmdebstrap failed"; }
	rm -f "$logf"
}

# oci_new LAYOUT TAG BUNDLE starts an image: an empty layout with image TAG
# unpacked into BUNDLE, whose rootfs/ the caller fills.
oci_new() {
	umoci init --layout "$1"
	umoci new --image "$1:$2"
	umoci unpack --image "$1:$2" "$3" >/dev/null
}

# oci_commit LAYOUT TAG BUNDLE NAME [UMOCI-CONFIG-ARGS...] commits BUNDLE's
# rootfs as the image's layer, sets its configuration (os; architecture
# oci_goarch, by default go env GOARCH; creation time SOURCE_DATE_EPOCH;
# then UMOCI-CONFIG-ARGS), and names
# the index entry NAME (repository:tag) in both annotations importers read:
# io.containerd.image.name (containerd's importer, used by `ctr images
# import`, takes it as the full name before anything else; podman's
# libimage reads it first too) and org.opencontainers.image.ref.name
# (containers/image, skopeo, older podman). umoci alone names the manifest
# by its tag.
oci_commit() {
	local layout=$1 tag=$2 bundle=$3 name=$4
	shift 4
	umoci repack --image "$layout:$tag" "$bundle"
	umoci config --image "$layout:$tag" \
		--os linux --architecture "${oci_goarch:-$(go env GOARCH)}" \
		--created "$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)" "$@"
	umoci gc --layout "$layout"
	jq --arg name "$name" '.manifests |= map(.annotations += {"org.opencontainers.image.ref.name": $name, "io.containerd.image.name": $name})' \
		"$layout/index.json" >"$layout/index.json.new"
	mv "$layout/index.json.new" "$layout/index.json"
}

# oci_pack LAYOUT ARCHIVE writes the layout as a tar, its files in name
# order, owned by root and dated SOURCE_DATE_EPOCH.
oci_pack() {
	tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
		-C "$1" -cf "$2" .
}
