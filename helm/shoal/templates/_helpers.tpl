{{/* Chart name, overridable. */}}
{{- define "shoal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: the release name, plus the chart name unless it is in it. */}}
{{- define "shoal.fullname" -}}
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

{{/* helm.sh/chart label value. */}}
{{- define "shoal.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "shoal.labels" -}}
helm.sh/chart: {{ include "shoal.chart" . }}
{{ include "shoal.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shoal
{{- end }}

{{/* Labels that identify the release (a prefix of every selector). */}}
{{- define "shoal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shoal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Server: labels and selector labels. */}}
{{- define "shoal.server.labels" -}}
{{ include "shoal.labels" . }}
app.kubernetes.io/component: server
{{- end }}

{{- define "shoal.server.selectorLabels" -}}
{{ include "shoal.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{/* Ingester: labels, optionally for one fleet. Call with (dict "root" $ "fleet" NAME), fleet may be "". */}}
{{- define "shoal.ingester.labels" -}}
{{ include "shoal.labels" .root }}
app.kubernetes.io/component: ingester
{{- with .fleet }}
shoal-fleet: {{ . }}
{{- end }}
{{- end }}

{{- define "shoal.ingester.selectorLabels" -}}
{{ include "shoal.selectorLabels" .root }}
app.kubernetes.io/component: ingester
{{- with .fleet }}
shoal-fleet: {{ . }}
{{- end }}
{{- end }}

{{/* Object names. */}}
{{- define "shoal.server.name" -}}
{{- printf "%s-server" (include "shoal.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shoal.server.serviceName" -}}
{{- default (include "shoal.fullname" .) .Values.server.service.name }}
{{- end }}

{{- define "shoal.server.xdsTlsSecret" -}}
{{- default (printf "%s-xds-tls" (include "shoal.server.name" .) | trunc 63 | trimSuffix "-") .Values.server.xds.tls.secretName }}
{{- end }}

{{- define "shoal.server.serviceAccountName" -}}
{{- default (include "shoal.server.name" .) .Values.server.serviceAccount.name }}
{{- end }}

{{- define "shoal.ingester.name" -}}
{{- printf "%s-ingester" (include "shoal.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name of one fleet's Deployment (and ConfigMap, PDB). Call with (dict "root" $ "fleet" NAME). */}}
{{- define "shoal.ingester.fleetName" -}}
{{- printf "%s-%s" (include "shoal.ingester.name" .root) .fleet | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shoal.ingester.serviceAccountName" -}}
{{- default (include "shoal.ingester.name" .) .Values.ingester.serviceAccount.name }}
{{- end }}

{{/* The ServiceAccount of fleets that serve only remote clusters: it may read the Secrets in the system namespace, nothing else. */}}
{{- define "shoal.ingester.remoteServiceAccountName" -}}
{{- printf "%s-remote" (include "shoal.ingester.serviceAccountName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Per-fleet settings with their defaults. Call with (dict "root" $ "f" FLEET_ENTRY); each returns "true" or "false". */}}
{{- define "shoal.ingester.localCluster" -}}
{{- ternary .f.localCluster .root.Values.ingester.localCluster (hasKey .f "localCluster") }}
{{- end }}

{{- define "shoal.ingester.watchConfig" -}}
{{- ternary .f.watchConfig .root.Values.ingester.watchConfig (hasKey .f "watchConfig") }}
{{- end }}

{{/* Unlabelled multicluster Secrets go to the fleet named "default" unless a fleet says otherwise. */}}
{{- define "shoal.ingester.unlabelledSecrets" -}}
{{- ternary .f.unlabelledSecrets (eq (.f.fleet | default .f.name) "default") (hasKey .f "unlabelledSecrets") }}
{{- end }}

{{/* Whether some fleet publishes / does not publish the local cluster: "true" or "". */}}
{{- define "shoal.ingester.anyLocal" -}}
{{- range .Values.ingesters }}
{{- if eq (include "shoal.ingester.localCluster" (dict "root" $ "f" .)) "true" }}true{{ end }}
{{- end }}
{{- end }}

{{- define "shoal.ingester.anyRemoteOnly" -}}
{{- range .Values.ingesters }}
{{- if ne (include "shoal.ingester.localCluster" (dict "root" $ "f" .)) "true" }}true{{ end }}
{{- end }}
{{- end }}

{{/* Cluster-scoped RBAC names carry the release namespace, so two releases never collide. */}}
{{- define "shoal.ingester.clusterRoleName" -}}
{{- printf "%s-%s" (include "shoal.ingester.name" .) .Release.Namespace }}
{{- end }}

{{/* The one image that ships both binaries. */}}
{{- define "shoal.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* NATS settings, as the SHOAL_* environment both binaries read. */}}
{{- define "shoal.nats.env" -}}
- name: SHOAL_NATS_URL
  value: {{ .Values.nats.url | quote }}
- name: SHOAL_NATS_REPLICAS
  value: {{ .Values.nats.replicas | quote }}
{{- if .Values.nats.credentialsSecret.name }}
- name: SHOAL_NATS_CREDS
  value: {{ printf "/etc/shoal/nats-creds/%s" .Values.nats.credentialsSecret.key | quote }}
{{- end }}
{{- end }}

{{/* Volumes every shoal pod has: a writable /tmp (the root filesystem is read-only) and the NATS secrets. */}}
{{- define "shoal.nats.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .Values.nats.credentialsSecret.name }}
- name: nats-creds
  secret:
    secretName: {{ .Values.nats.credentialsSecret.name }}
    defaultMode: 0440
    items:
      - key: {{ .Values.nats.credentialsSecret.key }}
        path: {{ .Values.nats.credentialsSecret.key }}
{{- end }}
{{- if .Values.nats.tls.enabled }}
- name: nats-tls
  secret:
    secretName: {{ required "nats.tls.secret is required when nats.tls.enabled" .Values.nats.tls.secret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.nats.tls.caKey }}
        path: ca.crt
      - key: {{ .Values.nats.tls.certKey }}
        path: tls.crt
      - key: {{ .Values.nats.tls.keyKey }}
        path: tls.key
{{- end }}
{{- end }}

{{- define "shoal.nats.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.nats.credentialsSecret.name }}
- name: nats-creds
  mountPath: /etc/shoal/nats-creds
  readOnly: true
{{- end }}
{{- if .Values.nats.tls.enabled }}
- name: nats-tls
  mountPath: {{ .Values.nats.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
Generated topologySpreadConstraints: zones, then nodes, ScheduleAnyway.
Call with (dict "cfg" TOPOLOGY_SPREAD_VALUES "labels" SELECTOR_LABELS_YAML).
*/}}
{{- define "shoal.topologySpread" -}}
{{- range $key := list "topology.kubernetes.io/zone" "kubernetes.io/hostname" }}
- maxSkew: {{ $.cfg.maxSkew }}
  topologyKey: {{ $key }}
  whenUnsatisfiable: {{ $.cfg.whenUnsatisfiable }}
  labelSelector:
    matchLabels:
      {{- $.labels | nindent 6 }}
  matchLabelKeys:
    - pod-template-hash
{{- end }}
{{- end }}

{{/* Checks the schema cannot express; fails the render with a clear message. */}}
{{- define "shoal.validate" -}}
{{- $names := dict }}
{{- $fleets := dict }}
{{- $configFleets := list }}
{{- $localFleets := list }}
{{- $unlabelledFleets := list }}
{{- range .Values.ingesters }}
{{- if hasKey $names .name }}
{{- fail (printf "ingesters: %q is listed twice" .name) }}
{{- end }}
{{- $_ := set $names .name true }}
{{- $fleet := .fleet | default .name }}
{{- if hasKey $fleets $fleet }}
{{- fail (printf "ingesters: two entries publish as fleet %q" $fleet) }}
{{- end }}
{{- $_ := set $fleets $fleet true }}
{{- $f := dict "root" $ "f" . }}
{{- $local := eq (include "shoal.ingester.localCluster" $f) "true" }}
{{- if eq (include "shoal.ingester.watchConfig" $f) "true" }}
{{- $configFleets = append $configFleets .name }}
{{- if not $local }}
{{- fail (printf "ingesters: fleet %q sets watchConfig but not localCluster: the Istio config is read from the local cluster" .name) }}
{{- end }}
{{- end }}
{{- if $local }}
{{- $localFleets = append $localFleets .name }}
{{- end }}
{{- if eq (include "shoal.ingester.unlabelledSecrets" $f) "true" }}
{{- $unlabelledFleets = append $unlabelledFleets .name }}
{{- end }}
{{- end }}
{{- if gt (len $configFleets) 1 }}
{{- fail (printf "ingesters: only one fleet may set watchConfig (the Istio config has one source), got %s" (join ", " $configFleets)) }}
{{- end }}
{{- if gt (len $localFleets) 1 }}
{{- fail (printf "ingesters: only one fleet may set localCluster (every fleet runs in this cluster, which would be published once per fleet), got %s; set localCluster: false on the others" (join ", " $localFleets)) }}
{{- end }}
{{- if gt (len $unlabelledFleets) 1 }}
{{- fail (printf "ingesters: only one fleet may take the multicluster Secrets without a shoal.io/fleet label (unlabelledSecrets), got %s" (join ", " $unlabelledFleets)) }}
{{- end }}
{{- if and .Values.nats.tls.enabled (not .Values.nats.tls.secret) }}
{{- fail "nats.tls.secret is required when nats.tls.enabled is true" }}
{{- end }}
{{- $a := .Values.server.autoscaling }}
{{- if and $a.enabled (gt (int $a.minReplicas) (int $a.maxReplicas)) }}
{{- fail "server.autoscaling.minReplicas must not exceed maxReplicas" }}
{{- end }}
{{- end }}
