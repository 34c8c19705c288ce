{{- define "laps.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "laps.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "laps.labels" -}}
app.kubernetes.io/name: {{ include "laps.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "laps.selectorLabels" -}}
app.kubernetes.io/name: {{ include "laps.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "laps.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "laps.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The rules the operator needs. It must hold every permission it grants to the gateway Role
     (Kubernetes forbids escalation), hence endpointslices here. Without Prometheus the
     allocation loop lists the gateway pods (pods: list) and reads their /metrics over the pod
     network: the NetworkPolicy the operator renders around the gateways lets in pods labelled
     app.kubernetes.io/name=laps, app.kubernetes.io/component=operator (laps.selectorLabels). */}}
{{- define "laps.operatorRules" -}}
- apiGroups: [laps.io]
  resources: [lapsclusters, lapsclusters/status]
  verbs: [get, list, watch, patch, update]
{{- /* Children carry ownerReferences with blockOwnerDeletion: true, which the
       OwnerReferencesPermissionEnforcement admission plugin allows only to whoever may update
       the owner's finalizers. */}}
- apiGroups: [laps.io]
  resources: [lapsclusters/finalizers]
  verbs: [update, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
- apiGroups: [""]
  resources: [services, configmaps, serviceaccounts]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, update, delete]
{{- end -}}
