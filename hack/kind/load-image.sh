#!/usr/bin/env bash
# Loads a Docker image into kind nodes. It does what `kind load docker-image` does (`docker save`
# into `ctr images import` in each node), differently where that costs time or disk:
#   - nodes that mount the cluster's shared directory (/shared on every worker, hack/kind/up.sh)
#     import one `docker save` file from there, side by side when the disk has room for all their
#     copies at once. Streaming through `docker exec -i` costs dockerd most of a core: the 4.5 GB CPU
#     trainer image took 232 s per worker that way (12-14 min for three in CI), against 151 s from
#     the file alone; three workers at once took 59 s (the save) + 284 s here, on a machine busy with
#     other work. Other nodes (the control plane) get the stream;
#   - the image's layer blobs are removed from the node's containerd content store once unpacked
#     (containerd's `discard_unpacked_layers` does that for pulled images; an imported image is never
#     pulled): an image then costs its unpacked size per node, not about twice that;
#   - a previous image under the same name is removed first, with the `sha256:<id>` name the CRI
#     gives an image it ran (otherwise every rebuild stays on every node until the cluster goes);
#   - no `import-<date>@sha256:...` digest names (kind's `--digests`), which would keep them too.
# Before importing, hack/free-build-caches.sh makes room if the disk is short. An image already on
# a node (same ID) is skipped. Pods with imagePullPolicy IfNotPresent or Never run it.
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
size_mb=$(($(docker image inspect --format '{{.Size}}' "$image") / 1048576))

ctr_k8s() { docker exec "$1" ctr --namespace k8s.io "${@:2}"; }
shared_source() { # the host directory mounted at /shared in node $1, if any
  docker inspect --format '{{range .Mounts}}{{if eq .Destination "/shared"}}{{.Source}}{{end}}{{end}}' "$1"
}

# Two images may go into one node at once (the set-up loads the trainer image beside the chart's
# operator image) and share base layers: one import's `content rm` would remove blobs the other is
# still unpacking ("failed to resolve layers ... not found"). Imports into a node hold its lock
# shared; dropping the blobs takes it exclusive, and is left to the last import when another runs.
node_lock() { echo "${TMPDIR:-/tmp}/ebbflow-kind-$CLUSTER-$1.lock"; }

# import_into NODE SOURCE: SOURCE is a path inside the node, or "-" for the image streamed on stdin.
import_into() {
  local node=$1 source=$2 start=$SECONDS
  (
    flock --shared 9
    if [[ $source == - ]]; then
      docker save "$image" | docker exec -i "$node" ctr --namespace k8s.io images import --snapshotter overlayfs - >/dev/null
    else
      ctr_k8s "$node" images import --snapshotter overlayfs "$source" >/dev/null
    fi
  ) 9>"$(node_lock "$node")"
  (
    if flock --exclusive --nonblock 9; then
      ctr_k8s "$node" content rm "${layers[@]}" >/dev/null
      dropped="layer blobs dropped"
    else
      dropped="layer blobs kept: another import into the node was running"
    fi
    echo "loaded $image into $node in $((SECONDS - start)) s ($dropped, snapshots kept)" >&2
  ) 9>"$(node_lock "$node")"
}

# The nodes that lack it (any other image under its name removed), split by how they get it.
IFS=, read -r -a node_list <<<"$nodes"
streamed=() from_file=() shared=""
for node in "${node_list[@]}"; do
  present=$(docker exec "$node" crictl inspecti -o go-template --template '{{.status.id}}' "$name" 2>/dev/null || true)
  if [[ $present == "$id" ]]; then
    echo "$image is on $node already" >&2
    continue
  fi
  if [[ -n $present ]]; then
    ctr_k8s "$node" images rm "$name" "$present" >/dev/null 2>&1 || true
  fi
  source=$(shared_source "$node")
  if [[ -n $source && (-z $shared || $source == "$shared") ]]; then
    shared=$source
    from_file+=("$node")
  else
    streamed+=("$node")
  fi
done

# While a node imports, the image is there twice (layer blobs and the unpacked snapshots), plus room
# for the node's own writes.
per_node_mb=$((2 * size_mb + 2048))
for node in "${streamed[@]}"; do
  bash "$ROOT/hack/free-build-caches.sh" "$per_node_mb" "loading $image into $node"
  import_into "$node" -
done
((${#from_file[@]})) || exit 0

file=.ebbflow-images/${id#sha256:}.tar
mkdir -p "$shared/.ebbflow-images"
trap 'rm -f "$shared/$file"; rmdir "$shared/.ebbflow-images" 2>/dev/null || true' EXIT
bash "$ROOT/hack/free-build-caches.sh" "$((size_mb + per_node_mb))" "saving $image for ${#from_file[@]} node(s)"
start=$SECONDS
docker save --output "$shared/$file" "$image"
echo "saved $image for ${#from_file[@]} node(s) in $((SECONDS - start)) s" >&2
# Side by side when the disk has room for every node's transient copy now (no cache is removed for
# that), else one after another.
docker_root=$(docker info --format '{{.DockerRootDir}}')
if (($(df -Pm "$docker_root" | awk 'NR == 2 {print $4}') >= ${#from_file[@]} * per_node_mb)); then
  pids=()
  for node in "${from_file[@]}"; do
    import_into "$node" "/shared/$file" &
    pids+=($!)
  done
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  exit "$failed"
fi
for node in "${from_file[@]}"; do
  bash "$ROOT/hack/free-build-caches.sh" "$per_node_mb" "loading $image into $node"
  import_into "$node" "/shared/$file"
done
