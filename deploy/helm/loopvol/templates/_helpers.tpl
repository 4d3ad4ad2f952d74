{{/*
Helm's own labels. Every object gets them beside the labels the kustomize
base gives it; hack/helm's equality test allows them and nothing else as
additions.
*/}}
{{- define "loopvol.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- with .Chart.AppVersion }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
{{- end }}

{{/*
What deploy/kubernetes/base's `labels:` gives every object of the base, and
Helm's labels. The objects of the components (fencing, snapshots) get only
Helm's, as kustomize gives them none.
*/}}
{{- define "loopvol.labels" -}}
app.kubernetes.io/name: loopvol
app.kubernetes.io/part-of: loopvol
{{ include "loopvol.helmLabels" . }}
{{- end }}

{{/*
The ServiceAccount that holds the controller side's RBAC: the node pods'
in deploy: distributed, where the controller side runs in the DaemonSet.
*/}}
{{- define "loopvol.controllerServiceAccount" -}}
{{- if eq .Values.deployment "distributed" }}loopvol-node{{ else }}loopvol-controller{{ end }}
{{- end }}

{{/*
"true" when the webhook is served: its configuration and Service point at
the controller StatefulSet's sidecar, which deploy: distributed does not
have.
*/}}
{{- define "loopvol.webhookEnabled" -}}
{{- and .Values.webhook.enabled (ne .Values.deployment "distributed") }}
{{- end }}

{{/* An image reference of images.<x>. */}}
{{- define "loopvol.image" -}}
{{ printf "%s:%s" .repository (toString .tag) }}
{{- end }}

{{/* imagePullPolicy of images.<x>, or nothing (the cluster's default). */}}
{{- define "loopvol.pullPolicy" -}}
{{- with .pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/*
The API server on loopback, for the containers that call it on a cluster
without kube-proxy (overlays/local): the same containers overlays/local
gives it to.
*/}}
{{- define "loopvol.apiServerEnv" -}}
{{- with .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ $.Values.apiServer.port | toString | quote }}
{{- end }}
{{- end }}

{{/* The driver's --pool flags: each pool at the same path in every pod. */}}
{{- define "loopvol.poolArgs" -}}
{{- range .Values.pools }}
- --pool={{ .name }}=/var/lib/loopvol/pools/{{ .name }}
{{- end }}
{{- end }}

{{- define "loopvol.poolMounts" -}}
{{- range .Values.pools }}
- {name: pool-{{ .name }}, mountPath: /var/lib/loopvol/pools/{{ .name }}}
{{- end }}
{{- end }}

{{- define "loopvol.poolVolumes" -}}
{{- range .Values.pools }}
- name: pool-{{ .name }}
  {{- if .nfs }}
  nfs:
    server: {{ .nfs.server }}
    path: {{ .nfs.path }}
  {{- else }}
  hostPath:
    path: {{ .hostPath }}
    type: DirectoryOrCreate
  {{- end }}
{{- end }}
{{- end }}

{{/* --v= of every container. */}}
{{- define "loopvol.v" -}}
--v={{ .Values.logVerbosity }}
{{- end }}

{{/*
What the schema cannot say: combinations of values that would install
something that does not work.
*/}}
{{- define "loopvol.validate" -}}
{{- $d := .Values.deployment }}
{{- if and .Values.fencing.enabled (ne $d "shared") }}
{{- fail "fencing.enabled needs deployment: shared: fencing is for pools every node sees; local pools are never fenced (docs/fencing.md)" }}
{{- end }}
{{- if and .Values.snapshots.enabled (eq $d "distributed") }}
{{- fail "snapshots.enabled: the snapshotter runs beside the controller StatefulSet, which deploy: distributed does not have" }}
{{- end }}
{{- if ne (empty .Values.apiServer.host) (empty .Values.apiServer.port) }}
{{- fail "apiServer: set both host and port, or neither" }}
{{- end }}
{{- $pools := list }}
{{- range .Values.pools }}
{{- if has .name $pools }}
{{- fail (printf "pools: %q is listed twice" .name) }}
{{- end }}
{{- if and .nfs (eq $d "distributed") }}
{{- fail (printf "pools: %q is an NFS export, but in deploy: distributed each node is its own zone and its pools its own: every node would count the same space as its own" .name) }}
{{- end }}
{{- $pools = append $pools .name }}
{{- end }}
{{- range .Values.storageClasses }}
{{- if not (has .pool $pools) }}
{{- fail (printf "storageClasses: %q names pool %q, which is not in pools" .name .pool) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The PrometheusRule's labels: Helm's, and those a Prometheus Operator's
ruleSelector looks for.
*/}}
{{- define "loopvol.prometheusRuleLabels" -}}
{{ include "loopvol.helmLabels" . }}
{{- with .Values.monitoring.prometheusRule.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The PodMonitors' labels: Helm's, and those a Prometheus Operator's
podMonitorSelector looks for.
*/}}
{{- define "loopvol.podMonitorLabels" -}}
{{ include "loopvol.helmLabels" . }}
{{- with .Values.monitoring.podMonitors.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}
