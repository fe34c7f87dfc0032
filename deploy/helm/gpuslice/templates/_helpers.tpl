{{/* The labels every object carries. */}}
{{- define "gpuslice.labels" -}}
app.kubernetes.io/part-of: gpuslice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The one image of the agent and the plugins. */}}
{{- define "gpuslice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The Kubernetes minor version the chart renders for. */}}
{{- define "gpuslice.kubeMinor" -}}
{{ .Capabilities.KubeVersion.Minor | trimSuffix "+" | int }}
{{- end }}

{{/* Where the plugins reach the daemon: the host's /run/gpuslice. */}}
{{- define "gpuslice.daemonVolume" -}}
- name: daemon
  hostPath:
    path: /run/gpuslice
    type: {{ if .Values.nodeAgent.enabled }}DirectoryOrCreate{{ else }}Directory{{ end }}
{{- end }}

{{/* The pod settings node components share. */}}
{{- define "gpuslice.nodePod" -}}
priorityClassName: system-node-critical
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A plugin's container: root for the kubelet's and the daemon's root-only sockets; nothing more. */}}
{{- define "gpuslice.pluginSecurity" -}}
securityContext:
  runAsUser: 0
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
resources:
  requests:
    cpu: 10m
    memory: 64Mi
  limits:
    memory: 256Mi
{{- end }}
