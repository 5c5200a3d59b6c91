#!/usr/bin/env bash
# Builds the kube-router image without a registry (hack/kube-router/Dockerfile): the binary from
# `hack/build-tools.sh kube-router` on Debian (hack/images/debian-base.sh). Prints the image tag,
# ebbflow.local/kube-router:<version>-<hash>, also tagged ebbflow.local/kube-router:dev.
#
# The hash covers the binary, the Dockerfile, the iptables wrapper, this script and the Debian
# image, so an unchanged image is not rebuilt.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TOOLS_CACHE=${TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow/tools}
IMAGE_REPO=${IMAGE_REPO:-ebbflow.local/kube-router}
VERSION=$(awk '$1 == "require" && $2 == "github.com/cloudnativelabs/kube-router/v2" {print $3}' "$HERE/tools/go.mod")
BINARY=$TOOLS_CACHE/kube-router-$VERSION/kube-router
WRAPPER=$ROOT/hack/kind/images/iptables-wrapper

main() {
  local base hash tag
  bash "$ROOT/hack/build-tools.sh" kube-router >&2
  base=$(bash "$ROOT/hack/images/debian-base.sh" | tail -1)
  hash=$( {
    sha256sum "$BINARY" "$HERE/Dockerfile" "$HERE/build-image.sh" "$WRAPPER" | cut -d' ' -f1
    docker image inspect --format '{{.Id}}' "$base"
  } | sha256sum | cut -c1-12)
  tag=$IMAGE_REPO:$VERSION-$hash
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    echo "building $tag" >&2
    CONTEXT=$(mktemp -d)
    trap 'rm -rf "$CONTEXT"' EXIT
    cp "$HERE/Dockerfile" "$WRAPPER" "$BINARY" "$CONTEXT/"
    docker build -q --network host --build-arg "BASE=$base" -t "$tag" "$CONTEXT" >&2
  fi
  docker tag "$tag" "$IMAGE_REPO:dev"
  echo "$tag"
}

main "$@"
