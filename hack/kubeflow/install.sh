#!/usr/bin/env bash
# Installs Kubeflow's training-operator (PyTorchJob only) into the cluster $KUBECONFIG points at: the
# PyTorchJob CRD and the ClusterRole from the module's manifests/base, then the namespace kubeflow, a
# ServiceAccount, the ClusterRoleBinding, the (empty) webhook cert Secret and the Deployment; waits for
# the Deployment's rollout (Available). Idempotent. The image must already be on the nodes (README.md):
# TRAINING_OPERATOR_IMAGE (default ebbflow.local/training-operator:dev), imagePullPolicy Never.
# KUBEFLOW_WAIT_S=0 applies without waiting.
#
# No ValidatingWebhookConfiguration: v1.8.1's manager always runs its cert rotator and webhook server
# (no flag turns them off), but the rotator only needs the Secret; without the configuration the API
# server never calls the webhook (README.md says what that skips).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export PATH=$ROOT/.tools/bin:$PATH
IMAGE=${TRAINING_OPERATOR_IMAGE:-ebbflow.local/training-operator:dev}
WAIT_S=${KUBEFLOW_WAIT_S:-300}

manifests=$(bash "$ROOT/hack/build-tools.sh" training-operator-source)/manifests/base
# The CRD is about 0.5 MB: too big for client-side apply's last-applied annotation.
kubectl apply --server-side --force-conflicts -f "$manifests/crds/kubeflow.org_pytorchjobs.yaml"
established='{.status.conditions[?(@.type=="Established")].status}'
deadline=$((SECONDS + 60)) # `kubectl wait` fails at once while the CRD has no status yet
until [[ $(kubectl get crd pytorchjobs.kubeflow.org -o jsonpath="$established") == True ]]; do
  ((SECONDS < deadline)) || { echo "CRD pytorchjobs.kubeflow.org not Established" >&2; exit 1; }
  sleep 1
done
kubectl apply --server-side --force-conflicts -f "$manifests/rbac/role.yaml"
kubectl apply --server-side --force-conflicts -f - <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: kubeflow}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: training-operator, namespace: kubeflow}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: training-operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: training-operator}
subjects: [{kind: ServiceAccount, name: training-operator, namespace: kubeflow}]
---
# Filled by the manager's cert rotator (it has no RBAC to create it).
apiVersion: v1
kind: Secret
metadata: {name: training-operator-webhook-cert, namespace: kubeflow}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: training-operator, namespace: kubeflow}
spec:
  replicas: 1
  selector:
    matchLabels: {control-plane: kubeflow-training-operator}
  template:
    metadata:
      labels: {control-plane: kubeflow-training-operator}
    spec:
      serviceAccountName: training-operator
      terminationGracePeriodSeconds: 10
      securityContext: {runAsNonRoot: true}
      containers:
        - name: training-operator
          image: $IMAGE
          imagePullPolicy: Never
          args: [--enable-scheme=pytorchjob]
          env:
            - name: MY_POD_NAMESPACE
              valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
          securityContext: {allowPrivilegeEscalation: false}
          ports:
            - {containerPort: 8080, name: metrics}
            - {containerPort: 9443, name: webhook-server}
          # Ready once the rotator's certificates show up in the mounted Secret and the webhook
          # server listens: up to a minute or so (the kubelet's Secret sync).
          readinessProbe:
            httpGet: {path: /readyz, port: 8081}
            periodSeconds: 5
          livenessProbe:
            httpGet: {path: /healthz, port: 8081}
            initialDelaySeconds: 15
            periodSeconds: 20
          volumeMounts:
            - {name: cert, mountPath: /tmp/k8s-webhook-server/serving-certs, readOnly: true}
      volumes:
        - name: cert
          secret: {secretName: training-operator-webhook-cert}
EOF
if ((WAIT_S > 0)); then
  kubectl -n kubeflow rollout status --timeout="${WAIT_S}s" deployment/training-operator
fi
echo "done"
