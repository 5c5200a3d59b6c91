#!/usr/bin/env bash
# Builds the kind *node* image (base image + Kubernetes v1.36.3 + preloaded component images)
# without a registry.
#
# `kind build node-image` needs Kubernetes release tarballs or a source tree and pulls images from
# registries; neither is reachable here. This does the same steps by hand, like kind v0.32.0's
# pkg/build/nodeimage: start a container from the base image, copy in kubelet/kubeadm/kubectl
# (built from the Go module proxy by hack/build-tools.sh), crictl and the CNI plugins, write
# /kind/version, import the images kubeadm needs into the node's containerd (k8s.io namespace,
# pinned) and commit. The component images are tiny images made here from the same binaries:
#   registry.k8s.io/{kube-apiserver,kube-controller-manager,kube-scheduler,kube-proxy}:$K8S
#   registry.k8s.io/etcd:<etcd>-0, registry.k8s.io/coredns/coredns:<coredns>, registry.k8s.io/pause
#   ebbflow.local/flannel:<flannel>  (pod network, hack/kind/flannel.yaml)
#   ebbflow.local/local-path-{provisioner,helper}  (default StorageClass, kind's manifest)
# etcd and CoreDNS are the versions this repo pins, not kubeadm's defaults; hack/kind/cluster.yaml
# tells kubeadm their tags.
#
# Prints the image tag. Cached: the tag carries a hash of all inputs; an existing tag is reused.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIND_DIR=$ROOT/hack/kind
TOOLS_BIN=${TOOLS_BIN:-$ROOT/.tools/bin}
TOOLS_CACHE=${TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebbflow/tools}
NODE_REPO=${KIND_NODE_REPO:-ebbflow/kind-node}
export TOOLS_BIN TOOLS_CACHE

mod_version() { awk -v m="$2" '$1 == "require" && $2 == m {print $3; exit} $1 == m && $2 != "=>" {print $2; exit}' "$ROOT/hack/tools/$1/go.mod"; }
K8S_VERSION=$(mod_version kubernetes k8s.io/kubernetes)
ETCD_VERSION=$(mod_version etcd go.etcd.io/etcd/server/v3)
tool_var() { awk -F= -v v="$1" '$1 == v {print $2}' "$ROOT/hack/build-tools.sh"; }
COREDNS_VERSION=$(tool_var COREDNS_VERSION)
FLANNEL_VERSION=$(tool_var FLANNEL_VERSION)
LOCAL_PATH_VERSION=$(mod_version kubernetes github.com/rancher/local-path-provisioner)
KIND_VERSION=$(tool_var KIND_VERSION)

log() { echo "[node-image] $*" >&2; }

bash "$ROOT/hack/images/docker-daemon.sh" >&2
log "tools (cached per machine by hack/build-tools.sh)"
bash "$ROOT/hack/build-tools.sh" kubernetes kubernetes-node etcd coredns flannel crictl cni-plugins \
  local-path-provisioner >&2
BASE_IMAGE=$(bash "$KIND_DIR/build-base-image.sh")
DEBIAN_IMAGE=$(bash "$ROOT/hack/images/debian-base.sh")

PAUSE_VERSION=$("$TOOLS_BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null |
  awk -F: '/\/pause:/ {print $2}')
[[ -n $PAUSE_VERSION ]] || { echo "could not read the pause tag from kubeadm" >&2; exit 1; }

# pause: a static C binary (upstream compiles build/pause/linux/pause.c the same way).
PAUSE_BIN=$TOOLS_CACHE/pause-$PAUSE_VERSION/pause
if [[ ! -x $PAUSE_BIN ]]; then
  command -v gcc >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null; }
  mkdir -p "$(dirname "$PAUSE_BIN")"
  src=$(cd "$ROOT/hack/tools/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-0" -o "$PAUSE_BIN.tmp" "$src"
  strip "$PAUSE_BIN.tmp"
  mv -f "$PAUSE_BIN.tmp" "$PAUSE_BIN"
fi

# Netbase: Debian + iptables/nftables/conntrack for kube-proxy and flannel, and the local-path
# helper image (it needs sh, mkdir, rm). Cached by its inputs.
NETBASE_HASH=$( {
  cat "$KIND_DIR/images/netbase.Dockerfile" "$KIND_DIR/images/iptables-wrapper"
  docker image inspect -f '{{.Id}}' "$DEBIAN_IMAGE"
} | sha256sum | cut -c1-12)
NETBASE=ebbflow/kind-netbase:$NETBASE_HASH

REG=registry.k8s.io
declare -A IMAGES=(
  [kube-apiserver]=$REG/kube-apiserver:$K8S_VERSION
  [kube-controller-manager]=$REG/kube-controller-manager:$K8S_VERSION
  [kube-scheduler]=$REG/kube-scheduler:$K8S_VERSION
  [kube-proxy]=$REG/kube-proxy:$K8S_VERSION
  [etcd]=$REG/etcd:${ETCD_VERSION#v}-0
  [coredns]=$REG/coredns/coredns:$COREDNS_VERSION
  [pause]=$REG/pause:$PAUSE_VERSION
  [flannel]=ebbflow.local/flannel:$FLANNEL_VERSION
  [local-path-provisioner]=ebbflow.local/local-path-provisioner:$LOCAL_PATH_VERSION
  [local-path-helper]=ebbflow.local/local-path-helper:$NETBASE_HASH
)
NODE_BINS=(kubelet kubeadm kubectl)


HASH=$( {
  sha256sum <"$0"
  find "$KIND_DIR/node" "$KIND_DIR/images" -type f -print0 | sort -z | xargs -0 sha256sum | cut -c1-64
  docker image inspect -f '{{.Id}}' "$BASE_IMAGE"
  echo "${IMAGES[*]}"
  sha256sum "$PAUSE_BIN" "$TOOLS_BIN"/{kubelet,kubeadm,kubectl,kube-proxy,kube-apiserver,kube-controller-manager,kube-scheduler,etcd,coredns,flannel,crictl,local-path-provisioner} \
    "$TOOLS_BIN"/cni/* | cut -c1-64
} | sha256sum | cut -c1-12)
IMAGE=$NODE_REPO:$K8S_VERSION-$HASH

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "$IMAGE"
  exit 0
fi
log "building $IMAGE"

WORK=$(mktemp -d)
BUILD_CONTAINER=""
cleanup() {
  [[ -z $BUILD_CONTAINER ]] || docker rm -f -v "$BUILD_CONTAINER" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

if ! docker image inspect "$NETBASE" >/dev/null 2>&1; then
  log "netbase image $NETBASE (Debian packages: about a minute)"
  mkdir -p "$WORK/netbase"
  cp "$KIND_DIR/images/iptables-wrapper" "$WORK/netbase/"
  docker build --network host --build-arg BASE="$DEBIAN_IMAGE" -t "$NETBASE" \
    -f "$KIND_DIR/images/netbase.Dockerfile" "$WORK/netbase" >"$WORK/netbase.log" 2>&1 ||
    { tail -30 "$WORK/netbase.log" >&2; echo "netbase image build failed" >&2; exit 1; }
fi

# static_image NAME BINARY DEST [ENTRYPOINT_JSON]: an image holding one static binary.
static_image() {
  local name=$1 bin=$2 dest=$3 entrypoint=${4:-} root=$WORK/rootfs-$1
  mkdir -p "$root/$(dirname "$dest")" "$root/tmp" "$root/etc/ssl/certs" "$root/var/run"
  chmod 1777 "$root/tmp"
  cp "$bin" "$root/$dest"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$root/etc/group"
  echo 'hosts: files dns' >"$root/etc/nsswitch.conf"
  [[ ! -f /etc/ssl/certs/ca-certificates.crt ]] || cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  local changes=(--change 'ENV PATH=/usr/local/bin:/usr/bin:/bin')
  [[ -z $entrypoint ]] || changes+=(--change "ENTRYPOINT $entrypoint")
  tar -C "$root" --owner=0 --group=0 -c . | docker import "${changes[@]}" - "${IMAGES[$name]}" >/dev/null
}

# netbase_image NAME BINARY DEST [ENTRYPOINT_JSON]: netbase + one binary.
netbase_image() {
  local name=$1 bin=$2 dest=$3 entrypoint=${4:-} ctx=$WORK/ctx-$1
  mkdir -p "$ctx"
  cp "$bin" "$ctx/bin"
  {
    echo "FROM $NETBASE"
    echo "COPY bin $dest"
    [[ -z $entrypoint ]] || echo "ENTRYPOINT $entrypoint"
  } >"$ctx/Dockerfile"
  docker build -q -t "${IMAGES[$name]}" "$ctx" >"$ctx/build.log" 2>&1 || { cat "$ctx/build.log" >&2; return 1; }
}

log "component images"
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  static_image "$c" "$TOOLS_BIN/$c" "/usr/local/bin/$c"
done
static_image etcd "$TOOLS_BIN/etcd" /usr/local/bin/etcd
static_image coredns "$TOOLS_BIN/coredns" /coredns '["/coredns"]'
static_image pause "$PAUSE_BIN" /pause '["/pause"]'
netbase_image kube-proxy "$TOOLS_BIN/kube-proxy" /usr/local/bin/kube-proxy
netbase_image flannel "$TOOLS_BIN/flannel" /opt/bin/flanneld '["/opt/bin/flanneld"]'
static_image local-path-provisioner "$TOOLS_BIN/local-path-provisioner" /usr/local/bin/local-path-provisioner
docker tag "$NETBASE" "${IMAGES[local-path-helper]}" # the helper pod needs sh, mkdir, rm
docker save "${IMAGES[@]}" -o "$WORK/images.tar"
log "images: $(du -h "$WORK/images.tar" | cut -f1) to preload"

# The build container: the base image with `sleep` instead of systemd (like kind's builder).
BUILD_CONTAINER=$(docker run -d --entrypoint sleep --security-opt seccomp=unconfined "$BASE_IMAGE" infinity)
in_node() { docker exec -i "$BUILD_CONTAINER" "$@"; }

for b in "${NODE_BINS[@]}"; do
  docker cp "$TOOLS_BIN/$b" "$BUILD_CONTAINER:/usr/bin/$b"
done
docker cp "$TOOLS_BIN/crictl" "$BUILD_CONTAINER:/usr/local/bin/crictl"
for p in "$TOOLS_BIN"/cni/*; do
  docker cp "$p" "$BUILD_CONTAINER:/opt/cni/bin/"
done
tar -C "$KIND_DIR/node" --owner=0 --group=0 -c . | in_node tar -C / -x --no-overwrite-dir
in_node bash -euc "
  chmod 0755 /usr/bin/kubelet /usr/bin/kubeadm /usr/bin/kubectl /usr/local/bin/crictl /opt/cni/bin/*
  echo -n '$K8S_VERSION' > /kind/version
  sed -i 's#sandbox_image = .*#sandbox_image = \"${IMAGES[pause]}\"#' /etc/containerd/config.toml
"

# Default storage: kind's own local-path manifest (from the kind module), with our images.
KIND_STORAGE_GO=$(go env GOMODCACHE)/sigs.k8s.io/kind@$KIND_VERSION/pkg/build/nodeimage/const_storage.go
[[ -f $KIND_STORAGE_GO ]] || (cd /tmp && go mod download "sigs.k8s.io/kind@$KIND_VERSION")
sed -n '/^const defaultStorageManifest = `/,/^`$/p' "$KIND_STORAGE_GO" | sed -e '1d' -e '$d' \
  -e "s#\` + storageProvisionerImage + \`#${IMAGES[local-path-provisioner]}#" \
  -e "s#\` + storageHelperImage + \`#${IMAGES[local-path-helper]}#" >"$WORK/default-storage.yaml"
grep -q "${IMAGES[local-path-provisioner]}" "$WORK/default-storage.yaml" ||
  { echo "could not extract kind's storage manifest from $KIND_STORAGE_GO" >&2; exit 1; }
in_node mkdir -p /kind/manifests
docker cp "$WORK/default-storage.yaml" "$BUILD_CONTAINER:/kind/manifests/default-storage.yaml"

log "importing images into the node's containerd"
in_node bash -c 'nohup containerd >/tmp/containerd.log 2>&1 & echo $! >/tmp/containerd.pid'
in_node bash -c 'for i in $(seq 1 30); do [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1 && exit 0; sleep 1; done
  cat /tmp/containerd.log >&2; exit 1' || { echo "containerd did not start in the build container" >&2; exit 1; }
in_node ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned \
  --all-platforms --no-unpack --digests - <"$WORK/images.tar" >/dev/null
have=$(in_node ctr --namespace=k8s.io images list -q)
missing=()
for want in $("$TOOLS_BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION" \
  --config <(printf 'apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: %s\netcd:\n  local:\n    imageTag: %s\ndns:\n  imageTag: %s\n' \
    "$K8S_VERSION" "${ETCD_VERSION#v}-0" "$COREDNS_VERSION") 2>/dev/null) \
  "${IMAGES[flannel]}" "${IMAGES[local-path-provisioner]}" "${IMAGES[local-path-helper]}"; do
  grep -qxF "$want" <<<"$have" || missing+=("$want")
done
# Stop containerd cleanly. `sleep` is PID 1 here and never reaps, so "exited" means zombie.
in_node bash -c 'p=$(cat /tmp/containerd.pid); kill "$p"
  for _ in $(seq 1 100); do [[ $(awk "{print \$3}" /proc/$p/stat 2>/dev/null || echo Z) == Z ]] && break; sleep 0.2; done
  rm -f /tmp/containerd.pid /tmp/containerd.log'
if ((${#missing[@]})); then
  echo "node image would lack images kubeadm/flannel need: ${missing[*]}" >&2
  exit 1
fi

docker commit \
  --change 'ENTRYPOINT [ "/usr/local/bin/ebbflow-entrypoint", "/sbin/init" ]' \
  --change 'CMD []' \
  "$BUILD_CONTAINER" "$IMAGE" >/dev/null
docker tag "$IMAGE" "$NODE_REPO:latest"
log "done: $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
echo "$IMAGE"
