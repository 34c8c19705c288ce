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
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "laps.selectorLabels" -}}
app.kubernetes.io/name: {{ include "laps.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The selector labels win over the user's podLabels: the Deployment's selector must keep
     matching, and the gateways' NetworkPolicy admits the operator by two of them. */}}
{{- define "laps.podLabels" -}}
{{- toYaml (merge (include "laps.selectorLabels" . | fromYaml) (.Values.podLabels | default dict)) -}}
{{- end -}}

{{- define "laps.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "laps.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The rules the operator needs, derived from what it does: the least-privilege e2e test
     (tests/e2e/operator/test_least_privilege_e2e.py) records every permission the operator uses
     through the story create / scale / relabel / repair / prune / delete and compares it with
     these rules both ways (nothing missing, nothing unused); removing any one rule makes a named
     step of that story fail with 403. Why each is here:
     - LAPSClusters: kopf lists, watches and patches them (its progress annotations); the
       operator reads one before each write and patches its status.
     - lapsclusters/finalizers update: children carry ownerReferences with blockOwnerDeletion:
       true, which the OwnerReferencesPermissionEnforcement admission plugin allows only to
       whoever may update the owner's finalizers. The same plugin lets only a holder of `delete`
       on an object set its ownerReferences: hence `delete` on every child kind.
     - pods: prefill pods are watched for group planning and relabelled between the short and
       long Services; every role's pods are watched, and listed while a role is not ready, for
       the reasons in the Ready condition (ImagePullBackOff, Unschedulable, ...); without
       Prometheus the allocation loop lists the gateway pods and reads their /metrics over the
       pod network (the NetworkPolicy the operator renders around the gateways lets in pods
       labelled app.kubernetes.io/name=laps, app.kubernetes.io/component=operator:
       laps.selectorLabels).
     - events: kopf and the operator post Events on LAPSClusters (create); a prefill
       StatefulSet short of pods says why only in its FailedCreate Events (a ResourceQuota, Pod
       Security, a missing PriorityClass), listed for the Ready condition (list).
     - children: read before each write, created, repaired by patch, pruned when the spec no
       longer wants them; the workloads are also watched, for readiness.
     - endpointslices list/watch: what the gateway Role grants; RBAC lets only a holder of a
       permission grant it (no escalation). */}}
{{- define "laps.operatorRules" -}}
- apiGroups: [laps.io]
  resources: [lapsclusters]
  verbs: [get, list, watch, patch]
- apiGroups: [laps.io]
  resources: [lapsclusters/status]
  verbs: [patch]
- apiGroups: [laps.io]
  resources: [lapsclusters/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, list]
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services, configmaps, serviceaccounts]
  verbs: [get, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [get, create, patch, delete]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
{{- end -}}

{{/* What the built-in `view` role gets on LAPSClusters (templates/rbac-aggregate.yaml); `edit`
     and `admin` get it too, so a user of theirs needs no `view` binding besides. */}}
{{- define "laps.viewRules" -}}
- apiGroups: [laps.io]
  resources: [lapsclusters, lapsclusters/status]
  verbs: [get, list, watch]
{{- end -}}

{{/* The metrics Service's name. Service names are DNS-1035 labels (a letter first, no dots, at
     most 63), stricter than the release names Helm takes (`laps.v2`, `1st`): dots become dashes,
     and a name starting with a digit gets `laps-` in front. */}}
{{- define "laps.metricsServiceName" -}}
{{- $name := include "laps.fullname" . | replace "." "-" -}}
{{- if regexMatch "^[0-9]" $name -}}{{- $name = printf "laps-%s" $name -}}{{- end -}}
{{- printf "%s-metrics" ($name | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{/* A Kubernetes quantity (500m, 1Gi, 2, 1e3; the schema's `quantity`) as a float, to compare two:
     the number times its suffix's factor. */}}
{{- define "laps.quantity" -}}
{{- $q := toString .value -}}
{{- $number := regexFind "^[+]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+)?" $q -}}
{{- $factors := dict "" 1.0 "n" 1e-9 "u" 1e-6 "m" 1e-3 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18
                     "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0
                     "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- $suffix := trimPrefix $number $q -}}
{{- if or (not $number) (not (hasKey $factors $suffix)) -}}
{{- fail (printf "resources: %s: cannot read the quantity %q (a number and a suffix such as 500m, 2, 16Gi)" .field $q) -}}
{{- end -}}
{{- mulf (float64 (trimPrefix "+" $number)) (get $factors $suffix) -}}
{{- end -}}

{{/* Fails the install when a request exceeds its limit (the API server would refuse the
     Deployment). Helm merges a user's `resources` over the chart's defaults, so raising
     requests.memory alone keeps the default limits.memory below it. */}}
{{- define "laps.checkResources" -}}
{{- $requests := .requests | default dict -}}
{{- $limits := .limits | default dict -}}
{{- range $name, $request := $requests -}}
{{- $limit := index $limits $name -}}   {{- /* nil when absent, or set to null */ -}}
{{- if and (not (kindIs "invalid" $limit)) (not (kindIs "invalid" $request)) -}}
{{- $r := include "laps.quantity" (dict "value" $request "field" (printf "requests.%s" $name)) | float64 -}}
{{- $l := include "laps.quantity" (dict "value" $limit "field" (printf "limits.%s" $name)) | float64 -}}
{{- if gt $r $l -}}
{{- fail (printf "resources: requests.%s (%v) exceeds limits.%s (%v), which the API server refuses. Helm merges resources over the chart's defaults (values.yaml): set requests.%s and limits.%s together (null drops one)" $name $request $name $limit $name $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
