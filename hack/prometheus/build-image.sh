#!/usr/bin/env bash
# Builds the Prometheus image without a registry: the static prometheus binary from
# `hack/build-tools.sh prometheus` (Prometheus 3.16.0, see hack/prometheus/tools/go.mod) and a default
# configuration, tarred as the image's only files and loaded with `docker import` (FROM scratch in
# effect). Prints the image tag, ebbflow/prometheus:<hash>, also tagged :dev.
#
# The hash covers the binary itself, the default configuration and this script, so an unchanged
# Prometheus is not re-imported. The binary is built once per machine (several minutes) into
# ~/.cache/ebbflow/tools/prometheus-<version>/ and copied from there (see hack/build-tools.sh).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export TOOLS_BIN=${TOOLS_BIN:-$ROOT/.tools/bin}
IMAGE_REPO=${IMAGE_REPO:-ebbflow/prometheus}
# The image's user: nobody, as in the upstream image; owns /prometheus (the TSDB).
UID_GID=65534

# source_hash: what the image is made from.
source_hash() {
  {
    sha256sum "$TOOLS_BIN/prometheus" "$HERE/default.yml" "$HERE/build-image.sh" | cut -d' ' -f1
  } | sha256sum | cut -c1-12
}

# import_image TAG: /bin/prometheus, /etc/prometheus/prometheus.yml (root's, read-only to the user) and
# an empty /prometheus owned by the user; no shell, no libc, no CA bundle (in-cluster service discovery
# uses the ServiceAccount's CA).
import_image() {
  local tag=$1 rootfs=$WORK/rootfs tarball=$WORK/rootfs.tar
  mkdir -p "$rootfs/bin" "$rootfs/etc/prometheus" "$rootfs/prometheus"
  install -m 0755 "$TOOLS_BIN/prometheus" "$rootfs/bin/prometheus"
  install -m 0644 "$HERE/default.yml" "$rootfs/etc/prometheus/prometheus.yml"
  local tar_opts=(-C "$rootfs" --numeric-owner --mtime=@0 --sort=name --no-recursion)
  tar "${tar_opts[@]}" --owner=0 --group=0 -cf "$tarball" bin bin/prometheus etc etc/prometheus \
    etc/prometheus/prometheus.yml
  tar "${tar_opts[@]}" --owner="$UID_GID" --group="$UID_GID" -rf "$tarball" prometheus
  docker import \
    --change 'ENTRYPOINT ["/bin/prometheus"]' \
    --change 'CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]' \
    --change "USER $UID_GID:$UID_GID" \
    --change 'WORKDIR /prometheus' \
    --change 'EXPOSE 9090' \
    --change 'LABEL org.opencontainers.image.title=ebbflow-prometheus' \
    --change "LABEL org.opencontainers.image.version=$("$TOOLS_BIN/prometheus" --version | awk 'NR == 1 {print $3}')" \
    "$tarball" "$tag" >/dev/null
}

main() {
  local hash tag
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  bash "$ROOT/hack/build-tools.sh" prometheus >&2
  hash=$(source_hash)
  tag=$IMAGE_REPO:$hash
  bash "$ROOT/hack/images/docker-daemon.sh" >&2
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    echo "importing $tag" >&2
    import_image "$tag"
  fi
  docker tag "$tag" "$IMAGE_REPO:dev"
  echo "$tag"
}

main "$@"
