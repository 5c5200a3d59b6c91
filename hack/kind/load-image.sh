#!/usr/bin/env bash
# Loads a Docker image into kind nodes, one node at a time, keeping each node's copy small. It does
# what `kind load docker-image` does (`docker save` into `ctr images import` in the node), with three
# differences, all about disk:
#   - the image's layer blobs are removed from the node's containerd content store once unpacked
#     (containerd's `discard_unpacked_layers` does that for pulled images; an imported image is never
#     pulled): the 4.5 GB CPU trainer image then costs 4.6 GB per node instead of 9.4 GB;
#   - a previous image under the same name is removed first, with the `sha256:<id>` name the CRI
#     gives an image it ran (otherwise every rebuild stays on every node until the cluster goes);
#   - no `import-<date>@sha256:...` digest names (kind's `--digests`), which would keep them too.
# Nodes are done one after another, so the transient extra space is one node's copy; before each,
# hack/free-build-caches.sh makes room for it if the disk is short. An image already on a node (same
# ID) is skipped. Pods with imagePullPolicy IfNotPresent or Never run it.
#
# Usage: hack/kind/load-image.sh IMAGE [NODE,NODE,...]   (default: every node of the cluster)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export PATH=$ROOT/hack/kind/bin:$ROOT/.tools/bin:$PATH
CLUSTER=${KIND_CLUSTER_NAME:-ebbflow}
image=${1:?usage: $0 IMAGE [NODE,NODE,...]}
nodes=${2:-$(kind get nodes --name "$CLUSTER" | paste -sd, -)}

id=$(docker image inspect --format '{{.Id}}' "$image")
# `docker save` writes uncompressed layers, so each layer blob's digest is the layer's diff ID.
read -r -a layers <<<"$(docker image inspect --format '{{range .RootFS.Layers}}{{.}} {{end}}' "$image")"
# containerd's name for it: Docker Hub's implicit prefixes made explicit.
name=$image
[[ ${name%%/*} == *.* || ${name%%/*} == localhost* ]] || name=docker.io/$name
[[ $name == */*/* ]] || name=${name/docker.io\//docker.io/library/}

ctr_k8s() { docker exec "$1" ctr --namespace k8s.io "${@:2}"; }

# While a node imports, the image is there twice (layer blobs and the unpacked snapshots), plus room
# for the node's own writes.
size_mb=$(($(docker image inspect --format '{{.Size}}' "$image") / 1048576))
needed_mb=$((2 * size_mb + 2048))

IFS=, read -r -a node_list <<<"$nodes"
for node in "${node_list[@]}"; do
  start=$SECONDS
  present=$(docker exec "$node" crictl inspecti -o go-template --template '{{.status.id}}' "$name" 2>/dev/null || true)
  if [[ $present == "$id" ]]; then
    echo "$image is on $node already" >&2
    continue
  fi
  if [[ -n $present ]]; then
    ctr_k8s "$node" images rm "$name" "$present" >/dev/null 2>&1 || true
  fi
  bash "$ROOT/hack/free-build-caches.sh" "$needed_mb" "loading $image into $node"
  docker save "$image" | docker exec -i "$node" ctr --namespace k8s.io images import --snapshotter overlayfs - >/dev/null
  ctr_k8s "$node" content rm "${layers[@]}" >/dev/null
  echo "loaded $image into $node in $((SECONDS - start)) s (layer blobs dropped, snapshots kept)" >&2
done
