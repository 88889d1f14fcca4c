{{/* Names, labels and the image reference shared by every template. */}}

{{- define "qwen-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, plus the chart name when the release name does not contain it. */}}
{{- define "qwen-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := include "qwen-operator.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "qwen-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "qwen-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "qwen-operator.labels" -}}
{{ include "qwen-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: qwen-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "qwen-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "qwen-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository@digest when a digest is set, else repository:tag (tag defaults to appVersion). */}}
{{- define "qwen-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Namespaces whose QwenDeployments the operator reconciles (namespaced scope only). */}}
{{- define "qwen-operator.watchNamespaces" -}}
{{- if and (eq .Values.operator.scope "namespaced") (not .Values.operator.watchNamespaces) }}
{{- fail "operator.watchNamespaces needs at least one namespace when operator.scope is namespaced" }}
{{- end }}
{{- toJson .Values.operator.watchNamespaces }}
{{- end }}

{{/*
Rules for the objects the operator reads and writes in the namespaces it watches: granted by a
ClusterRole in cluster scope, by a Role per watched namespace in namespaced scope. docs/security.md
gives the reason for every grant; tests/test_security.py holds the same table, so a new grant is a
deliberate edit in both places.
The rules for the child kinds it creates are generated from qwen_operator.kinds (_managed-kinds.tpl);
the ones here are those that are not child kinds. The operator creates a Role granting pods
get/list/watch (for the gateway's endpoint discovery), so it holds exactly those pod verbs itself; it
never needs bind or escalate. Secrets: `create` only (the gateway's generated API-key Secret, never
overwritten): the operator never reads a Secret, it learns of a missing one from the pods' own
evidence (a waiting reason, a FailedMount event).
*/}}
{{- define "qwen-operator.namespacedRules" -}}
# Watch events only: kopf writes no annotations and no finalizers on QwenDeployments.
- apiGroups: ["inference.qwenops.dev"]
  resources: ["qwendeployments"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["inference.qwenops.dev"]
  resources: ["qwendeployments/status"]
  verbs: ["patch"]
# Children name their QwenDeployment as owner with blockOwnerDeletion (foreground deletion waits for
# them); the OwnerReferencesPermissionEnforcement admission plugin (OpenShift, hardened clusters) lets
# only those who may update the owner's finalizers set it. The operator never writes a finalizer.
- apiGroups: ["inference.qwenops.dev"]
  resources: ["qwendeployments/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# Posted about QwenDeployments; read back for the pods' FailedMount events (a missing Secret).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch", "list", "watch"]
# The gateway's generated API-key Secret; create-only (AlreadyExists: left as it is).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# The queue-depth metric as the HPA reads it (ScalingReady): that one metric of pods
# (qwen_operator.recording.ADAPTER_METRIC), no other.
- apiGroups: ["custom.metrics.k8s.io"]
  resources: ["pods/qwen_queue_depth"]
  verbs: ["get"]
{{ include "qwen-operator.managedKindRules" . }}
{{- end }}

