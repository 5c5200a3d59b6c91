#!/usr/bin/env bash
# Smoke test for the kind cluster made by hack/kind/up.sh: on every worker, a pod resolves Service
# names through CoreDNS (running on another node, so across the flannel network) and opens a TCP
# connection to the API server's Service IP (kube-proxy); one more pod writes to a PersistentVolumeClaim
# of the default StorageClass (local-path-provisioner). Uses the kube-proxy image because it is
# preloaded on every node and has bash and getent; no registry is needed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export KUBECONFIG=${KIND_KUBECONFIG:-$ROOT/.cluster/kind-kubeconfig}
export PATH=$ROOT/.tools/bin:$PATH
IMAGE=$(kubectl -n kube-system get ds kube-proxy -o jsonpath='{.spec.template.spec.containers[0].image}')
NS=kind-smoke

kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
trap 'kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true' EXIT
nodes=$(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{.items[*].metadata.name}')
for n in $nodes; do
  kubectl -n "$NS" run "smoke-$n" --image="$IMAGE" --restart=Never --env="NODE=$n" \
    --overrides="{\"spec\":{\"nodeName\":\"$n\"}}" --command -- bash -euc '
      getent hosts kubernetes.default.svc.cluster.local
      getent hosts kube-dns.kube-system.svc.cluster.local
      timeout 5 bash -c "</dev/tcp/kubernetes.default.svc.cluster.local/443"
      echo "ok: pod $(hostname -i) on $NODE"' >/dev/null
done
kubectl -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: smoke}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: smoke-pvc}
spec:
  restartPolicy: Never
  containers:
  - {name: c, image: "$IMAGE", command: [bash, -c, "echo ok: wrote a PVC > /data/f && cat /data/f"],
     volumeMounts: [{name: d, mountPath: /data}]}
  volumes: [{name: d, persistentVolumeClaim: {claimName: smoke}}]
EOF
fail=0
for n in $nodes pvc; do
  phase=""
  for _ in $(seq 1 60); do
    phase=$(kubectl -n "$NS" get pod "smoke-$n" -o jsonpath='{.status.phase}')
    [[ $phase == Succeeded || $phase == Failed ]] && break
    sleep 1
  done
  if [[ $phase == Succeeded ]]; then
    echo "[smoke] $n: $(kubectl -n "$NS" logs "smoke-$n" | tr '\n' ' ')"
  else
    echo "[smoke] $n FAILED: $(kubectl -n "$NS" logs "smoke-$n" 2>&1 | tr '\n' ' ')" >&2
    fail=1
  fi
done
exit $fail
