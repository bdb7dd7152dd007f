#!/usr/bin/env bash
# tools/docker-base.sh [IMAGE] - makes a Debian 12 base image for
# docker/Dockerfile where no image registry is reachable: debootstrap's
# minimal variant of bookworm from the Debian mirror this machine uses,
# imported as IMAGE (default kinfer/debian:12). Does nothing when IMAGE
# exists. Needs root (debootstrap), a running Docker engine and the
# Debian mirror.
set -euo pipefail
image=${1:-kinfer/debian:12}
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "docker-base: $image exists"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "docker-base: debootstrap missing (apt-get install debootstrap)" >&2; exit 1; }
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d /tmp/kinfer-rootfs-XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "docker-base: debootstrap --variant=minbase bookworm from $mirror (a few minutes)"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# As Debian's own images: security updates listed, no package caches kept.
cat >"$root/etc/apt/sources.list" <<SRC
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main
SRC
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
echo "docker-base: $image made"
