#!/usr/bin/env bash
# Builds Kueue's manager image without a registry, from the binary of `hack/build-tools.sh kueue`
# (the pinned sigs.k8s.io/kueue, see hack/tools/kueue/go.mod):
#   ebbflow/kueue:<hash>  /manager (where Kueue's release Deployment runs it)
# the binary alone, tarred and loaded with `docker import` (FROM scratch in effect), user 65534.
# Prints the tag, then the directory of the module's config/ tree (its kustomization), one per line.
# `<hash>` covers the binary and this script, so an unchanged binary is not imported again.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TOOLS_BIN=$ROOT/.tools/bin

bash "$ROOT/hack/build-tools.sh" kueue >&2
tag=ebbflow/kueue:$({ sha256sum "$TOOLS_BIN/kueue" "$HERE/build-image.sh" | cut -d' ' -f1; } | sha256sum | cut -c1-12)
if ! docker image inspect "$tag" >/dev/null 2>&1; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/rootfs"
  install -m 0755 "$TOOLS_BIN/kueue" "$work/rootfs/manager"
  tar -C "$work/rootfs" --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -cf "$work/kueue.tar" manager
  docker import --change 'ENTRYPOINT ["/manager"]' --change 'USER 65534:65534' "$work/kueue.tar" "$tag" >&2
fi
echo "$tag"
echo "$ROOT/.tools/kueue/config"
