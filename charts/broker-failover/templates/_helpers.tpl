{{- define "broker-failover.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "broker-failover.labels" -}}
app.kubernetes.io/name: broker-failover
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "broker-failover.serviceAccountName" -}}
{{- default (include "broker-failover.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- /* A CronJob name may have 52 characters: its Jobs append 11. */ -}}
{{- define "broker-failover.validatorName" -}}
{{- printf "%s-validator" (include "broker-failover.fullname" . | trunc 42 | trimSuffix "-") -}}
{{- end -}}

{{- define "broker-failover.validatorServiceAccountName" -}}
{{- default (include "broker-failover.validatorName" .) .Values.validator.serviceAccount.name -}}
{{- end -}}

{{- define "broker-failover.validatorImage" -}}
{{- printf "%s:%s" .Values.validator.image.repository (.Values.validator.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- /* validator.sparkConf as VALIDATOR_SPARK_CONF: property=value pairs, comma separated, sorted. */ -}}
{{- define "broker-failover.sparkConf" -}}
{{- $pairs := list -}}
{{- range $key := keys . | sortAlpha -}}
{{- $pairs = append $pairs (printf "%s=%v" $key (index $ $key)) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{- /*
The kopf peering name of one operator shard: operator.peering, with "-shard-<i>" when there is more
than one shard (kopf peering elects one handler among replicas; each shard needs its own).
Called with (list $ shardIndex).
*/ -}}
{{- define "broker-failover.peering" -}}
{{- $root := index . 0 -}}
{{- $shard := index . 1 -}}
{{- $base := include "broker-failover.peeringBase" $root -}}
{{- if and $base (gt (int $root.Values.operator.shards) 1) -}}
{{ $base }}-shard-{{ $shard }}
{{- else -}}
{{ $base }}
{{- end -}}
{{- end }}

{{- /*
The kopf peering name before any shard suffix: operator.peering, or the release's full name when
that is empty; nothing with operator.standalone (no peering: the pre-issue-40 layout).
*/ -}}
{{- define "broker-failover.peeringBase" -}}
{{- if not .Values.operator.standalone -}}
{{ .Values.operator.peering | default (include "broker-failover.fullname" .) }}
{{- end -}}
{{- end }}

{{- /*
The namespaces the operator watches, as a JSON list (use with fromJsonArray): empty when
operator.clusterWide (every namespace); otherwise operator.watchNamespaces, or the release
namespace alone when that is empty. The narrow install is the default (charts/README.md,
"Permissions"): the operator's writes then reach the namespaces it was given and no other.
*/ -}}
{{- define "broker-failover.watchNamespaces" -}}
{{- if .Values.operator.clusterWide -}}
{{- if .Values.operator.watchNamespaces -}}
{{- fail "operator.clusterWide watches every namespace: leave operator.watchNamespaces empty, or set clusterWide=false to watch only those" -}}
{{- end -}}
[]
{{- else -}}
{{- default (list .Release.Namespace) .Values.operator.watchNamespaces | toJson -}}
{{- end -}}
{{- end -}}
