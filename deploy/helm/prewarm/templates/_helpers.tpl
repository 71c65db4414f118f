{{/* Names: <release>-prewarm-<component>, shortened to Kubernetes' 63 characters. */}}
{{- define "prewarm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prewarm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "prewarm.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "prewarm.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "prewarm.component" -}}
{{- printf "%s-%s" (include "prewarm.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prewarm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prewarm.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "prewarm.labels" -}}
{{ include "prewarm.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "prewarm.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{- define "prewarm.tokensSecret" -}}
{{- default (printf "%s-tokens" (include "prewarm.fullname" .)) .Values.tokens.existingSecret -}}
{{- end -}}

{{- define "prewarm.credentialsSecret" -}}
{{- default (printf "%s-credentials" (include "prewarm.fullname" .)) .Values.credentials.existingSecret -}}
{{- end -}}

{{/* The scheduler's in-process retrain: off exactly when the CronJob retrains (never both). */}}
{{- define "prewarm.schedulerRetrainCron" -}}
{{- if .Values.retrain.cronJob.enabled -}}{{- else -}}{{ .Values.retrain.schedule }}{{- end -}}
{{- end -}}

{{/*
Pod annotations that change when a setting, the catalog, the cluster or a chart-made Secret changes,
so `helm upgrade` restarts the pods: prewarm reads its settings once, at start-up.
*/}}
{{- define "prewarm.checksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmaps.yaml") . | sha256sum }}
checksum/secrets: {{ include (print .Template.BasePath "/secrets.yaml") . | sha256sum }}
{{- end -}}

{{/* PREWARM_CONFIG: the settings every component shares, from the config ConfigMap. */}}
{{- define "prewarm.configEnv" -}}
- name: PREWARM_CONFIG
  value: /etc/prewarm/config/config.yaml
{{- end -}}

{{/* A component's own settings (values: <component>.settings) as PREWARM_<KEY> variables. */}}
{{- define "prewarm.settingsEnv" -}}
{{- range $key, $value := . }}
- name: {{ printf "PREWARM_%s" (upper $key) }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- define "prewarm.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .key }}
      optional: true
{{- end -}}

{{/* Object-store credentials (boto3 reads AWS_*; MLflow's S3 artifacts too). */}}
{{- define "prewarm.s3Env" -}}
{{ include "prewarm.secretEnv" (dict "name" "AWS_ACCESS_KEY_ID" "secret" (include "prewarm.credentialsSecret" .) "key" "aws-access-key-id") }}
{{ include "prewarm.secretEnv" (dict "name" "AWS_SECRET_ACCESS_KEY" "secret" (include "prewarm.credentialsSecret" .) "key" "aws-secret-access-key") }}
{{- with .Values.objectStore.region }}
- name: AWS_DEFAULT_REGION
  value: {{ . | quote }}
{{- end }}
{{- with .Values.objectStore.mlflowS3EndpointUrl }}
- name: MLFLOW_S3_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "prewarm.databaseEnv" -}}
{{ include "prewarm.secretEnv" (dict "name" "PREWARM_DATABASE_URL" "secret" (include "prewarm.credentialsSecret" .) "key" "database-url") }}
{{- end -}}

{{/* Non-root, no privilege escalation, no capabilities, read-only root filesystem. */}}
{{- define "prewarm.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.uid }}
runAsGroup: {{ .Values.securityContext.uid }}
fsGroup: {{ .Values.securityContext.uid }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "prewarm.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Writable scratch: prewarm's data_dir (embedded state, never the demand store here) and /tmp. */}}
{{- define "prewarm.scratchVolumes" -}}
- name: data
  emptyDir: {}
- name: tmp
  emptyDir: {}
- name: config
  configMap:
    name: {{ include "prewarm.fullname" . }}-config
{{- end -}}

{{- define "prewarm.scratchMounts" -}}
- name: data
  mountPath: /var/lib/prewarm
- name: tmp
  mountPath: /tmp
- name: config
  mountPath: /etc/prewarm/config
  readOnly: true
{{- end -}}

{{/* Catalog and cluster ConfigMaps, mounted as directories (not subPath) so edits reach the pods. */}}
{{- define "prewarm.catalogVolume" -}}
- name: catalog
  configMap:
    name: {{ default (printf "%s-catalog" (include "prewarm.fullname" .)) .Values.catalog.existingConfigMap }}
{{- end -}}

{{- define "prewarm.clusterVolume" -}}
- name: cluster
  configMap:
    name: {{ default (printf "%s-cluster" (include "prewarm.fullname" .)) .Values.cluster.existingConfigMap }}
{{- end -}}

{{- define "prewarm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "prewarm.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Values checks: a combination that would install but not work stops the render, and says why. */}}
{{- define "prewarm.validate" -}}
{{- $partitions := int (default 12 .Values.settings.topic_requests_partitions) -}}
{{- if gt (int .Values.ingest.replicas) $partitions -}}
{{- fail (printf "ingest.replicas (%d) exceeds settings.topic_requests_partitions (%d): a consumer group member beyond the partition count gets no partition and sits idle" (int .Values.ingest.replicas) $partitions) -}}
{{- end -}}
{{- if and (gt (int .Values.scheduler.replicas) 1) (not .Values.credentials.existingSecret) (hasPrefix "sqlite" .Values.credentials.databaseUrl) -}}
{{- fail (printf "scheduler.replicas (%d) need a shared PostgreSQL database for their leader lease: credentials.databaseUrl is SQLite" (int .Values.scheduler.replicas)) -}}
{{- end -}}
{{- if and (not .Values.credentials.existingSecret) (not .Values.credentials.databaseUrl) -}}
{{- fail "credentials.databaseUrl (or credentials.existingSecret) is required: every component but the executor uses the demand store" -}}
{{- end -}}
{{- if and .Values.retrain.cronJob.enabled (not .Values.settings.mlflow_tracking_uri) -}}
{{- fail "retrain.cronJob needs settings.mlflow_tracking_uri: the scheduler learns of a new champion through the MLflow registry" -}}
{{- end -}}
{{- if not (has .Values.executor.gpu.mode (list "shared" "request")) -}}
{{- fail (printf "executor.gpu.mode must be shared or request, not %q" .Values.executor.gpu.mode) -}}
{{- end -}}
{{- /* Settings the chart sets itself, and the value that sets each: given again in a settings map, one
would silently lose to the other (environment beats the file; a second variable of one name, the first). */ -}}
{{- $managed := dict "retrain_cron" "retrain.schedule (the chart decides whether the scheduler or the CronJob retrains)" "api_port" "scheduler.port" "api_host" "the chart (0.0.0.0)" "replica_id" "the chart (the pod name)" "catalog" "catalog" "cluster" "cluster" "node_name" "the chart (the Kubernetes node name)" "cache_dir" "executor.l2.hostPath" "socket_dir" "executor.handoff.hostPath" "executor_api_host" "tokens.executorApiToken (the API leaves loopback with a token)" "executor_api_port" "executor.port" "ingest_metrics_host" "the chart (0.0.0.0)" "ingest_metrics_port" "ingest.metricsPort" "database_url" "credentials.databaseUrl" "hint_tokens" "tokens.hintTokens" "publishable_tokens" "tokens.publishableTokens" "read_tokens" "tokens.readTokens" "executor_api_token" "tokens.executorApiToken" -}}
{{- $maps := dict "settings" .Values.settings "scheduler.settings" .Values.scheduler.settings "ingest.settings" .Values.ingest.settings "retrain.cronJob.settings" .Values.retrain.cronJob.settings "executor.settings" .Values.executor.settings -}}
{{- range $where, $map := $maps -}}
{{- range $key, $by := $managed -}}
{{- if hasKey $map $key -}}
{{- fail (printf "%s.%s is set by the chart: use %s" $where $key $by) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
