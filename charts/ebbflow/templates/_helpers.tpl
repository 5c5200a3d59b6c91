{{/* Chart name. */}}
{{- define "ebbflow.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the prefix of every namespaced object's name. */}}
{{- define "ebbflow.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* name-version, for the helm.sh/chart label. */}}
{{- define "ebbflow.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "ebbflow.labels" -}}
helm.sh/chart: {{ include "ebbflow.chart" . }}
{{ include "ebbflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ebbflow
{{- end }}

{{/* The operator pod's selector. */}}
{{- define "ebbflow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ebbflow.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "ebbflow.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ebbflow.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Namespaces that get the trainer ServiceAccount and Role, as a JSON list (use with fromJsonArray):
trainer.rbac.namespaces, or else the release namespace plus watchNamespaces.
*/}}
{{- define "ebbflow.trainerNamespaces" -}}
{{- $namespaces := .Values.trainer.rbac.namespaces }}
{{- if not $namespaces }}
{{- $namespaces = prepend .Values.watchNamespaces .Release.Namespace }}
{{- end }}
{{- $namespaces | uniq | toJson }}
{{- end }}

{{/* `key=value,key=value` (sorted) for --node-selector. */}}
{{- define "ebbflow.nodeSelectorFlag" -}}
{{- $pairs := list }}
{{- range $key, $value := .Values.operator.nodeSelector }}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* The operator's arguments (after the image's entrypoint, tini -- ebbflow-operator). */}}
{{- define "ebbflow.args" -}}
{{- $operator := .Values.operator }}
{{- range .Values.watchNamespaces }}
- {{ printf "--namespace=%s" . | quote }}
{{- end }}
{{- with include "ebbflow.nodeSelectorFlag" . }}
- {{ printf "--node-selector=%s" . | quote }}
{{- end }}
- {{ printf "--pending-timeout=%v" $operator.pendingTimeout | quote }}
- {{ printf "--pending-hold=%v" $operator.pendingHold | quote }}
- {{ printf "--resync-interval=%v" $operator.resyncInterval | quote }}
- {{ printf "--relist-interval=%v" $operator.relistInterval | quote }}
- {{ printf "--max-writes-per-pass=%v" $operator.maxWritesPerPass | quote }}
- {{ printf "--metrics-address=%s" $operator.metricsAddress | quote }}
- {{ printf "--metrics-port=%v" $operator.metricsPort | quote }}
- {{ printf "--health-port=%v" $operator.healthPort | quote }}
- {{ printf "--log-level=%s" $operator.logLevel | quote }}
- {{ printf "--policy=%s" $operator.policy | quote }}
- {{ printf "--kueue=%t" $operator.kueue | quote }}
{{- with .Values.leaderElection }}
- {{ printf "--leader-elect=%t" .enabled | quote }}
- {{ printf "--leader-election-namespace=%s" $.Release.Namespace | quote }}
- {{ printf "--lease-duration=%v" .leaseDuration | quote }}
- {{ printf "--renew-deadline=%v" .renewDeadline | quote }}
- {{ printf "--retry-period=%v" .retryPeriod | quote }}
{{- end }}
{{- if .Values.trainer.serviceAccount.create }}
{{- $name := .Values.trainer.serviceAccount.name }}
{{- range include "ebbflow.trainerNamespaces" . | fromJsonArray }}
- {{ printf "--trainer-service-account=%s/%s" . $name | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The operator's rules on the jobs and what they own, in every watched namespace. */}}
{{- define "ebbflow.namespacedRules" }}
  # The rendezvous and headless Services: listed, watched and created.
  - apiGroups: [""]
    resources: ["services"]
    verbs: ["list", "watch", "create"]
  # Each job's NetworkPolicy: listed, watched and created.
  - apiGroups: ["networking.k8s.io"]
    resources: ["networkpolicies"]
    verbs: ["list", "watch", "create"]
  # Each job's rendezvous token Secret: created only (its content is the operator's to derive, so
  # the operator never reads a Secret).
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["create"]
  # Events on the jobs (kubectl describe etj).
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create"]
  # The jobs: listed and watched; only their status is written.
  - apiGroups: ["ebbflow.dev"]
    resources: ["elastictrainingjobs"]
    verbs: ["list", "watch"]
  - apiGroups: ["ebbflow.dev"]
    resources: ["elastictrainingjobs/status"]
    verbs: ["patch"]
{{- if .Values.operator.kueue }}
  # Kueue's Workloads (--kueue): the queued jobs' slices created, a slice's count lowered, the status
  # written to finish a replaced slice or release an evicted one; the others read for the quota
  # they hold in the jobs' ClusterQueues.
  - apiGroups: ["kueue.x-k8s.io"]
    resources: ["workloads"]
    verbs: ["list", "watch", "create", "patch"]
  - apiGroups: ["kueue.x-k8s.io"]
    resources: ["workloads/status"]
    verbs: ["patch"]
  # The LocalQueues: the ClusterQueue a new job's queue feeds (room made for it, kueue_room.py).
  - apiGroups: ["kueue.x-k8s.io"]
    resources: ["localqueues"]
    verbs: ["list", "watch"]
{{- end }}
{{- end }}
