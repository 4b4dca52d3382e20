{{- define "parley.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "parley.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "parley.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "parley.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The settings every Parley process shares. */}}
{{- define "parley.env" -}}
- name: PARLEY_CLUSTER_REDIS
  value: {{ .Values.cluster.redis | quote }}
- name: PARLEY_CLUSTER_NATS
  value: {{ .Values.cluster.nats | quote }}
- name: PARLEY_CLUSTER_CASSANDRA_HOSTS
  value: {{ .Values.cluster.cassandraHosts | quote }}
- name: PARLEY_CLUSTER_KEYSPACE
  value: {{ .Values.cluster.keyspace | quote }}
- name: PARLEY_CLUSTER_REPLICATION_FACTOR
  value: {{ .Values.cluster.replicationFactor | quote }}
- name: PARLEY_CLUSTER_NAMESPACE
  value: {{ .Values.cluster.namespace | quote }}
- name: PARLEY_ATTACH_ENGINE
  value: s3
- name: PARLEY_ATTACH_S3_ENDPOINT
  value: {{ .Values.attach.s3.endpoint | quote }}
- name: PARLEY_ATTACH_S3_BUCKET
  value: {{ .Values.attach.s3.bucket | quote }}
- name: PARLEY_ATTACH_S3_REGION
  value: {{ .Values.attach.s3.region | quote }}
- name: PARLEY_ATTACH_S3_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.attach.s3.existingSecret }}
      key: access_key
- name: PARLEY_ATTACH_S3_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.attach.s3.existingSecret }}
      key: secret_key
{{- if eq .Values.auth.type "hs256" }}
- name: PARLEY_AUTH_HS256_KEY_FILE
  value: /etc/parley/token/hs256
{{- else }}
- name: PARLEY_AUTH_ED25519_PUBLIC_KEY_FILE
  value: /etc/parley/token/ed25519.pub
{{- end }}
- name: PARLEY_DATA_DIR
  value: /data
- name: PARLEY_LISTEN
  value: "0.0.0.0:7480"
{{- range $k, $v := .Values.env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}
