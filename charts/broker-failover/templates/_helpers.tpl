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

{{- /*
One image of ours as the reference a pod names. Called with (list $ <repository, tag, digest>).
A repository whose first part is a registry host (it has a "." or a ":", or is "localhost", as
containerd and Docker read a name) is used as written, so the full names earlier versions took
(localhost/broker-failover/operator) keep working; any other goes under image.registry. A digest
pins the image; a tag given beside it is kept only as a label for people.
*/ -}}
{{- define "broker-failover.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- $repository := $image.repository -}}
{{- $first := first (splitList "/" $repository) -}}
{{- $hasRegistry := and (contains "/" $repository) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- if not $hasRegistry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" $root.Values.image.registry) $repository -}}
{{- end -}}
{{- if $image.digest -}}
{{- if $image.tag -}}
{{- printf "%s:%s@%s" $repository $image.tag $image.digest -}}
{{- else -}}
{{- printf "%s@%s" $repository $image.digest -}}
{{- end -}}
{{- else -}}
{{- printf "%s:%s" $repository ($image.tag | default $root.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "broker-failover.operatorImage" -}}
{{- include "broker-failover.image" (list . .Values.operator.image) -}}
{{- end -}}

{{- define "broker-failover.validatorImage" -}}
{{- include "broker-failover.image" (list . .Values.validator.image) -}}
{{- end -}}

{{- /*
The image of broker pods whose BrokerCluster names none (OPERATOR_BROKER_IMAGE). With
operator.brokerImages set it must match one of those patterns (fnmatch, as the operator matches
them): otherwise every such BrokerCluster would get no pod, which the install says now.
*/ -}}
{{- define "broker-failover.defaultBrokerImage" -}}
{{- $image := include "broker-failover.image" (list . .Values.operator.defaultBrokerImage) -}}
{{- $patterns := .Values.operator.brokerImages -}}
{{- if $patterns -}}
{{- $admitted := false -}}
{{- range $pattern := $patterns -}}
{{- $regex := regexQuoteMeta $pattern | replace "\\*" ".*" | replace "\\?" "." | replace "\\[!" "[^" | replace "\\[" "[" | replace "\\]" "]" -}}
{{- if regexMatch (printf "^%s$" $regex) $image -}}
{{- $admitted = true -}}
{{- end -}}
{{- end -}}
{{- if not $admitted -}}
{{- fail (printf "operator.defaultBrokerImage (%s) matches none of operator.brokerImages (%s): every BrokerCluster without spec.image would get no pod; add a pattern for it or change the image" $image (join ", " $patterns)) -}}
{{- end -}}
{{- end -}}
{{- $image -}}
{{- end -}}

{{- /* imagePullSecrets (names, or {name: ...} entries) as a list of names. */ -}}
{{- define "broker-failover.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets -}}
{{- if kindIs "map" . -}}
{{- $names = append $names .name -}}
{{- else -}}
{{- $names = append $names . -}}
{{- end -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{- /*
A pod spec's imagePullSecrets, priorityClassName, nodeSelector, tolerations and affinity from a
component's values and the global ones; each line only when set. Called with
(list $ .Values.<component>); the operator renders its affinity itself (it has a default).
*/ -}}
{{- define "broker-failover.podPlacement" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- $secrets := include "broker-failover.pullSecretNames" $root | fromJsonArray -}}
{{- with $secrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . | quote }}
{{- end }}
{{- end }}
{{- with ($component.priorityClassName | default $root.Values.priorityClassName) }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $component.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $component.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /*
A pod template's metadata: the chart's own labels (given as a dict; Deployment selectors, PDBs and
the brokers' NetworkPolicy select on them, so podLabels may not redefine one), then podLabels and
podAnnotations, a component's over the global ones. Called with (list $ .Values.<component> $own).
*/ -}}
{{- define "broker-failover.podMetadata" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- $own := index . 2 -}}
{{- $extra := merge (dict) ($component.podLabels | default dict) ($root.Values.podLabels | default dict) -}}
{{- range $key := keys $extra | sortAlpha -}}
{{- if hasKey $own $key -}}
{{- fail (printf "podLabels: %s is one of the chart's own pod labels (selectors use them); choose another key" $key) -}}
{{- end -}}
{{- end }}
labels:
  {{- toYaml (merge (dict) $own $extra) | nindent 2 }}
{{- with (merge (dict) ($component.podAnnotations | default dict) ($root.Values.podAnnotations | default dict)) }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /* The logging variables every component of ours reads. */ -}}
{{- define "broker-failover.loggingEnv" -}}
- name: BROKER_FAILOVER_LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
- name: BROKER_FAILOVER_LOG_LEVEL
  value: {{ .Values.logging.level | quote }}
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
