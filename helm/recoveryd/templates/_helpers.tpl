{{/*
Names, labels and the checks every template shares.
*/}}

{{/* The chart's name, cut to a DNS label. */}}
{{- define "recoveryd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: <release>-<name>, or the release name alone
when it already holds the name. Cut to 57 characters so that "<fullname>-admin" is still
a valid DNS label (a Service name may be at most 63).
*/}}
{{- define "recoveryd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 57 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 57 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 57 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The admin Service's name. */}}
{{- define "recoveryd.adminName" -}}
{{- printf "%s-admin" (include "recoveryd.fullname" .) }}
{{- end }}

{{/* The chart label: name-version, "+" (not allowed in label values) made "_". */}}
{{- define "recoveryd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "recoveryd.labels" -}}
helm.sh/chart: {{ include "recoveryd.chart" . }}
{{ include "recoveryd.selectorLabels" . }}
app.kubernetes.io/version: {{ include "recoveryd.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: recoveryd
{{- end }}

{{/* Labels that select the release's pods; never change them (a Deployment's selector is immutable). */}}
{{- define "recoveryd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "recoveryd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The ServiceAccount the pod runs as. */}}
{{- define "recoveryd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "recoveryd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image tag: image.tag, else the chart's appVersion. */}}
{{- define "recoveryd.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The image reference: repository:tag, or repository@digest when a digest pins it. */}}
{{- define "recoveryd.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "recoveryd.imageTag" .) }}
{{- end }}
{{- end }}

{{/* The Secret the container's secrets come from: the existing one, or the chart's. */}}
{{- define "recoveryd.secretName" -}}
{{- default (include "recoveryd.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{/* "true" with the PostgreSQL store (store.type postgres), empty with SQLite. */}}
{{- define "recoveryd.postgres" -}}
{{- if eq .Values.store.type "postgres" }}true{{ end }}
{{- end }}

{{/* The Secret holding the PostgreSQL URL: store.postgres.existingSecret, else the secrets' one. */}}
{{- define "recoveryd.storeSecretName" -}}
{{- default (include "recoveryd.secretName" .) .Values.store.postgres.existingSecret }}
{{- end }}

{{/* A host name of ingress.hosts or ingress.tls as a regular expression: `*` is one label. */}}
{{- define "recoveryd.hostPattern" -}}
{{- . | replace "." "\\." | replace "*" "[^./:]+" }}
{{- end }}

{{/*
The callback URLs the Ingress serves, one a line: https for a host that ingress.tls covers
(an entry without hosts covers every host), http for the others.
*/}}
{{- define "recoveryd.ingressUrls" -}}
{{- range $host := .Values.ingress.hosts }}
{{- $secured := false }}
{{- range $.Values.ingress.tls }}
{{- if not .hosts }}{{ $secured = true }}{{ end }}
{{- range .hosts }}
{{- if regexMatch (printf "^%s$" (include "recoveryd.hostPattern" .)) $host }}{{ $secured = true }}{{ end }}
{{- end }}
{{- end }}
{{ ternary "https" "http" $secured }}://{{ $host }}/callbacks
{{- end }}
{{- end }}

{{/*
"true" when config.publicUrl is a URL the Ingress serves (ingressUrls, a wildcard host
standing for any one label, the scheme's default port allowed), empty otherwise.
*/}}
{{- define "recoveryd.ingressServesPublicUrl" -}}
{{- $public := .Values.config.publicUrl }}
{{- range splitList "\n" (include "recoveryd.ingressUrls" . | trim) }}
{{- $scheme := splitList "://" . | first }}
{{- $host := splitList "/" (splitList "://" . | last) | first }}
{{- $port := ternary "443" "80" (eq $scheme "https") }}
{{- if regexMatch (printf "^%s://%s(:%s)?/callbacks$" $scheme (include "recoveryd.hostPattern" $host) $port) $public }}true{{ end }}
{{- end }}
{{- end }}

{{/* The rules file: the `rules` value, else the chart's record-only default. */}}
{{- define "recoveryd.rules" -}}
{{- .Values.rules | default (.Files.Get "files/default-rules.yaml") }}
{{- end }}

{{/* The PVC of the state volume: the existing one, or the chart's. */}}
{{- define "recoveryd.claimName" -}}
{{- default (printf "%s-state" (include "recoveryd.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{/*
Checks across values that values.schema.json cannot express; each failure says what to
change. Included by the Deployment, so that every render runs them.
*/}}
{{- define "recoveryd.validate" -}}
{{- $postgres := include "recoveryd.postgres" . }}
{{- if and (gt (int .Values.replicaCount) 1) (not $postgres) }}
{{- fail (printf "replicaCount: %d is refused: the SQLite store is one file that one pod may use; for several replicas use the PostgreSQL store: set store.type: postgres and give the database's URL from a Secret (store.postgres.existingSecret and store.postgres.key, or store.postgres.url)" (int .Values.replicaCount)) }}
{{- end }}
{{- if not .Values.config.serviceUrl }}
{{- fail "config.serviceUrl is required: the base URL of the service's API, e.g. https://qstash.upstash.io" }}
{{- end }}
{{- $s := .Values.secrets }}
{{- if $s.existingSecret }}
{{- range $key := list "token" "signingKeyCurrent" "signingKeyNext" "accountUsername" "accountPassword" "adminToken" "credentialsKey" }}
{{- if index $s $key }}
{{- fail (printf "secrets.%s is set together with secrets.existingSecret: put it in the Secret %q (key %q) instead, or leave existingSecret empty" $key $s.existingSecret (index $s.keys $key)) }}
{{- end }}
{{- end }}
{{- else }}
{{- if not $s.token }}
{{- fail "secrets.token is required: the service's API token (or name a Secret holding it in secrets.existingSecret)" }}
{{- end }}
{{- if not $s.signingKeyCurrent }}
{{- fail "secrets.signingKeyCurrent is required: without a signing key anyone could forge callbacks (or name a Secret holding it in secrets.existingSecret)" }}
{{- end }}
{{- if and .Values.admin.requireToken (not $s.adminToken) }}
{{- fail "secrets.adminToken is required while admin.requireToken is true: the admin API (port 9090) can rotate the token and redrive work; generate one with `openssl rand -hex 32` (or set admin.requireToken: false to leave it open to what the NetworkPolicy admits)" }}
{{- end }}
{{- if and .Values.config.rotateSchedule (not (and $s.accountUsername $s.accountPassword)) }}
{{- fail "config.rotateSchedule needs secrets.accountUsername and secrets.accountPassword: the token reset authenticates with them" }}
{{- end }}
{{- end }}
{{- $pg := .Values.store.postgres }}
{{- if $postgres }}
{{- /* No value is ever printed: the URL holds a password, the key is a secret. */}}
{{- if $pg.url }}
{{- if not (regexMatch `^postgres(ql)?://\S+$` $pg.url) }}
{{- fail "store.postgres.url is not a PostgreSQL URL: it must read postgresql://USER:PASSWORD@HOST:5432/DATABASE (or postgres://...), with no spaces" }}
{{- end }}
{{- if $pg.existingSecret }}
{{- fail (printf "store.postgres.url is set together with store.postgres.existingSecret: put the URL in the Secret %q (key %q) instead, or leave existingSecret empty" $pg.existingSecret $pg.key) }}
{{- end }}
{{- if $s.existingSecret }}
{{- fail (printf "store.postgres.url is set together with secrets.existingSecret: put the URL in the Secret %q (key %q) instead, or name the Secret that holds it in store.postgres.existingSecret" $s.existingSecret $pg.key) }}
{{- end }}
{{- else if not (or $pg.existingSecret $s.existingSecret) }}
{{- fail "store.type postgres needs the database's URL: name the Secret holding it in store.postgres.existingSecret (its key in store.postgres.key), or give it in store.postgres.url" }}
{{- end }}
{{- if and (not $pg.existingSecret) (has $pg.key (values $s.keys)) }}
{{- fail (printf "store.postgres.key %q is also the key of another secret in secrets.keys: the URL shares their Secret, so give it a key of its own" $pg.key) }}
{{- end }}
{{- /* One Fernet key, or several comma-separated (the first seals, all open: a key change). */}}
{{- if and $s.credentialsKey (not (regexMatch `^[-_+/A-Za-z0-9]{43}=( *, *[-_+/A-Za-z0-9]{43}=)*$` (trim $s.credentialsKey))) }}
{{- fail "secrets.credentialsKey is not a Fernet key, or several comma-separated (each 32 bytes in URL-safe base64, 44 characters); generate one with `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`" }}
{{- end }}
{{- if and .Values.config.rotateSchedule (not $s.existingSecret) (not $s.credentialsKey) }}
{{- fail "config.rotateSchedule with store.type postgres needs secrets.credentialsKey: the rotated token is kept in the store, sealed with this key, so that every replica reads it; generate one with `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`" }}
{{- end }}
{{- $zero := list "0" "0%" }}
{{- if and (has (toString .Values.rollingUpdate.maxSurge) $zero) (has (toString .Values.rollingUpdate.maxUnavailable) $zero) }}
{{- fail "rollingUpdate.maxSurge and rollingUpdate.maxUnavailable are both 0: a rollout could neither add a pod nor stop one; keep maxSurge: 1" }}
{{- end }}
{{- else }}
{{- if or $pg.url $pg.existingSecret }}
{{- fail "store.postgres.url and store.postgres.existingSecret are for the PostgreSQL store, but store.type is sqlite: set store.type: postgres to use it" }}
{{- end }}
{{- if $s.credentialsKey }}
{{- fail "secrets.credentialsKey is for store.type postgres only: with SQLite the rotated token is kept in the credentials file on the state volume" }}
{{- end }}
{{- if and .Values.config.rotateSchedule (not .Values.persistence.enabled) }}
{{- fail "config.rotateSchedule needs persistence.enabled: a rotated token is kept only in the credentials file on the state volume, and an emptyDir would lose it with the pod, locking the account out" }}
{{- end }}
{{- if and (or $s.accountUsername $s.accountPassword) (not .Values.persistence.enabled) }}
{{- fail "secrets.accountUsername and secrets.accountPassword need persistence.enabled: they let recoveryd rotate the token (`recoveryd rotate-token` too), and the rotated token is kept only in the credentials file on the state volume; an emptyDir would lose it with the pod, locking the account out" }}
{{- end }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) }}
{{- fail "ingress.hosts needs at least one host name when ingress.enabled is true" }}
{{- end }}
{{- end }}
