#!/usr/bin/env bash
# Installs Cilium into the kind cluster as its NetworkPolicy engine (values.yaml says how): builds or
# reuses the agent image (build-image.sh), loads it into the worker nodes, applies Cilium's CRDs and
# the CNI chaining configuration, `helm upgrade --install`s the chart from the Cilium module and waits
# for the agents. Pods created before the agent runs on their node are not policed: hack/kind/up.sh
# runs this right after flannel, before any workload. Idempotent.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export PATH=$ROOT/hack/kind/bin:$ROOT/.tools/bin:$PATH
CLUSTER=${KIND_CLUSTER_NAME:-ebbflow}
WAIT_S=${KIND_WAIT_S:-600}

image=$(bash "$HERE/build-image.sh" | tail -1)
source=$(bash "$ROOT/hack/build-tools.sh" cilium-source)
workers=$(kind get nodes --name "$CLUSTER" | grep -v -- '-control-plane$' | paste -sd, -)
bash "$ROOT/hack/kind/load-image.sh" "$image" "$workers"
crds=$source/pkg/k8s/apis/cilium.io/client/crds
kubectl apply --server-side --force-conflicts -f "$crds/v2/" -f "$crds/v2alpha1/" >/dev/null
kubectl apply -f "$HERE/chaining.yaml" >/dev/null
helm upgrade --install cilium "$source/install/kubernetes/cilium" --namespace kube-system \
  --values "$HERE/values.yaml" --set "image.tag=${image##*:}" >/dev/null
kubectl -n kube-system rollout status daemonset/cilium --timeout="${WAIT_S}s"
