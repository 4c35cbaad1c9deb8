{{/* Names, labels and the pieces the worker and operator pods share. */}}

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

{{- define "agentrun.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "agentrun.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "agentrun.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentrun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of one component: pass (dict "ctx" $ "component" "worker"). */}}
{{- define "agentrun.componentSelectorLabels" -}}
{{ include "agentrun.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "agentrun.componentLabels" -}}
{{ include "agentrun.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "agentrun.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "agentrun.workerServiceAccountName" -}}
{{- if .Values.worker.serviceAccount.create }}
{{- default (printf "%s-worker" (include "agentrun.fullname" .)) .Values.worker.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.worker.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "agentrun.operatorServiceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "agentrun.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "agentrun.postgresqlName" -}}
{{ include "agentrun.fullname" . }}-postgresql
{{- end }}

{{- define "agentrun.apiTokenSecretName" -}}
{{- default (printf "%s-api-token" (include "agentrun.fullname" .)) .Values.apiToken.existingSecret }}
{{- end }}

{{/* The Secret and key holding the database URL: the bundled PostgreSQL's, or the one named in values. */}}
{{- define "agentrun.databaseSecretName" -}}
{{- if .Values.postgresql.enabled }}
{{- include "agentrun.postgresqlName" . }}
{{- else }}
{{- required "database.existingSecret must name a Secret holding the database URL (or set postgresql.enabled=true)" .Values.database.existingSecret }}
{{- end }}
{{- end }}

{{- define "agentrun.databaseSecretKey" -}}
{{- if .Values.postgresql.enabled }}url{{ else }}{{ .Values.database.secretKey }}{{ end }}
{{- end }}

{{/* Cross-field rules the values schema cannot express; evaluated by every template that includes it. */}}
{{- define "agentrun.validate" -}}
{{- if and .Values.autoscaling.keda.enabled .Values.autoscaling.hpa.enabled }}
{{- fail "autoscaling.keda.enabled and autoscaling.hpa.enabled are mutually exclusive: two autoscalers would fight over the worker replicas" }}
{{- end }}
{{- if and .Values.autoscaling.keda.enabled (gt (int .Values.autoscaling.keda.minReplicas) (int .Values.autoscaling.keda.maxReplicas)) }}
{{- fail "autoscaling.keda.minReplicas must not exceed autoscaling.keda.maxReplicas" }}
{{- end }}
{{- if and .Values.autoscaling.hpa.enabled (gt (int .Values.autoscaling.hpa.minReplicas) (int .Values.autoscaling.hpa.maxReplicas)) }}
{{- fail "autoscaling.hpa.minReplicas must not exceed autoscaling.hpa.maxReplicas" }}
{{- end }}
{{- end }}

{{/* Where secrets mounted as files are (`secrets.asFiles`): one file per variable, named after it. Not under
/var/run/secrets/agentrun, where the Vertex key is mounted. */}}
{{- define "agentrun.secretsDir" -}}
/etc/agentrun-secrets
{{- end }}

{{/* The database URL's secret variable: all the operator gets of the secrets. A YAML list of
{env, secret, key}, rendered by agentrun.secretEnv and agentrun.secretVolume. */}}
{{- define "agentrun.databaseSecrets" -}}
- {env: AGENTRUN_DATABASE_URL, secret: {{ include "agentrun.databaseSecretName" . | quote }}, key: {{ include "agentrun.databaseSecretKey" . | quote }}}
{{- end }}

{{/* The migrate init containers' URL: the owner role's when `database.migrationSecret` names one, else the
runtime URL. Workers and the operator never get the owner's: it has a volume of its own. */}}
{{- define "agentrun.migrationSecrets" -}}
{{- if .Values.database.migrationSecret }}
- {env: AGENTRUN_DATABASE_URL, secret: {{ .Values.database.migrationSecret | quote }}, key: {{ .Values.database.migrationSecretKey | quote }}}
{{- else }}
{{- include "agentrun.databaseSecrets" . }}
{{- end }}
{{- end }}

{{/* The worker's secret variables: the database URL, the model API keys, the /api bearer token and the
MCP servers' header variables. */}}
{{- define "agentrun.workerSecrets" -}}
{{ include "agentrun.databaseSecrets" . }}
{{- if .Values.anthropic.existingSecret }}
- {env: ANTHROPIC_API_KEY, secret: {{ .Values.anthropic.existingSecret | quote }}, key: {{ .Values.anthropic.secretKey | quote }}}
{{- end }}
{{- range .Values.providers.apiKeys }}
- {env: {{ .env | quote }}, secret: {{ .existingSecret | quote }}, key: {{ .secretKey | quote }}}
{{- end }}
{{- with .Values.providers.bedrock }}
{{- if .existingSecret }}
- {env: AWS_ACCESS_KEY_ID, secret: {{ .existingSecret | quote }}, key: {{ .accessKeyIdKey | quote }}}
- {env: AWS_SECRET_ACCESS_KEY, secret: {{ .existingSecret | quote }}, key: {{ .secretAccessKeyKey | quote }}}
{{- end }}
{{- end }}
{{- if .Values.apiToken.enabled }}
- {env: AGENTRUN_API_TOKEN, secret: {{ include "agentrun.apiTokenSecretName" . | quote }}, key: {{ .Values.apiToken.secretKey | quote }}}
{{- end }}
{{- range .Values.mcp.env }}
- {env: {{ .env | quote }}, secret: {{ .existingSecret | quote }}, key: {{ .secretKey | quote }}}
{{- end }}
{{- end }}

{{/* Env entries for a list of secret variables: (dict "ctx" $ "secrets" (include "agentrun.workerSecrets" $)
"volume" NAME). As files (`secrets.asFiles`), each is `<NAME>_FILE`, the path of its file in the volume
agentrun.secretVolume renders; else NAME from a secretKeyRef. */}}
{{- define "agentrun.secretEnv" -}}
{{- $dir := printf "%s/%s" (include "agentrun.secretsDir" .ctx) .volume }}
{{- range fromYamlArray .secrets }}
{{- if $.ctx.Values.secrets.asFiles }}
- name: {{ .env }}_FILE
  value: {{ printf "%s/%s" $dir .env | quote }}
{{- else }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- end }}

{{/* The projected volume of a list of secret variables when they are files, one file per variable:
(dict "ctx" $ "secrets" ... "volume" NAME). A directory mount, never a subPath, so rotations reach it. */}}
{{- define "agentrun.secretVolume" -}}
{{- if .ctx.Values.secrets.asFiles }}
- name: {{ .volume }}
  projected:
    defaultMode: 0440
    sources:
      {{- range fromYamlArray .secrets }}
      - secret:
          name: {{ .secret }}
          items:
            - key: {{ .key }}
              path: {{ .env }}
      {{- end }}
{{- end }}
{{- end }}

{{- define "agentrun.secretVolumeMount" -}}
{{- if .ctx.Values.secrets.asFiles }}
- name: {{ .volume }}
  mountPath: {{ printf "%s/%s" (include "agentrun.secretsDir" .ctx) .volume }}
  readOnly: true
{{- end }}
{{- end }}

{{/* `agentrun migrate` as an init container, as the owner role, for the worker and operator pods:
(dict "ctx" $ "resources" .Values.worker.resources). */}}
{{- define "agentrun.migrateInitContainer" -}}
{{- $resources := .resources }}
{{- with .ctx }}
- name: migrate
  image: {{ include "agentrun.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["migrate"]
  envFrom:
    - configMapRef:
        name: {{ include "agentrun.fullname" . }}-config
  env:
    {{- include "agentrun.secretEnv" (dict "ctx" . "secrets" (include "agentrun.migrationSecrets" .) "volume" "migration-secrets") | trim | nindent 4 }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  resources:
    {{- toYaml $resources | nindent 4 }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    {{- include "agentrun.secretVolumeMount" (dict "ctx" . "volume" "migration-secrets") | trim | nindent 4 }}
{{- end }}
{{- end }}

{{/* The Secret holding the API tokens file, or nothing when no identities are configured. */}}
{{- define "agentrun.apiTokensSecretName" -}}
{{- if .Values.apiTokens.existingSecret }}
{{- .Values.apiTokens.existingSecret }}
{{- else if .Values.apiTokens.identities }}
{{- printf "%s-api-tokens" (include "agentrun.fullname" .) }}
{{- end }}
{{- end }}

{{- define "agentrun.apiTokensDir" -}}
/etc/agentrun-tokens
{{- end }}

{{/* Checksums that roll the pods when their settings or generated secrets change. */}}
{{- define "agentrun.checksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if and .Values.apiToken.enabled (not .Values.apiToken.existingSecret) }}
checksum/api-token: {{ include (print .Template.BasePath "/secret-api-token.yaml") . | sha256sum }}
{{- end }}
{{- if .Values.postgresql.enabled }}
checksum/postgresql: {{ include (print .Template.BasePath "/postgresql-secret.yaml") . | sha256sum }}
{{- end }}
{{- end }}

{{/* Secret values generated once and kept across upgrades: (dict "ctx" $ "name" NAME "key" KEY "length" N). */}}
{{- define "agentrun.generatedSecret" -}}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .name }}
{{- if and $existing $existing.data (hasKey $existing.data .key) }}
{{- index $existing.data .key | b64dec }}
{{- else }}
{{- randAlphaNum (int .length) }}
{{- end }}
{{- end }}

{{/* A Deployment's pod template metadata: (dict "ctx" $ "component" NAME "values" .Values.NAME). */}}
{{- define "agentrun.podMetadata" -}}
labels:
  {{- include "agentrun.componentSelectorLabels" . | nindent 2 }}
  {{- with .values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  {{- include "agentrun.checksums" .ctx | nindent 2 }}
  {{- with .values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Where a component's pods may run, from its values (.Values.worker or .Values.operator). */}}
{{- define "agentrun.podPlacement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* `k1=v1,k2=v2` from a map, keys sorted: the shape of OTEL_RESOURCE_ATTRIBUTES and OTEL_EXPORTER_OTLP_HEADERS. */}}
{{- define "agentrun.keyValues" -}}
{{- $pairs := list -}}
{{- range $k, $v := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* Egress rules the worker and the operator share: DNS, and the database (the bundled PostgreSQL's pods, or
the external database's CIDRs and ports). */}}
{{- define "agentrun.networkPolicy.commonEgress" -}}
{{- $np := .Values.networkPolicy -}}
- ports:
    {{- range $np.egress.dnsPorts }}
    - {port: {{ . }}, protocol: UDP}
    - {port: {{ . }}, protocol: TCP}
    {{- end }}
{{- if .Values.postgresql.enabled }}
- to:
    - podSelector:
        matchLabels:
          {{- include "agentrun.componentSelectorLabels" (dict "ctx" . "component" "postgresql") | nindent 10 }}
  ports:
    - {port: 5432, protocol: TCP}
{{- else }}
{{ include "agentrun.networkPolicy.cidrEgress" $np.egress.database }}
{{- end }}
{{- end }}

{{/* An egress rule to CIDRs on TCP ports, from a `networkPolicy.egress.*` value ({cidrs, ports}). */}}
{{- define "agentrun.networkPolicy.cidrEgress" -}}
- to:
    {{- range .cidrs }}
    - ipBlock:
        cidr: {{ . | quote }}
    {{- end }}
  ports:
    {{- range .ports }}
    - {port: {{ . }}, protocol: TCP}
    {{- end }}
{{- end }}
