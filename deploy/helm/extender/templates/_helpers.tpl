{{/* Labels of one component: name, part-of, and Helm's own unless turned off (kustomize rendering). */}}
{{- define "extender.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: extender
{{- if .root.Values.helmLabels }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end }}
{{- end }}

{{- define "extender.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/* The policy text: the value, else the chart's policy.yaml. */}}
{{- define "extender.policy" -}}
{{- if .Values.policy }}{{ .Values.policy }}{{ else }}{{ .Files.Get "policy.yaml" }}{{ end -}}
{{- end }}

{{/* Pod-level security of our own (non-root) pods. */}}
{{- define "extender.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
{{- end }}

{{/* Container-level security: nothing writable but mounted volumes, no capabilities. */}}
{{- define "extender.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end }}

{{- define "extender.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* REDIS_URL from the Secret extender-redis (both Redis modes): key url, or url-<user> with
redis.secret.keyPerComponent (each component its own Redis user: `extender inventory acl`).
Called with (dict "root" $ "user" "agent"). */}}
{{- define "extender.redisEnv" -}}
- name: REDIS_URL
  valueFrom:
    secretKeyRef: {name: extender-redis, key: {{ if .root.Values.redis.secret.keyPerComponent }}url-{{ .user }}{{ else }}url{{ end }}}
{{- end }}

{{/* The policy volume (a directory mount: a subPath mount would never see an edit). */}}
{{- define "extender.policyVolume" -}}
- name: policy
  configMap: {name: extender-policy}
{{- end }}
{{- define "extender.policyMount" -}}
- {name: policy, mountPath: /etc/extender, readOnly: true}
{{- end }}
