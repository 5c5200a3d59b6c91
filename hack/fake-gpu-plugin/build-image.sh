#!/usr/bin/env bash
# Builds the fake GPU device plugin image without a registry: a static Go binary, tarred as
# the image's only file and loaded with `docker import` (FROM scratch in effect). Prints the
# image tag, ebbflow/fake-gpu-plugin:<hash>, also tagged :latest.
#
# The hash covers the module's non-test sources, go.mod/go.sum, this script and the Go
# version, so an unchanged plugin is neither rebuilt nor re-imported. The binary is cached per
# machine in $EBBFLOW_CACHE/fake-gpu-plugin/<hash>/. BUILD_JOBS (default 1) is `go build -p`.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
EBBFLOW_CACHE=${EBBFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
IMAGE_REPO=${IMAGE_REPO:-ebbflow/fake-gpu-plugin}

# source_hash: what the binary and image are made from.
source_hash() {
  {
    (cd "$HERE" && find . -type f \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum \) |
      LC_ALL=C sort | xargs sha256sum)
    sha256sum "$HERE/build-image.sh" | cut -d' ' -f1
    "$GO" version
  } | sha256sum | cut -c1-12
}

# build_binary DEST: a static, reproducible binary (no cgo, no local paths, no VCS stamp). Its
# go.mod pins the Kubernetes graph's versions (hack/tools/kubernetes; a unit test keeps them equal)
# and it is built with the same flags and tags, so on a machine that just built the tools its
# client-go and gRPC packages are build-cache hits.
build_binary() {
  local dest=$1 tmp
  tmp=$(mktemp "$dest.XXXXXX")
  (cd "$HERE" && CGO_ENABLED=0 GOOS=linux GOFLAGS="-buildvcs=false -gcflags=all=-dwarf=false" \
    nice -n 10 "$GO" build -p "${BUILD_JOBS:-1}" -trimpath -tags selinux,notest -ldflags='-s -w' -o "$tmp" .)
  mv -f "$tmp" "$dest"
}

# import_image BINARY TAG: a one-file root filesystem; runs as root (see README: the kubelet's
# device-plugins directory is root-owned), capabilities are dropped in deploy.yaml.
import_image() {
  local binary=$1 tag=$2 rootfs=$WORK/rootfs
  mkdir -p "$rootfs"
  install -m 0755 "$binary" "$rootfs/fake-gpu-plugin"
  tar -C "$rootfs" --owner=0 --group=0 --numeric-owner --mtime=@0 -c fake-gpu-plugin |
    docker import \
      --change 'ENTRYPOINT ["/fake-gpu-plugin"]' \
      --change 'USER 0:0' \
      --change 'LABEL org.opencontainers.image.title=ebbflow-fake-gpu-plugin' \
      - "$tag" >/dev/null
}

main() {
  local hash tag binary
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  hash=$(source_hash)
  tag=$IMAGE_REPO:$hash
  bash "$ROOT/hack/images/docker-daemon.sh" >&2
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    binary=$EBBFLOW_CACHE/fake-gpu-plugin/$hash/fake-gpu-plugin
    if [[ ! -x $binary ]]; then
      echo "building fake-gpu-plugin $hash" >&2
      mkdir -p "$(dirname "$binary")"
      build_binary "$binary"
    fi
    import_image "$binary" "$tag"
  fi
  docker tag "$tag" "$IMAGE_REPO:latest"
  echo "$tag"
}

main "$@"
