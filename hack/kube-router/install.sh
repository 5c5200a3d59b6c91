#!/usr/bin/env bash
# Installs kube-router into the kind cluster as its NetworkPolicy controller (README.md says how):
# builds or reuses its image (build-image.sh), loads it into the worker nodes, applies the
# DaemonSet and its RBAC (kube-router.yaml) and waits for a Ready pod on every worker. Idempotent.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export PATH=$ROOT/hack/kind/bin:$ROOT/.tools/bin:$PATH
CLUSTER=${KIND_CLUSTER_NAME:-ebbflow}
WAIT_S=${KIND_WAIT_S:-300}

image=$(bash "$HERE/build-image.sh" | tail -1)
workers=$(kind get nodes --name "$CLUSTER" | grep -v -- '-control-plane$' | paste -sd, -)
bash "$ROOT/hack/kind/load-image.sh" "$image" "$workers"
sed "s#ebbflow.local/kube-router:dev#$image#" "$HERE/kube-router.yaml" | kubectl apply -f - >/dev/null
kubectl -n kube-system rollout status daemonset/kube-router --timeout="${WAIT_S}s"
