#!/usr/bin/env bash
# Builds the Prometheus Operator's two images without a registry, from the static binaries of
# `hack/build-tools.sh prometheus-operator` (v0.85.0, see hack/prometheus-operator/tools/go.mod):
#   ebbflow/prometheus-operator:<hash>         /bin/operator
#   ebbflow/prometheus-config-reloader:<hash>  /bin/prometheus-config-reloader (the sidecar and init
#                                              container the operator adds to every Prometheus pod)
# each the binary alone, tarred and loaded with `docker import` (FROM scratch in effect), user 65534.
# Prints the two tags, operator first, then the directory of the operator's CRDs, one per line.
# `<hash>` covers the binary and this script, so an unchanged binary is not imported again.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TOOLS_CACHE=${TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow/tools}
VERSION=$(awk '$1 == "require" && $2 == "github.com/prometheus-operator/prometheus-operator" {print $3}' "$HERE/tools/go.mod")
BUILT=$TOOLS_CACHE/prometheus-operator-$VERSION

bash "$ROOT/hack/build-tools.sh" prometheus-operator >&2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# image REPOSITORY BINARY PATH_IN_IMAGE: the tag of an image holding BINARY at PATH_IN_IMAGE.
image() {
  local repository=$1 binary=$2 path=$3 tag rootfs
  tag=$repository:$({ sha256sum "$binary" "$HERE/build-image.sh" | cut -d' ' -f1; } | sha256sum | cut -c1-12)
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    rootfs=$WORK/$(basename "$repository")
    mkdir -p "$rootfs/bin"
    install -m 0755 "$binary" "$rootfs$path"
    tar -C "$rootfs" --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -cf "$rootfs.tar" bin
    docker import --change "ENTRYPOINT [\"$path\"]" --change 'USER 65534:65534' "$rootfs.tar" "$tag" >&2
  fi
  echo "$tag"
}

image ebbflow/prometheus-operator "$BUILT/prometheus-operator" /bin/operator
image ebbflow/prometheus-config-reloader "$BUILT/prometheus-config-reloader" /bin/prometheus-config-reloader
echo "$BUILT/crds"
