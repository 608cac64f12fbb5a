{{/* Common labels. */}}
{{- define "relayd.labels" -}}
app.kubernetes.io/name: relayd
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{/* Pod selector. */}}
{{- define "relayd.selector" -}}
app.kubernetes.io/name: relayd
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: relay
{{- end -}}

{{- define "relayd.name" -}}{{ .Release.Name }}{{- end -}}

{{- /*
relayd.clusterName: the name of the cluster-scoped objects (the ClusterRole
and its binding), relayd:<release namespace>:<release>. The prefix keeps it
off every built-in name (cluster-admin, admin, edit, view, system:*), which
a release named after one would otherwise take over with `helm template |
kubectl apply` or GitOps; the namespace keeps two releases of one name in
two namespaces apart. Neither a namespace nor a release name has a ":", so
no two releases share it.
*/}}
{{- define "relayd.clusterName" -}}{{ printf "relayd:%s:%s" .Release.Namespace .Release.Name }}{{- end -}}

{{/* The checkpoint ConfigMap's namespace and name (config.checkpoint). */}}
{{- define "relayd.checkpointNamespace" -}}
{{ (.Values.config.checkpoint | default dict).namespace | default .Release.Namespace }}
{{- end -}}
{{- /*
Named after the release, so that two releases in one namespace keep apart:
the checkpoint ConfigMap <release>-checkpoint, the Leases
<release>-<source>. relayd.config writes both into relayd's config.
*/}}
{{- define "relayd.checkpointName" -}}
{{ (.Values.config.checkpoint | default dict).name | default (printf "%s-checkpoint" (include "relayd.name" .)) }}
{{- end -}}
{{- /*
The checkpoint ConfigMaps, space-separated: <name>, <name>-1, … — one per
checkpoint.watchesPerConfigMap (default 500) watches, a watch being a
namespace of a source or a source without namespaces. relayd computes the
same (pkg/config Config.CheckpointShards, pkg/checkpoint ShardNames).
*/}}
{{- define "relayd.checkpointNames" -}}
{{- $per := int ((.Values.config.checkpoint | default dict).watchesPerConfigMap | default 500) -}}
{{- $watches := 0 -}}
{{- range .Values.config.sources }}{{ $watches = add $watches (max 1 (len (.namespaces | default list))) }}{{ end -}}
{{- $name := include "relayd.checkpointName" . -}}
{{- range $i := until (int (max 1 (div (add $watches (sub $per 1)) $per))) }}{{ if $i }} {{ printf "%s-%d" $name $i }}{{ else }}{{ $name }}{{ end }}{{ end -}}
{{- end -}}
{{- define "relayd.leasePrefix" -}}
{{ (.Values.config.sharding | default dict).leasePrefix | default (include "relayd.name" .) }}
{{- end -}}

{{/*
relayd.config: relayd's config file, the values' `config` with what the
chart names after the release filled in where it is not set:
checkpoint.name, and with sharding sharding.leasePrefix.
*/}}
{{- define "relayd.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $cp := $cfg.checkpoint | default dict -}}
{{- if not $cp.name }}{{ $_ := set $cp "name" (include "relayd.checkpointName" .) }}{{ end -}}
{{- $_ := set $cfg "checkpoint" $cp -}}
{{- if include "relayd.sharding" . -}}
{{- if not $cfg.sharding.leasePrefix }}{{ $_ := set $cfg.sharding "leasePrefix" (include "relayd.leasePrefix" .) }}{{ end -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
The ServiceAccount relayd runs as: serviceAccount.name, default the
release's name. Never the namespace's "default" ServiceAccount: every pod
of the namespace without one of its own runs as it, and would get relayd's
grants (list and watch on the sources' resources, Secrets included).
*/}}
{{- define "relayd.serviceAccountName" -}}
{{- $name := "" -}}
{{- if .Values.serviceAccount.create -}}
{{- $name = .Values.serviceAccount.name | default (include "relayd.name" .) -}}
{{- else -}}
{{- $name = required "serviceAccount.create is false: give serviceAccount.name, an existing ServiceAccount in the release's namespace (the RBAC the chart renders binds it)" .Values.serviceAccount.name -}}
{{- end -}}
{{- if eq $name "default" -}}
{{- if .Values.serviceAccount.name -}}
{{- fail "serviceAccount.name is \"default\": relayd would run as the namespace's default ServiceAccount, which every pod of the namespace without its own runs as, and the chart would bind relayd's grants (list and watch on the sources' resources, Secrets included) to it; leave serviceAccount.name empty (the chart creates one named after the release) or name a ServiceAccount of relayd's own" -}}
{{- else -}}
{{- fail "the release is named \"default\", and so would be its ServiceAccount: the namespace's default ServiceAccount, which every pod of the namespace without its own runs as, would get relayd's grants (list and watch on the sources' resources, Secrets included); set serviceAccount.name to a ServiceAccount of relayd's own, or name the release otherwise" -}}
{{- end -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- define "relayd.sharding" -}}
{{- if (.Values.config.sharding | default dict).enabled }}true{{ end -}}
{{- end -}}

{{/*
The patterns of values.schema.json's definitions, for the chart's own
checks of what it renders into RBAC: they hold also when the schema is
skipped (helm --skip-schema-validation). Go regexp: "$" is the end of the
text, so a trailing newline does not match.
*/}}
{{- define "relayd.dnsLabel" -}}^[a-z0-9]([-a-z0-9]*[a-z0-9])?${{- end -}}
{{- define "relayd.dnsSubdomain" -}}^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*${{- end -}}
{{- define "relayd.apiVersion" -}}^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?${{- end -}}

{{/*
relayd.mustMatch (list key value pattern what): fails naming the key
unless value is a string matching pattern. Every value the RBAC templates
render goes through it: a comma list, "*", a quote, a newline or YAML
would grant more than the sources need.
*/}}
{{- define "relayd.mustMatch" -}}
{{- $key := index . 0 -}}{{- $v := index . 1 -}}{{- $re := index . 2 -}}{{- $what := index . 3 -}}
{{- if not (and (kindIs "string" $v) (regexMatch $re $v)) -}}
{{- fail (printf "%s %s is not %s: the chart renders it into RBAC and refuses anything else (no \"*\", lists, quotes or newlines)" $key (toJson $v) $what) -}}
{{- end -}}
{{- end -}}

{{/*
relayd.rbacChecks: the names the RBAC templates render besides the
sources' (relayd.watchGrants checks those): the release's namespace, the
checkpoint ConfigMap's name and namespace, with sharding each Lease's name.
*/}}
{{- define "relayd.rbacChecks" -}}
{{- $label := include "relayd.dnsLabel" . -}}
{{- $subdomain := include "relayd.dnsSubdomain" . -}}
{{- include "relayd.mustMatch" (list "the release's namespace" .Release.Namespace $label "a namespace (a DNS label)") -}}
{{- include "relayd.mustMatch" (list "config.checkpoint.namespace" (include "relayd.checkpointNamespace" .) $label "a namespace (a DNS label)") -}}
{{- include "relayd.mustMatch" (list "config.checkpoint.name" (include "relayd.checkpointName" .) $subdomain "a ConfigMap name (a DNS subdomain)") -}}
{{- if include "relayd.sharding" . -}}
{{- include "relayd.mustMatch" (list "config.sharding.leasePrefix" (include "relayd.leasePrefix" .) $label "a Lease name prefix (a DNS label)") -}}
{{- end -}}
{{- range $i, $src := .Values.config.sources -}}
{{- include "relayd.mustMatch" (list (printf "config.sources[%d].name" $i) $src.name $label "a source name (a DNS label)") -}}
{{- end -}}
{{- end -}}

{{/*
relayd.watchGrants: where relayd needs list and watch, as JSON
{"cluster": ["<group>/<resource>", ...], "namespaces": {"<ns>": [...]}}.
A source without `namespaces:` (all namespaces, or a cluster-scoped kind)
needs them cluster-wide (the ClusterRole); a source with `namespaces:`
watches each of them on its own, and needs them only there (a Role in each).
A source named by `resource:` gives its group and plural resource; one named
by apiVersion + kind needs rbac.resources.<source name>. Each group,
resource and namespace is checked (relayd.mustMatch) before it is used.
*/}}
{{- define "relayd.watchGrants" -}}
{{- include "relayd.rbacChecks" . -}}
{{- $label := include "relayd.dnsLabel" . -}}
{{- $subdomain := include "relayd.dnsSubdomain" . -}}
{{- $rbacResources := (.Values.rbac | default dict).resources | default dict -}}
{{- $sources := dict -}}
{{- range .Values.config.sources -}}
{{- $_ := set $sources .name . -}}
{{- end -}}
{{- range $name, $_ := $rbacResources -}}
{{- $src := get $sources $name -}}
{{- if not $src -}}
{{- fail (printf "rbac.resources.%s: no source is named %q (config.sources: %s)" $name $name (keys $sources | sortAlpha | join ", ")) -}}
{{- else if $src.resource -}}
{{- fail (printf "rbac.resources.%s: source %q is named by resource:, which gives its plural resource already; remove the entry" $name $name) -}}
{{- end -}}
{{- end -}}
{{- $cluster := list -}}
{{- $namespaced := dict -}}
{{- range $i, $src := .Values.config.sources -}}
{{- $at := printf "config.sources[%d]" $i -}}
{{- $group := "" -}}{{- $resource := "" -}}
{{- if and .resource (or .apiVersion .kind) -}}
{{- fail (printf "source %q: name it either by resource: or by apiVersion + kind, not both" .name) -}}
{{- else if not (or .resource (and .apiVersion .kind)) -}}
{{- fail (printf "source %q: name its resource, by resource: {group, version, resource} or by apiVersion + kind" .name) -}}
{{- else if .resource -}}
{{- $group = .resource.group | default "" -}}{{- $resource = .resource.resource -}}
{{- if $group -}}
{{- include "relayd.mustMatch" (list (printf "%s.resource.group" $at) $group $subdomain "an API group (a DNS subdomain; \"\" for the core group)") -}}
{{- end -}}
{{- include "relayd.mustMatch" (list (printf "%s.resource.resource" $at) $resource $label "a plural resource name (a DNS label, as kubectl api-resources lists it)") -}}
{{- else -}}
{{- include "relayd.mustMatch" (list (printf "%s.apiVersion" $at) .apiVersion (include "relayd.apiVersion" $) "an apiVersion (<group>/<version>, or <version> for the core group)") -}}
{{- $parts := splitList "/" .apiVersion -}}
{{- if eq (len $parts) 2 }}{{ $group = index $parts 0 }}{{ end -}}
{{- $resource = get $rbacResources .name -}}
{{- if not $resource -}}
{{- fail (printf "source %q: give rbac.resources.%s (the plural resource name of kind %s in %s, as `kubectl api-resources` lists it) for a source named by apiVersion and kind, so that the chart can grant list and watch on it" .name .name (.kind | default "?") (.apiVersion | default "?")) -}}
{{- end -}}
{{- include "relayd.mustMatch" (list (printf "rbac.resources.%s" .name) $resource $label "a plural resource name (a DNS label, as kubectl api-resources lists it)") -}}
{{- end -}}
{{- $gr := printf "%s/%s" $group $resource -}}
{{- if .namespaces -}}
{{- range $j, $ns := .namespaces -}}
{{- include "relayd.mustMatch" (list (printf "%s.namespaces[%d]" $at $j) $ns $label "a namespace (a DNS label)") -}}
{{- $_ := set $namespaced $ns (append (get $namespaced $ns | default list) $gr | uniq) -}}
{{- end -}}
{{- else -}}
{{- $cluster = append $cluster $gr | uniq -}}
{{- end -}}
{{- end -}}
{{- dict "cluster" $cluster "namespaces" $namespaced | toJson -}}
{{- end -}}

{{/* relayd.watchRules: list+watch rules of a list of "<group>/<resource>", every value quoted. */}}
{{- define "relayd.watchRules" -}}
{{- range . }}
{{- $gr := splitList "/" . }}
- apiGroups: [{{ index $gr 0 | quote }}]
  resources: [{{ index $gr 1 | quote }}]
  verbs: [list, watch]
{{- end }}
{{- end -}}

{{/*
relayd.seconds: a Go duration ("20s", "1m30s", "500ms") in seconds, as a
float; "" for a value it cannot read (relayd check-config reports those).
*/}}
{{- define "relayd.seconds" -}}
{{- $d := toString . -}}
{{- if regexMatch "^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$" $d -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" $d -1 -}}
{{- $n := regexFind "^[0-9]+(\\.[0-9]+)?" . -}}
{{- $total = addf $total (mulf (float64 $n) (get $units (trimPrefix $n .))) -}}
{{- end -}}
{{- $total -}}
{{- else if eq $d "0" -}}0
{{- end -}}
{{- end -}}

{{/*
relayd.checks: what the chart can tell before relayd runs. Included by the
Deployment template.
*/}}
{{- define "relayd.checks" -}}
{{- if and (not (include "relayd.sharding" .)) (gt (int .Values.replicas) 1) -}}
{{- fail "replicas > 1 needs config.sharding.enabled: true (without sharding two replicas would relay the same sources)" -}}
{{- end -}}
{{- $drain := include "relayd.seconds" ((.Values.config.shutdown | default dict).drainTimeout | default "20s") -}}
{{- if and $drain (lt (float64 .Values.terminationGracePeriodSeconds) (addf (float64 $drain) 10)) -}}
{{- fail (printf "terminationGracePeriodSeconds %v is below config.shutdown.drainTimeout (%ss) + 10s: after draining relayd writes its final checkpoint and stops its HTTP servers; raise terminationGracePeriodSeconds" .Values.terminationGracePeriodSeconds $drain) -}}
{{- end -}}
{{- $podLabels := include "relayd.selector" . | fromYaml -}}
{{- range $k, $_ := .Values.podLabels -}}
{{- if hasKey $podLabels $k -}}
{{- fail (printf "podLabels.%s: the chart sets this label (the Deployment's selector); choose another key" $k) -}}
{{- end -}}
{{- end -}}
{{- if hasKey (.Values.podAnnotations | default dict) "checksum/config" -}}
{{- fail "podAnnotations.checksum/config: the chart sets this annotation (a config change rolls the pods)" -}}
{{- end -}}
{{- range $i, $e := .Values.extraEnv -}}
{{- if has $e.name (list "POD_NAMESPACE" "POD_NAME" "GOMEMLIMIT") -}}
{{- fail (printf "extraEnv[%d].name %s: the chart sets this variable (docs/DEPLOY.md, \"What the base sets\")" $i $e.name) -}}
{{- end -}}
{{- if hasPrefix "RELAYD_" (toString $e.name) -}}
{{- fail (printf "extraEnv[%d].name %s: RELAYD_* variables are relayd's own (test switches of test builds); the chart sets none and accepts none: configure relayd through config" $i $e.name) -}}
{{- end -}}
{{- end -}}
{{- range $i, $v := .Values.extraVolumes -}}
{{- if has $v.name (list "config" "nats") -}}
{{- fail (printf "extraVolumes[%d].name %s: the chart's own volume has this name; choose another" $i $v.name) -}}
{{- end -}}
{{- end -}}
{{- $nats := .Values.config.nats | default dict -}}
{{- $tls := $nats.tls | default dict -}}
{{- $files := dict "credentialsFile" $nats.credentialsFile "nkeySeedFile" $nats.nkeySeedFile "tokenFile" $nats.tokenFile "userFile" $nats.userFile "passwordFile" $nats.passwordFile "tls.caFile" $tls.caFile "tls.certFile" $tls.certFile "tls.keyFile" $tls.keyFile -}}
{{- range $key, $path := $files -}}
{{- if $path -}}
{{- if not $.Values.natsSecret.name -}}
{{- fail (printf "config.nats.%s is %q, but natsSecret.name is empty: the chart mounts NATS credentials and TLS files from that Secret only" $key $path) -}}
{{- end -}}
{{- if ne (dir $path) (trimSuffix "/" $.Values.natsSecret.mountPath) -}}
{{- fail (printf "config.nats.%s %q is not a file of the Secret %s mounted at natsSecret.mountPath %s" $key $path $.Values.natsSecret.name $.Values.natsSecret.mountPath) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
relayd.peer: a one-peer NetworkPolicy list from {namespaceSelector,
podSelector}, each left out when empty; "" when both are.
*/}}
{{- define "relayd.peer" -}}
{{- $peer := dict -}}
{{- if .namespaceSelector }}{{ $_ := set $peer "namespaceSelector" .namespaceSelector }}{{ end -}}
{{- if .podSelector }}{{ $_ := set $peer "podSelector" .podSelector }}{{ end -}}
{{- if $peer }}{{ list $peer | toYaml }}{{ end -}}
{{- end -}}

{{/* relayd.grNames: "<group>/<resource>"s as kubectl names them, "deployments.apps". */}}
{{- define "relayd.grNames" -}}
{{- $names := list -}}
{{- range . -}}
{{- $gr := splitList "/" . -}}
{{- $names = append $names (ternary (index $gr 1) (printf "%s.%s" (index $gr 1) (index $gr 0)) (eq (index $gr 0) "")) -}}
{{- end -}}
{{- join ", " $names -}}
{{- end -}}
