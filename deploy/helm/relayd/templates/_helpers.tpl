{{/* Common labels. */}}
{{- define "relayd.labels" -}}
app.kubernetes.io/name: relayd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Pod selector. */}}
{{- define "relayd.selector" -}}
app.kubernetes.io/name: relayd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: relay
{{- end -}}

{{- define "relayd.name" -}}{{ .Release.Name }}{{- end -}}

{{/* The checkpoint ConfigMap's namespace and name (config.checkpoint). */}}
{{- define "relayd.checkpointNamespace" -}}
{{ (.Values.config.checkpoint | default dict).namespace | default .Release.Namespace }}
{{- end -}}
{{- define "relayd.checkpointName" -}}
{{ (.Values.config.checkpoint | default dict).name | default "relayd-checkpoint" }}
{{- end -}}

{{- define "relayd.sharding" -}}
{{- if (.Values.config.sharding | default dict).enabled }}true{{ end -}}
{{- end -}}

{{/*
The list+watch rules, one per distinct group/resource of the sources. A
source named by `resource:` gives its group and plural resource; one named
by apiVersion + kind needs rbac.resources.<source name>.
*/}}
{{- define "relayd.sourceRules" -}}
{{- $seen := dict -}}
{{- range .Values.config.sources -}}
{{- $group := "" -}}{{- $resource := "" -}}
{{- if .resource -}}
{{- $group = .resource.group | default "" -}}{{- $resource = .resource.resource -}}
{{- else -}}
{{- $parts := splitList "/" (.apiVersion | default "") -}}
{{- if eq (len $parts) 2 }}{{ $group = index $parts 0 }}{{ end -}}
{{- $resource = index ($.Values.rbac.resources | default dict) .name | default "" -}}
{{- if not $resource -}}
{{- fail (printf "source %q is named by apiVersion and kind: give rbac.resources.%s (its plural resource name, e.g. %s) so that the chart can grant list and watch on it" .name .name (lower (printf "%ss" (.kind | default "widget")))) -}}
{{- end -}}
{{- end -}}
{{- $key := printf "%s/%s" $group $resource -}}
{{- if not (hasKey $seen $key) }}
{{- $_ := set $seen $key true }}
- apiGroups: [{{ $group | quote }}]
  resources: [{{ $resource }}]
  verbs: [list, watch]
{{- end -}}
{{- end -}}
{{- end -}}
