#!/usr/bin/env bash
# Deletes the local kind cluster "ebbflow" and its kubeconfig. Keeps the cached base/node images, so
# the next hack/kind/up.sh takes seconds to a minute. Does nothing when no such cluster exists.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CLUSTER=${KIND_CLUSTER_NAME:-ebbflow}
KUBECONFIG_OUT=${KIND_KUBECONFIG:-$ROOT/.cluster/kind-kubeconfig}
export PATH=$ROOT/hack/kind/bin:$ROOT/.tools/bin:$PATH

if kind get clusters 2>/dev/null | grep -qxF "$CLUSTER"; then
  kind delete cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_OUT"
else
  echo "no kind cluster named $CLUSTER"
fi
rm -f "$KUBECONFIG_OUT"
