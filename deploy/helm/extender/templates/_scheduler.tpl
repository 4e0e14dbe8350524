{{/* The extender's container, the same in both modes (hostNetwork Deployment or scheduler sidecar). */}}
{{- define "extender.serveContainer" -}}
{{- $tls := eq .Values.extender.listen "tls" -}}
{{- $port := int .Values.extender.port -}}
- name: extender
  image: {{ include "extender.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [extender]
  args:
    - serve
    - --policy=/etc/extender/policy.yaml
    {{- if $tls }}
    - --bind=0.0.0.0:{{ $port }}
    - --tls-cert=/var/run/extender-tls/tls.crt
    - --tls-key=/var/run/extender-tls/tls.key
    - --tls-client-ca=/var/run/extender-tls/ca.crt
    {{- else }}
    - --bind=127.0.0.1:{{ $port }}
    {{- end }}
    - --workers={{ .Values.extender.workers }}
    - --threads={{ .Values.extender.threads }}
    - --max-snapshot-age={{ .Values.extender.maxSnapshotAge }}
    - --request-budget={{ .Values.extender.requestBudget }}
    - --metrics-bind=0.0.0.0:{{ .Values.monitoring.ports.extender }}
  env:
    {{- include "extender.redisEnv" (dict "root" . "user" "extender") | nindent 4 }}
  ports:
    - {name: http, containerPort: {{ $port }}, protocol: TCP}
    - {name: metrics, containerPort: {{ .Values.monitoring.ports.extender }}, protocol: TCP}
  {{- if $tls }}
  # kubelet presents no client certificate, which mutual TLS refuses: the probes check the port only.
  livenessProbe:
    tcpSocket: {port: {{ $port }}}
    periodSeconds: 10
  readinessProbe:
    tcpSocket: {port: {{ $port }}}
    periodSeconds: 5
  {{- else }}
  livenessProbe:
    httpGet: {path: /healthz, port: {{ $port }}, host: 127.0.0.1}
    periodSeconds: 10
    failureThreshold: 3
  readinessProbe:
    # Ready once a snapshot is loaded, or once the startup grace is over (then it answers neutrally:
    # still a better service to the scheduler than a refused connection).
    httpGet: {path: /readyz, port: {{ $port }}, host: 127.0.0.1}
    periodSeconds: 5
  {{- end }}
  resources:
    {{- toYaml .Values.extender.resources | nindent 4 }}
  {{- include "extender.containerSecurity" . | nindent 2 }}
  volumeMounts:
    {{- include "extender.policyMount" . | nindent 4 }}
    - {name: extender-tmp, mountPath: /tmp}          # prometheus_client's multiprocess files
    {{- if $tls }}
    - {name: extender-tls, mountPath: /var/run/extender-tls, readOnly: true}
    {{- end }}
{{- end }}

{{- define "extender.serveVolumes" -}}
{{ include "extender.policyVolume" . }}
- name: extender-tmp
  emptyDir: {medium: Memory, sizeLimit: 64Mi}
{{- if eq .Values.extender.listen "tls" }}
- name: extender-tls
  secret: {secretName: {{ .Values.extender.tls.secretName }}}
{{- end }}
{{- end }}

{{/* The KubeSchedulerConfiguration that calls the extender (docs/kubernetes-interfaces.md 3). */}}
{{- define "extender.schedulerConfig" -}}
{{- $second := eq .Values.mode "second-scheduler" -}}
{{- $tls := eq .Values.extender.listen "tls" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {{ if $second }}""{{ else }}{{ .Values.scheduler.kubeconfig }}{{ end }}
{{- if $second }}
leaderElection:
  leaderElect: true
  resourceName: {{ .Values.scheduler.schedulerName }}
  resourceNamespace: {{ .Release.Namespace }}
{{- end }}
# The scheduler stops looking after this share of feasible nodes and the extender sees only those;
# 0 is adaptive (50% - nodes/125, at least 5%). 100 only when a profile enables hard filter rules.
percentageOfNodesToScore: {{ .Values.scheduler.percentageOfNodesToScore }}
profiles:
  - schedulerName: {{ if $second }}{{ .Values.scheduler.schedulerName }}{{ else }}default-scheduler{{ end }}
extenders:
  # The extender on the same node (self-managed: host network) or in the same pod (second-scheduler).
  - urlPrefix: "{{ if $tls }}https{{ else }}http{{ end }}://127.0.0.1:{{ .Values.extender.port }}"
    filterVerb: filter
    prioritizeVerb: prioritize
    # added to the in-tree total as score x weight x 10 (docs/extender.md)
    weight: {{ .Values.scheduler.weight }}
    # names only: full Node objects are tens of KB each (status.images)
    nodeCacheCapable: true
    # errors and timeouts skip the extender instead of failing the pod
    ignorable: true
    httpTimeout: {{ .Values.scheduler.httpTimeout }}
    # only pods asking for GPUs are sent; everything else is scheduled without a round trip
    managedResources:
      - name: {{ .Values.scheduler.gpuResource }}
        ignoredByScheduler: false
    enableHTTPS: {{ $tls }}
    {{- if $tls }}
    tlsConfig:
      serverName: {{ .Values.extender.tls.serverName }}
      caFile: {{ .Values.extender.tls.schedulerCertDir }}/ca.crt
      certFile: {{ .Values.extender.tls.schedulerCertDir }}/client.crt
      keyFile: {{ .Values.extender.tls.schedulerCertDir }}/client.key
    {{- end }}
{{- end }}
