#!/usr/bin/env bash
# Builds Kubeflow's training-operator image without a registry (hack/kubeflow/Dockerfile): the manager
# from `hack/build-tools.sh training-operator` (static, from the Go module proxy) on the Debian root
# image (hack/images/debian-base.sh). Prints the image tag, ebbflow.local/training-operator:<version>-<hash>,
# also tagged ebbflow.local/training-operator:dev; progress goes to stderr.
#
# The hash covers the binary, the Dockerfile, this script and the Debian image, so an unchanged image
# is not rebuilt.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TOOLS_CACHE=${TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow/tools}
IMAGE_REPO=${IMAGE_REPO:-ebbflow.local/training-operator}
VERSION=$(awk '$1 == "require" && $2 == "github.com/kubeflow/training-operator" {print $3}' "$HERE/tools/go.mod")
BINARY=$TOOLS_CACHE/training-operator-$VERSION/training-operator

main() {
  local base hash tag
  bash "$ROOT/hack/build-tools.sh" training-operator >&2
  base=$(bash "$ROOT/hack/images/debian-base.sh" | tail -1)
  hash=$({
    sha256sum "$BINARY" "$HERE/Dockerfile" "$HERE/build-image.sh" | cut -d' ' -f1
    docker image inspect --format '{{.Id}}' "$base"
  } | sha256sum | cut -c1-12)
  tag=$IMAGE_REPO:$VERSION-$hash
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    echo "building $tag" >&2
    CONTEXT=$(mktemp -d)
    trap 'rm -rf "$CONTEXT"' EXIT
    install -m 0755 "$BINARY" "$CONTEXT/training-operator"
    cp "$HERE/Dockerfile" "$CONTEXT/"
    docker build -q --build-arg "BASE=$base" -t "$tag" "$CONTEXT" >&2
  fi
  docker tag "$tag" "$IMAGE_REPO:dev"
  echo "$tag"
}

main "$@"
