#!/usr/bin/env bash
# Prepares the kproxy test VM (internal/testutil/vm): installs qemu and kmod
# when missing, and unpacks Debian's current kernel package (the one
# linux-image-amd64 depends on) into a cache outside the clone:
#
#   $KPROXY_VM_CACHE/<release>/vmlinuz
#   $KPROXY_VM_CACHE/<release>/lib/modules/<release>/...   (with depmod's index)
#   $KPROXY_VM_CACHE/current -> <release>
#
# KPROXY_VM_CACHE defaults to /var/cache/kproxy-vm. Idempotent: when the
# release is already there nothing is fetched; a new release replaces the
# old one. The kernel name is resolved now, never pinned, because Debian
# drops old kernel ABIs from the archive. Needs root (apt-get install).
set -euo pipefail
cache="${KPROXY_VM_CACHE:-/var/cache/kproxy-vm}"
export DEBIAN_FRONTEND=noninteractive
export PATH="$PATH:/usr/sbin:/sbin"
start=$SECONDS

updated=0
apt_update() {
  if [ "$updated" = 0 ]; then
    apt-get update -qq
    updated=1
  fi
}

# qemu runs the VM; kmod brings depmod (here) and modprobe (the guest runs
# the host's modprobe for the kernel's module autoloads).
pkgs=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || pkgs+=(qemu-system-x86)
{ command -v depmod && command -v modprobe; } >/dev/null 2>&1 || pkgs+=(kmod)
if [ "${#pkgs[@]}" -gt 0 ]; then
  echo "== test VM: installing ${pkgs[*]}"
  apt_update
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi

# The kernel package linux-image-amd64 currently depends on, e.g.
# linux-image-6.1.0-57-amd64.
resolve() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}
pkg="$(resolve || true)"
if [ -z "$pkg" ]; then
  apt_update
  pkg="$(resolve || true)"
fi

use() { # use RELEASE: point current at a complete cached release
  ln -sfn "$1" "$cache/current.tmp"
  mv -T "$cache/current.tmp" "$cache/current"
  echo "== test VM: kernel $1 in $cache ($((SECONDS - start))s)"
}
complete() { [ -f "$cache/$1/vmlinuz" ] && [ -f "$cache/$1/lib/modules/$1/modules.dep" ]; }

mkdir -p "$cache"
if [ -z "$pkg" ]; then
  # No package index at all (offline?): a cached kernel still does.
  cur="$(readlink "$cache/current" 2>/dev/null || true)"
  if [ -n "$cur" ] && complete "$cur"; then
    echo "== test VM: cannot resolve linux-image-amd64; keeping cached $cur" >&2
    use "$cur"
    exit 0
  fi
  echo "test VM: cannot resolve the package linux-image-amd64 depends on" >&2
  exit 1
fi
release="${pkg#linux-image-}"
if complete "$release"; then
  use "$release"
  exit 0
fi

echo "== test VM: fetching $pkg"
work="$(mktemp -d "$cache/.prepare.XXXXXX")"
trap 'rm -rf "$work"' EXIT
download() {
  (cd "$work" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >/dev/null)
}
if ! download; then
  # A stale index names a package the archive has dropped: refresh, retry.
  apt_update
  pkg="$(resolve)"
  release="${pkg#linux-image-}"
  download
fi
dpkg-deb -x "$work"/linux-image-*.deb "$work/x"

stage="$work/$release"
mkdir -p "$stage/lib/modules"
mv "$work/x/boot/vmlinuz-$release" "$stage/vmlinuz"
if [ -d "$work/x/lib/modules/$release" ]; then
  mv "$work/x/lib/modules/$release" "$stage/lib/modules/"
else
  mv "$work/x/usr/lib/modules/$release" "$stage/lib/modules/"
fi
# Drivers a VM without such hardware never loads (a third of the size).
kd="$stage/lib/modules/$release/kernel"
rm -rf "$kd/sound" "$kd/drivers/gpu" "$kd/drivers/media" "$kd/drivers/infiniband" \
  "$kd/drivers/net/wireless" "$kd/drivers/staging"
# The package ships no module index (its postinst runs depmod).
depmod -b "$stage" "$release"
for m in sctp ip_vs dummy veth nf_tables br_netfilter 9p 9pnet_virtio virtio_pci; do
  grep -q "/$m\.ko" "$stage/lib/modules/$release/modules.dep" || {
    echo "test VM: kernel $release has no module $m" >&2
    exit 1
  }
done

rm -rf "${cache:?}/$release"
mv -T "$stage" "$cache/$release"
use "$release"
# Older releases are not needed any more.
for d in "$cache"/*; do
  [ -L "$d" ] || [ "$(basename "$d")" = "$release" ] || rm -rf "$d"
done
