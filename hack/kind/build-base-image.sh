#!/usr/bin/env bash
# Builds the kind *base* image (systemd + containerd + runc + networking tools) without a registry.
#
# kind's own base image (kindest/base) is pulled from a registry and builds containerd/runc from git;
# neither is reachable here. This mirrors kind v0.32.0's images/base/Dockerfile on top of the
# debootstrapped Debian image (hack/images/debian-base.sh), with containerd and runc from Debian
# packages, and kind's entrypoint/systemd/config files copied from the kind module in the Go module
# cache (so they always match the kind binary we run). Differences from upstream are listed in
# hack/kind/README.md.
#
# Prints the image tag. Cached: the tag carries a hash of every input (this script, the files under
# hack/kind/base/, kind's files, the Debian image id); an existing tag is reused.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIND_VERSION=${KIND_VERSION:-v0.32.0}
BASE_REPO=${KIND_BASE_REPO:-ebbflow/kind-base}
LOG_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow/logs

bash "$ROOT/hack/images/docker-daemon.sh" >&2
DEBIAN_IMAGE=$(bash "$ROOT/hack/images/debian-base.sh")

KIND_SRC=$(go env GOMODCACHE)/sigs.k8s.io/kind@$KIND_VERSION/images/base
if [[ ! -d $KIND_SRC ]]; then
  (cd /tmp && go mod download "sigs.k8s.io/kind@$KIND_VERSION") >&2 ||
    { echo "kind $KIND_VERSION sources not in the Go module cache and not downloadable" >&2; exit 1; }
fi

HASH=$( {
  sha256sum <"$0"
  find "$ROOT/hack/kind/base" "$KIND_SRC/files" -type f -print0 | sort -z | xargs -0 sha256sum | cut -c1-64
  docker image inspect -f '{{.Id}}' "$DEBIAN_IMAGE"
} | sha256sum | cut -c1-12)
IMAGE=$BASE_REPO:$KIND_VERSION-$HASH

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "$IMAGE"
  exit 0
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r "$KIND_SRC/files" "$WORK/files"
chmod -R u+w "$WORK/files" # the module cache is read-only
cp -r "$ROOT/hack/kind/base/." "$WORK/overlay/"

cat >"$WORK/Dockerfile" <<EOF
FROM $DEBIAN_IMAGE
COPY files/usr/local/bin/ /usr/local/bin/
RUN chmod 0755 /usr/local/bin/* \\
    && echo "Installing Packages ..." \\
    && DEBIAN_FRONTEND=noninteractive clean-install \\
      systemd \\
      conntrack iptables nftables iproute2 ethtool util-linux mount kmod \\
      libseccomp2 pigz fuse-overlayfs \\
      nfs-common open-iscsi \\
      e2fsprogs \\
      bash ca-certificates curl jq procps \\
      containerd runc socat \\
    && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \\
    && rm -f /lib/systemd/system/multi-user.target.wants/* \\
    && rm -f /etc/systemd/system/*.wants/* \\
    && rm -f /lib/systemd/system/local-fs.target.wants/* \\
    && rm -f /lib/systemd/system/sockets.target.wants/*udev* \\
    && rm -f /lib/systemd/system/sockets.target.wants/*initctl* \\
    && rm -f /lib/systemd/system/basic.target.wants/* \\
    && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \\
    && ln -sf /usr/lib/systemd/systemd /sbin/init
# kind's files after the packages: Debian's containerd would otherwise stop on its own config.toml.
COPY files/kind/ /kind/
COPY files/LICENSES/ /LICENSES/
COPY files/etc/ /etc/
RUN chmod 0755 /usr/local/bin/* /kind /kind/bin /kind/bin/*
# kind's files after the packages: Debian's containerd would otherwise stop on its own config.toml.
COPY files/kind/ /kind/
COPY files/LICENSES/ /LICENSES/
COPY files/etc/ /etc/
RUN chmod 0755 /kind /kind/bin /kind/bin/*
# Debian installs containerd and its shim in /usr/bin; kind's unit files expect /usr/local/bin.
RUN ln -sf /usr/bin/containerd /usr/local/bin/containerd \\
    && ln -sf /usr/bin/ctr /usr/local/bin/ctr \\
    && ln -sf /usr/bin/containerd-shim-runc-v2 /usr/local/bin/containerd-shim-runc-v2 \\
    && ln -sf /usr/sbin/runc /usr/local/sbin/runc \\
    && ctr oci spec \\
       | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \\
       | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \\
    && containerd --version && runc --version
# Our overrides (containerd config etc.), hack/kind/base/.
COPY overlay/ /
RUN echo "Enabling / Disabling services ... " \\
    && systemctl enable kubelet.service \\
    && systemctl enable containerd.service \\
    && systemctl enable undo-mount-hacks.service \\
    && systemctl mask systemd-binfmt.service \\
    && mkdir -p /etc/kubernetes/manifests /opt/cni/bin
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT [ "/usr/local/bin/ebbflow-entrypoint", "/sbin/init" ]
EOF

echo "building $IMAGE from $DEBIAN_IMAGE (Debian packages: a few minutes)" >&2
if ! docker build --network host -t "$IMAGE" "$WORK" >"$WORK/build.log" 2>&1; then
  mkdir -p "$LOG_DIR" && cp "$WORK/build.log" "$LOG_DIR/kind-base-build.log"
  tail -40 "$WORK/build.log" >&2
  echo "base image build failed (full log: $LOG_DIR/kind-base-build.log)" >&2
  exit 1
fi
docker tag "$IMAGE" "$BASE_REPO:latest"
echo "$IMAGE"
