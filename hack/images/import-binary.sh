#!/usr/bin/env bash
# Imports one static binary of .tools/bin as an image without a registry: the binary alone at
# PATH_IN_IMAGE, tarred and loaded with `docker import` (FROM scratch in effect), run as user 65534.
#   bash hack/images/import-binary.sh BINARY PATH_IN_IMAGE REPOSITORY [FILE...]
# Prints REPOSITORY:<hash>; `<hash>` covers the binary, this script and each FILE (the caller's
# script, say), so an unchanged binary is not imported again. The binary must be built already.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
binary=$ROOT/.tools/bin/$1 inside=${2#/} repository=$3
shift 3
tag=$repository:$({ sha256sum "$binary" "$ROOT/hack/images/import-binary.sh" "$@" | cut -d' ' -f1; } | sha256sum | cut -c1-12)
if ! docker image inspect "$tag" >/dev/null 2>&1; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/rootfs/$(dirname "$inside")"
  install -m 0755 "$binary" "$work/rootfs/$inside"
  tar -C "$work/rootfs" --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -cf "$work/image.tar" "$inside"
  docker import --change "ENTRYPOINT [\"/$inside\"]" --change 'USER 65534:65534' "$work/image.tar" "$tag" >&2
fi
echo "$tag"
