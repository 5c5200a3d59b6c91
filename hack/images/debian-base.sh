#!/usr/bin/env bash
# Builds the Debian root image every project image starts from, without a registry:
# debootstrap (minbase) from the Debian mirror apt is configured with, imported as
# $DEBIAN_IMAGE. Cached: skipped when that image exists (the tag carries this script's hash,
# so a change here rebuilds it).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SUITE=${DEBIAN_SUITE:-bookworm}
HASH=$(sha256sum "$0" | cut -c1-12)
DEBIAN_IMAGE=${DEBIAN_IMAGE:-ebbflow/debian:$SUITE-$HASH}

bash "$ROOT/hack/images/docker-daemon.sh"
if docker image inspect "$DEBIAN_IMAGE" >/dev/null 2>&1; then
  echo "$DEBIAN_IMAGE"
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
# The mirror apt already uses (no other host is reachable).
MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
  grep -E '^(URIs:|deb )' | grep -oE 'https?://[^ ]+/debian/?' | grep -v security | sed -n 1p || true)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "debootstrap $SUITE from $MIRROR (about a minute)" >&2
debootstrap --variant=minbase "$SUITE" "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
  { tail -30 "$WORK/debootstrap.log" >&2; exit 1; }
# Keep apt pointed at the same mirror inside, and the image small.
echo "deb $MIRROR $SUITE main" >"$WORK/rootfs/etc/apt/sources.list"
rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb "$WORK/rootfs/var/lib/apt/lists/"*
tar -C "$WORK/rootfs" -c . | docker import - "$DEBIAN_IMAGE" >/dev/null
docker tag "$DEBIAN_IMAGE" "ebbflow/debian:$SUITE"
echo "$DEBIAN_IMAGE"
