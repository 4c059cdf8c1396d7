{{/* Names, labels and the few decisions every template shares. */}}

{{- define "agentrun.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "agentrun.fullname" -}}
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

{{- define "agentrun.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "agentrun.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentrun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "agentrun.labels" -}}
helm.sh/chart: {{ include "agentrun.chart" . }}
{{ include "agentrun.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentrun
{{- end }}

{{- define "agentrun.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentrun.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "agentrun.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* true when the operator watches only .Values.watchNamespaces (Roles instead of a ClusterRole) */}}
{{- define "agentrun.namespaced" -}}
{{- if .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{/*
Whether to render a cluster-scoped part: (list VALUE .) with VALUE true, false or null; null means only in
cluster-wide mode, so a namespace-scoped release renders nothing cluster-scoped unless asked.
*/}}
{{- define "agentrun.clusterScoped" -}}
{{- $value := index . 0 }}
{{- $root := index . 1 }}
{{- if kindIs "bool" $value }}{{ if $value }}true{{ end }}
{{- else if not (include "agentrun.namespaced" $root) }}true{{ end }}
{{- end }}

{{/* The namespaces where attempt Pods run, as a JSON list (see agents.namespaces in values.yaml). */}}
{{- define "agentrun.agentNamespaces" -}}
{{- $namespaces := concat .Values.watchNamespaces .Values.agents.namespaces | uniq }}
{{- if not $namespaces }}{{ $namespaces = list .Release.Namespace }}{{ end }}
{{- toJson $namespaces }}
{{- end }}

{{/* Refuses combinations the schema cannot express. */}}
{{- define "agentrun.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.peering.enabled) }}
{{- fail "replicaCount > 1 needs peering.enabled: without it every replica would reconcile every Run" }}
{{- end }}
{{- if and .Values.health.enabled .Values.metrics.enabled (eq (int .Values.health.port) (int .Values.metrics.port)) }}
{{- fail "health.port and metrics.port must differ: both endpoints listen in the operator container" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled: there is nothing to scrape otherwise" }}
{{- end }}
{{- if and .Values.stateStore.bundled.enabled .Values.stateStore.credentialsSecret }}
{{- fail "stateStore.credentialsSecret must be empty with stateStore.bundled.enabled (the default): the operator's credentials are the bundled server's root (stateStore.bundled.existingSecret); with a store of your own, set stateStore.bundled.enabled=false" }}
{{- end }}
{{- if and .Values.stateStore.bundled.enabled (not .Values.stateStore.bundled.install) (not (and .Values.stateStore.url .Values.stateStore.bundled.existingSecret)) }}
{{- fail "stateStore.bundled.install=false needs stateStore.url (where the server runs) and stateStore.bundled.existingSecret (its root credentials)" }}
{{- end }}
{{- if and (not .Values.rbac.create) (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) }}
{{- fail "serviceAccount.name is required when the chart creates neither the ServiceAccount nor its RBAC" }}
{{- end }}
{{- end }}
