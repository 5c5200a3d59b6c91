#!/usr/bin/env bash
# Creates the local kind cluster "ebbflow" (1 control plane + 3 workers) entirely offline: builds or
# reuses the cached base and node images, creates the cluster from hack/kind/cluster.yaml, installs
# flannel (hack/kind/flannel.yaml) and waits until every node is Ready and CoreDNS runs.
# Kubeconfig: .cluster/kind-kubeconfig. Idempotent: an existing cluster (also one whose nodes docker is
# starting again) is only waited for.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIND_DIR=$ROOT/hack/kind
CLUSTER=${KIND_CLUSTER_NAME:-ebbflow}
KUBECONFIG_OUT=${KIND_KUBECONFIG:-$ROOT/.cluster/kind-kubeconfig}
WAIT_S=${KIND_WAIT_S:-600}
SHARED=${KIND_SHARED_DIR:-$ROOT/.cluster/shared} # /shared on every worker (cluster.yaml)
# hack/kind/bin/docker adapts `docker run --privileged` on hosts without CAP_SYS_RESOURCE.
export PATH=$KIND_DIR/bin:$ROOT/.tools/bin:$PATH

start=$SECONDS
step=$SECONDS
timing() { echo "[up] $1: $((SECONDS - step)) s (total $((SECONDS - start)) s)"; step=$SECONDS; }

[[ -x $ROOT/.tools/bin/kind ]] || bash "$ROOT/hack/build-tools.sh" kind kubernetes
IMAGE=$(bash "$KIND_DIR/build-node-image.sh")
timing "node image $IMAGE"

mkdir -p "$(dirname "$KUBECONFIG_OUT")"
# A directory every pod may write, whatever its user: examples/volumes/shared-checkpoints.yaml.
mkdir -p "$SHARED/volumes"
chmod 1777 "$SHARED/volumes"
export KUBECONFIG=$KUBECONFIG_OUT
if kind get clusters 2>/dev/null | grep -qxF "$CLUSTER"; then
  echo "[up] cluster $CLUSTER exists; refreshing kubeconfig"
  kind export kubeconfig --name "$CLUSTER" --kubeconfig "$KUBECONFIG_OUT" >/dev/null
else
  etcd_tag=$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" {print $3}' "$ROOT/hack/tools/etcd/go.mod")
  coredns_tag=$(awk -F= '$1 == "COREDNS_VERSION" {print $2}' "$ROOT/hack/build-tools.sh")
  config=$(mktemp)
  trap 'rm -f "$config"' EXIT
  mkdir -p "$SHARED"
  sed -e "s/@ETCD_TAG@/${etcd_tag#v}-0/" -e "s/@COREDNS_TAG@/$coredns_tag/" -e "s#@SHARED@#$SHARED#" \
    "$KIND_DIR/cluster.yaml" >"$config"
  kind create cluster --name "$CLUSTER" --config "$config" --image "$IMAGE" \
    --kubeconfig "$KUBECONFIG_OUT" ${KIND_RETAIN:+--retain}
  timing "kind create cluster"
fi

# An existing cluster may be starting again: docker restarts its nodes when the daemon or the machine
# restarts (a CI run's cluster left behind did, and `kubectl apply` then failed at once with "failed
# to download openapi"). Nothing is applied before its API server is ready and serves its OpenAPI.
deadline=$((SECONDS + WAIT_S))
until kubectl get --raw /readyz >/dev/null 2>&1 && kubectl get --raw /openapi/v2 >/dev/null 2>&1; do
  if ((SECONDS >= deadline)); then
    echo "[up] the API server of $CLUSTER was not ready within $WAIT_S s:" >&2
    kubectl get --raw '/readyz?verbose' >&2 || true
    exit 1
  fi
  sleep 2
done
timing "API server ready"
kubectl apply -f "$KIND_DIR/flannel.yaml" >/dev/null
kubectl -n kube-flannel rollout status daemonset/kube-flannel-ds --timeout="${WAIT_S}s"
timing "flannel ready"
kubectl wait --for=condition=Ready node --all --timeout="${WAIT_S}s"
timing "nodes Ready"
kubectl -n kube-system rollout status deployment/coredns --timeout="${WAIT_S}s"
timing "coredns running"
kubectl get nodes -o wide
echo "[up] cluster $CLUSTER ready in $((SECONDS - start)) s; export KUBECONFIG=$KUBECONFIG_OUT"
