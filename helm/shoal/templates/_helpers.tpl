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

{{- /* Whether the TLS xDS port serves a certificate from a Secret (server.xds.tls.secretName,
or one the chart generates when there is no workload CA). Otherwise the servers issue it
from the workload CA for shoal.server.xdsDnsNames, and proxies verify it with the mesh root
(istio-ca-root-cert), as istiod's own certificate. */ -}}
{{- define "shoal.server.xdsTlsFromSecret" -}}
{{- if or .Values.server.xds.tls.secretName (not .Values.ca.enabled) }}true{{- end }}
{{- end }}

{{- /* The names proxies dial the TLS xDS port by: the Service's, then
server.xds.tls.extraDnsNames. */ -}}
{{- define "shoal.server.xdsDnsNames" -}}
{{- $svc := include "shoal.server.serviceName" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- concat $names .Values.server.xds.tls.extraDnsNames | uniq | join "," }}
{{- end }}

{{- define "shoal.server.xdsTlsSecret" -}}
{{- default (printf "%s-xds-tls" (include "shoal.server.name" .) | trunc 63 | trimSuffix "-") .Values.server.xds.tls.secretName }}
{{- end }}

{{- /* The workload CA's Secret (Istio's cacerts layout) the pods mount: the plugged-in CA
ca.secretName when it exists in the release namespace (lookup; ca.secretExists says so
where lookup sees no cluster), else the one the chart generates. */ -}}
{{- define "shoal.ca.generatedSecret" -}}
{{- printf "%s-ca" (include "shoal.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shoal.ca.plugged" -}}
{{- if or .Values.ca.secretExists (lookup "v1" "Secret" .Release.Namespace .Values.ca.secretName) }}true{{- end }}
{{- end }}

{{- define "shoal.ca.secret" -}}
{{- if include "shoal.ca.plugged" . }}{{ .Values.ca.secretName }}{{- else }}{{ include "shoal.ca.generatedSecret" . }}{{- end }}
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

{{- /* Whether a set of NATS values (nats, nats.server or nats.ingester) names an
authentication method: "true" or "". */ -}}
{{- define "shoal.nats.hasAuth" -}}
{{- if or .credentialsSecret.name .nkeySecret.name .userPassword.secret .tokenSecret.name }}true{{- end }}
{{- end }}

{{- /* The NATS settings one component connects with, as JSON. Call with (dict "root" $
"component" "server"|"ingester"). The component's own authentication (nats.<component>),
when it names a method, replaces the shared one (nats.*) whole, never merged with it, so a
pod never holds two identities; likewise nats.<component>.tls.secret replaces
nats.tls.secret (with its own caKey, certKey, keyKey). tls.enabled and tls.mountPath stay
shared. Fields: credentialsSecret, nkeySecret, userPassword, tokenSecret (as in values),
tls (enabled, secret, caKey, certKey, keyKey, mountPath), ownAuth (bool). */ -}}
{{- define "shoal.nats.component" -}}
{{- $n := .root.Values.nats }}
{{- $own := index $n .component }}
{{- $ownAuth := include "shoal.nats.hasAuth" $own }}
{{- $auth := ternary $own $n (ne $ownAuth "") }}
{{- $tls := pick $n.tls "enabled" "secret" "caKey" "certKey" "keyKey" "mountPath" }}
{{- if $own.tls.secret }}
{{- $tls = merge (pick $own.tls "secret" "caKey" "certKey" "keyKey") (pick $n.tls "enabled" "mountPath") }}
{{- end }}
{{- dict "credentialsSecret" $auth.credentialsSecret "nkeySecret" $auth.nkeySecret "userPassword" $auth.userPassword "tokenSecret" $auth.tokenSecret "tls" $tls "ownAuth" (ne $ownAuth "") | toJson }}
{{- end }}

{{/* NATS settings of one component, as the SHOAL_* environment both binaries read. Secrets
are files. Call with (dict "root" $ "component" "server"|"ingester"). */}}
{{- define "shoal.nats.env" -}}
{{- $n := fromJson (include "shoal.nats.component" .) }}
- name: SHOAL_NATS_URL
  value: {{ .root.Values.nats.url | quote }}
- name: SHOAL_NATS_REPLICAS
  value: {{ .root.Values.nats.replicas | quote }}
{{- if $n.credentialsSecret.name }}
- name: SHOAL_NATS_CREDS
  value: {{ printf "/etc/shoal/nats-creds/%s" $n.credentialsSecret.key | quote }}
{{- end }}
{{- if $n.nkeySecret.name }}
- name: SHOAL_NATS_NKEY
  value: {{ printf "/etc/shoal/nats-nkey/%s" $n.nkeySecret.key | quote }}
{{- end }}
{{- if $n.userPassword.secret }}
- name: SHOAL_NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ $n.userPassword.secret }}
      key: {{ $n.userPassword.userKey }}
- name: SHOAL_NATS_PASSWORD_FILE
  value: {{ printf "/etc/shoal/nats-password/%s" $n.userPassword.passwordKey | quote }}
{{- end }}
{{- if $n.tokenSecret.name }}
- name: SHOAL_NATS_TOKEN_FILE
  value: {{ printf "/etc/shoal/nats-token/%s" $n.tokenSecret.key | quote }}
{{- end }}
{{- if $n.tls.enabled }}
- name: SHOAL_NATS_TLS_REQUIRED
  value: "true"
{{- if and $n.tls.secret $n.tls.caKey }}
- name: SHOAL_NATS_TLS_CA
  value: {{ printf "%s/%s" $n.tls.mountPath $n.tls.caKey | quote }}
{{- end }}
{{- if and $n.tls.secret $n.tls.certKey }}
- name: SHOAL_NATS_TLS_CERT
  value: {{ printf "%s/%s" $n.tls.mountPath $n.tls.certKey | quote }}
- name: SHOAL_NATS_TLS_KEY
  value: {{ printf "%s/%s" $n.tls.mountPath $n.tls.keyKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* One read-only Secret volume holding one key. Call with (dict "name" "secret" "key"). */}}
{{- define "shoal.secretVolume" -}}
- name: {{ .name }}
  secret:
    secretName: {{ .secret }}
    defaultMode: 0440
    items:
      - key: {{ .key }}
        path: {{ .key }}
{{- end }}

{{/* The Secret holding the gateway credential key file. */}}
{{- define "shoal.credentials.secretName" -}}
{{- default (printf "%s-credential-key" (include "shoal.fullname" .) | trunc 63 | trimSuffix "-") .Values.gateways.credentials.existingSecret }}
{{- end }}

{{/* The gateway credential key file (gateways.credentials.enabled), for ingesters and servers. */}}
{{- define "shoal.credentials.env" -}}
{{- if .Values.gateways.credentials.enabled }}
- name: SHOAL_CREDENTIAL_KEY_FILE
  value: /etc/shoal/credential-key/credential.key
{{- end }}
{{- end }}

{{- define "shoal.credentials.volumeMounts" -}}
{{- if .Values.gateways.credentials.enabled }}
- name: credential-key
  mountPath: /etc/shoal/credential-key
  readOnly: true
{{- end }}
{{- end }}

{{- define "shoal.credentials.volumes" -}}
{{- if .Values.gateways.credentials.enabled }}
{{ include "shoal.secretVolume" (dict "name" "credential-key" "secret" (include "shoal.credentials.secretName" .) "key" "credential.key") }}
{{- end }}
{{- end }}

{{/* Volumes every shoal pod has: a writable /tmp (the root filesystem is read-only) and the
NATS secrets of its component. Call with (dict "root" $ "component" "server"|"ingester"). */}}
{{- define "shoal.nats.volumes" -}}
{{- $n := fromJson (include "shoal.nats.component" .) }}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if $n.credentialsSecret.name }}
{{ include "shoal.secretVolume" (dict "name" "nats-creds" "secret" $n.credentialsSecret.name "key" $n.credentialsSecret.key) }}
{{- end }}
{{- if $n.nkeySecret.name }}
{{ include "shoal.secretVolume" (dict "name" "nats-nkey" "secret" $n.nkeySecret.name "key" $n.nkeySecret.key) }}
{{- end }}
{{- if $n.userPassword.secret }}
{{ include "shoal.secretVolume" (dict "name" "nats-password" "secret" $n.userPassword.secret "key" $n.userPassword.passwordKey) }}
{{- end }}
{{- if $n.tokenSecret.name }}
{{ include "shoal.secretVolume" (dict "name" "nats-token" "secret" $n.tokenSecret.name "key" $n.tokenSecret.key) }}
{{- end }}
{{- if and $n.tls.enabled $n.tls.secret }}
- name: nats-tls
  secret:
    secretName: {{ $n.tls.secret }}
    defaultMode: 0440
    items:
      {{- if $n.tls.caKey }}
      - key: {{ $n.tls.caKey }}
        path: {{ $n.tls.caKey }}
      {{- end }}
      {{- if $n.tls.certKey }}
      - key: {{ $n.tls.certKey }}
        path: {{ $n.tls.certKey }}
      - key: {{ $n.tls.keyKey }}
        path: {{ $n.tls.keyKey }}
      {{- end }}
{{- end }}
{{- end }}

{{- define "shoal.nats.volumeMounts" -}}
{{- $n := fromJson (include "shoal.nats.component" .) }}
- name: tmp
  mountPath: /tmp
{{- if $n.credentialsSecret.name }}
- name: nats-creds
  mountPath: /etc/shoal/nats-creds
  readOnly: true
{{- end }}
{{- if $n.nkeySecret.name }}
- name: nats-nkey
  mountPath: /etc/shoal/nats-nkey
  readOnly: true
{{- end }}
{{- if $n.userPassword.secret }}
- name: nats-password
  mountPath: /etc/shoal/nats-password
  readOnly: true
{{- end }}
{{- if $n.tokenSecret.name }}
- name: nats-token
  mountPath: /etc/shoal/nats-token
  readOnly: true
{{- end }}
{{- if and $n.tls.enabled $n.tls.secret }}
- name: nats-tls
  mountPath: {{ $n.tls.mountPath }}
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
{{- $n := .Values.nats }}
{{- /* At most one authentication method per set of credentials: the shared one and each
component's (a component's own replaces the shared one, so they never add up). */}}
{{- range $where, $v := dict "nats" $n "nats.server" $n.server "nats.ingester" $n.ingester }}
{{- $auth := list }}
{{- if $v.credentialsSecret.name }}{{ $auth = append $auth "credentialsSecret" }}{{ end }}
{{- if $v.nkeySecret.name }}{{ $auth = append $auth "nkeySecret" }}{{ end }}
{{- if $v.userPassword.secret }}{{ $auth = append $auth "userPassword" }}{{ end }}
{{- if $v.tokenSecret.name }}{{ $auth = append $auth "tokenSecret" }}{{ end }}
{{- if gt (len $auth) 1 }}
{{- fail (printf "%s: one authentication method at most, got %s" $where (join ", " $auth)) }}
{{- end }}
{{- end }}
{{- /* A Secret no pod would use is a mistake (a typo, or a split left half done). */}}
{{- if and (include "shoal.nats.hasAuth" $n) (include "shoal.nats.hasAuth" $n.server) (include "shoal.nats.hasAuth" $n.ingester) }}
{{- fail "nats: nats.server and nats.ingester both set their own authentication, so no pod uses the shared one (nats.credentialsSecret, nkeySecret, userPassword, tokenSecret); remove it" }}
{{- end }}
{{- if and $n.tls.secret $n.server.tls.secret $n.ingester.tls.secret }}
{{- fail "nats.tls.secret: nats.server.tls.secret and nats.ingester.tls.secret both replace it, so no pod uses it; remove it" }}
{{- end }}
{{- range $where, $t := dict "nats.tls" $n.tls "nats.server.tls" $n.server.tls "nats.ingester.tls" $n.ingester.tls }}
{{- if ne (empty $t.certKey) (empty $t.keyKey) }}
{{- fail (printf "%s: certKey and keyKey go together (a client certificate and its key); set both or neither" $where) }}
{{- end }}
{{- if and $t.secret (not $n.tls.enabled) }}
{{- fail (printf "%s.secret is set but nats.tls.enabled is false: enable TLS or remove the secret" $where) }}
{{- end }}
{{- if and $n.tls.enabled $t.secret (not $t.caKey) (not $t.certKey) }}
{{- fail (printf "%s: caKey and certKey are both empty, so nothing in %s.secret would be used" $where $where) }}
{{- end }}
{{- end }}
{{- $a := .Values.server.autoscaling }}
{{- if and $a.enabled (gt (int $a.minReplicas) (int $a.maxReplicas)) }}
{{- fail "server.autoscaling.minReplicas must not exceed maxReplicas" }}
{{- end }}
{{- end }}
