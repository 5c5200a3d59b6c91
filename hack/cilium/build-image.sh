#!/usr/bin/env bash
# Builds the Cilium agent image without a registry (hack/cilium/Dockerfile): binaries from
# `hack/build-tools.sh cilium`, the BPF sources and the DaemonSet's scripts from the Cilium module in
# the Go module cache, on Debian trixie (hack/images/debian-base.sh). Prints the image tag,
# ebbflow.local/cilium:<version>-<hash>, also tagged ebbflow.local/cilium:dev.
#
# The hash covers the binaries, the Dockerfile, this script and the Debian image, so an unchanged
# agent is not rebuilt. First time on a machine: the agent's build (about ten minutes) and clang (about
# 300 MB of Debian packages).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TOOLS_CACHE=${TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow/tools}
IMAGE_REPO=${IMAGE_REPO:-ebbflow.local/cilium}
VERSION=$(awk '$1 == "require" && $2 == "github.com/cilium/cilium" {print $3}' "$HERE/tools/go.mod")
BINARIES=$TOOLS_CACHE/cilium-agent-$VERSION

# source_hash BASE: what the image is made from.
source_hash() {
  {
    sha256sum "$BINARIES"/* "$HERE/Dockerfile" "$HERE/build-image.sh" | cut -d' ' -f1
    docker image inspect --format '{{.Id}}' "$1"
  } | sha256sum | cut -c1-12
}

# assemble CONTEXT SOURCE: the files the Dockerfile copies, where upstream's image has them.
assemble() {
  local context=$1 source=$2 rootfs=$1/rootfs
  mkdir -p "$rootfs/usr/bin" "$rootfs/opt/cni/bin" "$rootfs/var/lib/cilium"
  install -m 0755 "$BINARIES"/cilium-{agent,dbg,mount,sysctlfix} "$rootfs/usr/bin/"
  ln -s cilium-dbg "$rootfs/usr/bin/cilium"
  install -m 0755 "$BINARIES/cilium-cni" "$rootfs/opt/cni/bin/cilium-cni"
  install -m 0755 "$source/plugins/cilium-cni/install-plugin.sh" "$source/plugins/cilium-cni/cni-uninstall.sh" \
    "$source/images/cilium/init-container.sh" "$rootfs/"
  # What upstream's `make install-bpf` copies: bpf/ without its tests and build files.
  (cd "$source" && find bpf -type f ! -path 'bpf/tests/*' ! -path 'bpf/complexity-tests/*' \
    ! -path 'bpf/custom/*' ! -name Makefile ! -name Makefile.bpf ! -name .gitignore -print0 |
    tar --null -T - -cf -) | tar -C "$rootfs/var/lib/cilium" -xf -
  chmod -R u+w,go+rX "$rootfs"
  cp "$HERE/Dockerfile" "$context/"
}

main() {
  local base hash tag source
  bash "$ROOT/hack/build-tools.sh" cilium >&2
  base=$(DEBIAN_SUITE=trixie bash "$ROOT/hack/images/debian-base.sh" | tail -1)
  hash=$(source_hash "$base")
  tag=$IMAGE_REPO:$VERSION-$hash
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    echo "building $tag" >&2
    source=$(bash "$ROOT/hack/build-tools.sh" cilium-source)
    CONTEXT=$(mktemp -d)
    trap 'rm -rf "$CONTEXT"' EXIT
    assemble "$CONTEXT" "$source"
    docker build -q --build-arg "BASE=$base" -t "$tag" "$CONTEXT" >&2
  fi
  docker tag "$tag" "$IMAGE_REPO:dev"
  echo "$tag"
}

main "$@"
