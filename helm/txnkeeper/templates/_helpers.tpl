{{/* Names and labels shared by every template. */}}

{{- define "txnkeeper.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "txnkeeper.operatorName" -}}
{{- printf "%s-operator" (include "txnkeeper.fullname" .) -}}
{{- end -}}

{{- define "txnkeeper.labels" -}}
app.kubernetes.io/name: txnkeeper-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "txnkeeper.selectorLabels" -}}
app.kubernetes.io/name: txnkeeper-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "txnkeeper.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "txnkeeper.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "txnkeeper.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "txnkeeper.verifierImage" -}}
{{- printf "%s:%s" .Values.verifierImage.repository (default .Chart.AppVersion .Values.verifierImage.tag) -}}
{{- end -}}

{{/* The operator's permissions: exactly what reconcile.py and kopf do, nothing more. */}}
{{- define "txnkeeper.operatorRules" -}}
- apiGroups: ["txnkeeper.io"]
  resources: ["transactioncoordinators", "pendingackstores"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["txnkeeper.io"]
  resources: ["transactioncoordinators/status", "pendingackstores/status"]
  verbs: ["get", "patch"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "create", "patch"]
{{- /* create, deletecollection: only to grant them to a verifier whose Spark runs its executors as
pods (sparkMaster k8s://); the operator itself never creates a pod nor deletes pods by label. */}}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "deletecollection"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "update", "patch"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["get", "create", "patch"]
{{- /* patch: the certificate manager renews the certificate Secrets it made (txnkeeper-ca, {name}-tls,
txnkeeper-operator-client-tls); still no list/watch: it reads Secrets by name only. */}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch"]
{{- /* spec.tls.certManager: the operator makes cert-manager Certificates (no cert-manager CRD: unused). */}}
- apiGroups: ["cert-manager.io"]
  resources: ["certificates"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "create"]
- apiGroups: ["batch"]
  resources: ["cronjobs"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
