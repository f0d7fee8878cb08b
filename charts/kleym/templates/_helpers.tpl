{{/*
Names, labels and shared snippets of the kleym chart.
*/}}

{{/* The chart's name: nameOverride, else the chart name (63 characters at most). */}}
{{- define "kleym.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's base name (63 characters at most): fullnameOverride, else the release name
when it already contains the chart's name, else `<release>-<name>`.
*/}}
{{- define "kleym.fullname" -}}
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

{{/*
`<fullname>-<suffix>` within 63 characters, the fullname cut so that the suffix stays whole
(distinct suffixes give distinct names). Takes a dict: `ctx` (the root context), `suffix`.
*/}}
{{- define "kleym.suffixedName" -}}
{{- $base := include "kleym.fullname" .ctx | trunc (int (sub 62 (len .suffix))) | trimSuffix "-" }}
{{- printf "%s-%s" $base .suffix }}
{{- end }}

{{/* Name of the hub's objects (Deployment, RBAC, Lease): `<fullname>-hub`. */}}
{{- define "kleym.hubName" -}}
{{- include "kleym.suffixedName" (dict "ctx" . "suffix" "hub") }}
{{- end }}

{{/* Name of the single-cluster operator's objects: `<fullname>-spoke`. */}}
{{- define "kleym.spokeName" -}}
{{- include "kleym.suffixedName" (dict "ctx" . "suffix" "spoke") }}
{{- end }}

{{/* The component this release runs: `hub` (mode fleet) or `spoke` (single-cluster). */}}
{{- define "kleym.component" -}}
{{- if eq .Values.mode "fleet" }}hub{{ else }}spoke{{ end }}
{{- end }}

{{/* Name of the workload's objects in the current mode. */}}
{{- define "kleym.workloadName" -}}
{{- if eq .Values.mode "fleet" }}{{ include "kleym.hubName" . }}{{ else }}{{ include "kleym.spokeName" . }}{{ end }}
{{- end }}

{{/*
The workload's ServiceAccount: serviceAccount.name, else (created by the chart) the
workload's name. Without create, a name is required (values.schema.json).
*/}}
{{- define "kleym.serviceAccountName" -}}
{{- default (include "kleym.workloadName" .) .Values.serviceAccount.name }}
{{- end }}

{{/* `helm.sh/chart`: chart name and version. */}}
{{- define "kleym.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the workload's pods (immutable in a Deployment's selector). */}}
{{- define "kleym.selectorLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ include "kleym.component" . }}
{{- end }}

{{/* The standard labels of every object, without a component. */}}
{{- define "kleym.commonLabels" -}}
helm.sh/chart: {{ include "kleym.chart" . }}
app.kubernetes.io/name: {{ include "kleym.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The standard labels of the workload's objects (with its component). */}}
{{- define "kleym.labels" -}}
{{ include "kleym.commonLabels" . }}
app.kubernetes.io/component: {{ include "kleym.component" . }}
{{- end }}

{{/* The pod template's labels: podLabels, then the standard labels (which win). */}}
{{- define "kleym.podLabels" -}}
{{- $labels := mustMerge (include "kleym.labels" . | fromYaml) .Values.podLabels }}
{{- toYaml $labels }}
{{- end }}

{{/* The container image: `<repository>:<tag>`, the tag defaulting to the appVersion. */}}
{{- define "kleym.image" -}}
{{- $repo := required "image.repository is required: no kleym image is published; build it from the repository's Dockerfile, push it to your registry and set image.repository (docs/install.md, \"The image\")" .Values.image.repository }}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{/*
Pod-level scheduling and metadata fields shared by the hub and the spoke pods
(imagePullSecrets, priorityClassName, nodeSelector, affinity, tolerations,
topologySpreadConstraints; a constraint without a labelSelector gets one selecting this
workload's pods), at the pod spec's indentation.
*/}}
{{- define "kleym.podScheduling" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $affinity := .Values.affinity }}
{{- if and (not $affinity) (eq .Values.mode "fleet") (gt (int .Values.hub.replicas) 1) (eq .Values.hub.podAntiAffinity "preferred") }}
{{- /* Hub replicas on different nodes when they can be: losing a node costs one replica. */}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "kleym.selectorLabels" . | fromYaml)) }}
{{- $affinity = dict "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
topologySpreadConstraints:
{{- range . }}
{{- $constraint := . }}
{{- if not (hasKey . "labelSelector") }}
{{- $constraint = mustMerge (dict "labelSelector" (dict "matchLabels" (include "kleym.selectorLabels" $ | fromYaml))) . }}
{{- end }}
  - {{ toYaml $constraint | indent 4 | trim }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Fails the render when the health and metrics ports clash; takes a dict: `name` (`hub` or
`spoke`) and `values` (that section of the values).
*/}}
{{- define "kleym.checkPorts" -}}
{{- if eq (int .values.healthPort) (int .values.metricsPort) }}
{{- fail (printf "%s.healthPort must differ from %s.metricsPort (%d): the probes get a port of their own" .name .name (int .values.metricsPort)) }}
{{- end }}
{{- end }}

{{/*
Name of the issuer's X.509 CA Secret: issuer.x509.caSecret, else <issuer.keySecret>-x509-ca
(where `kleym hub --issuer-x509` puts it by default).
*/}}
{{- define "kleym.issuerCaSecret" -}}
{{- .Values.issuer.x509.caSecret | default (printf "%s-x509-ca" .Values.issuer.keySecret) -}}
{{- end }}
