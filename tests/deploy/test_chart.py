"""The Helm chart (helm/recoveryd), rendered and linted by Helm's own library (libhelm
through helm_python, in-process), every manifest checked against the Kubernetes schemas
with kubernetes-validate: no cluster, no helm binary."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from daemon.metrics import Metrics
from daemon.rules import parse_rules
from daemon.rules.shadow import ShadowRules
from daemon.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "recoveryd"
RELEASE = "rd"
NAMESPACE = "recoveryd"
FULLNAME = "rd-recoveryd"
# The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion) and the newest
# kubernetes-validate knows: every manifest must be valid for both.
KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.utils.latest_version())

# Distinctive secret values, to look for wherever they must not be.
SECRETS = {
    "token": "tok-5d41402abc4b2a76b9719d91",
    "signingKeyCurrent": "sig-current-7d793037a0760186",
    "signingKeyNext": "sig-next-0189d7fc5c2a4b1e",
    "accountUsername": "account-user-2b1e8c5f",
    "accountPassword": "account-pass-c4ca4238a0b9",
    "adminToken": "adm-a87ff679a2f3e71d9181",
}
# The variable each secret reaches the daemon as.
SECRET_VARIABLES = {
    "token": "RECOVERYD_TOKEN",
    "signingKeyCurrent": "RECOVERYD_SIGNING_KEY_CURRENT",
    "signingKeyNext": "RECOVERYD_SIGNING_KEY_NEXT",
    "accountUsername": "RECOVERYD_ACCOUNT_USERNAME",
    "accountPassword": "RECOVERYD_ACCOUNT_PASSWORD",
    "adminToken": "RECOVERYD_ADMIN_TOKEN",
}
# The key names values.yaml documents for secrets.existingSecret.
SECRET_KEYS = {
    "token": "token",
    "signingKeyCurrent": "signing-key-current",
    "signingKeyNext": "signing-key-next",
    "accountUsername": "account-username",
    "accountPassword": "account-password",
    "adminToken": "admin-token",
}
# The PostgreSQL store's URL, with a distinctive password, and the key that seals rotated
# credentials in it (a Fernet key: 32 bytes in URL-safe base64): secrets too.
STORE_PASSWORD = "pg-pass-e4da3b7fbbce2345"
STORE_URL = f"postgresql://recoveryd:{STORE_PASSWORD}@db.example.com:5432/recoveryd"
CREDENTIALS_KEY = base64.urlsafe_b64encode(b"recoveryd-chart-test-key-32bytes").decode()
POSTGRES_SECRETS = {"url": STORE_URL, "password": STORE_PASSWORD, "credentialsKey": CREDENTIALS_KEY}
CONFIG = {"serviceUrl": "https://qstash.upstash.io", "headerPrefix": "Upstash"}
# A candidate rules file for shadowRules: the repository's, its billing rule resuming.
SHADOW_RULES = (ROOT / "rules.yaml").read_text().replace("action: restart\n", "action: resume\n", 1)
# The least an install takes: the service's URL, its token, the signing key and the
# admin token (admin.requireToken is on by default).
REQUIRED: dict[str, Any] = {
    "config": CONFIG,
    "secrets": {k: SECRETS[k] for k in ("token", "signingKeyCurrent", "adminToken")},
}


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` merged in, mappings key by key (as Helm merges values)."""
    result = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": REQUIRED,
    # A candidate beside the live rules: the billing rule resuming instead of restarting.
    "shadow": merged(REQUIRED, {"shadowRules": SHADOW_RULES}),
    "all-settings": merged(
        REQUIRED,
        {
            "config": {
                "accountUrl": "https://qstash.upstash.io",
                "publicUrl": "https://recoveryd.example.com/callbacks",
                "rotateSchedule": "0 3 * * 0",
                "logFormat": "console",
                "dryRun": True,
                "fetch": "needed",
                "retention": "3d",
                "maxRps": 50,
                "maxRemovalsPerHour": 0,
            },
            "secrets": SECRETS,
            "extraEnv": [{"name": "RECOVERYD_ALLOW_UNSIGNED", "value": "false"}],
        },
    ),
    "existing-secret": {
        "config": CONFIG,
        "secrets": {"existingSecret": "recoveryd-credentials"},
    },
    "ingress": merged(
        REQUIRED,
        {
            "config": {"publicUrl": "https://recoveryd.example.com/callbacks"},
            "ingress": {
                "enabled": True,
                "className": "nginx",
                "annotations": {"cert-manager.io/cluster-issuer": "letsencrypt"},
                "hosts": ["recoveryd.example.com"],
                "tls": [{"secretName": "recoveryd-tls", "hosts": ["recoveryd.example.com"]}],
            },
        },
    ),
    "monitoring": merged(
        REQUIRED,
        {
            "monitoring": {
                "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
                "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
                "dashboard": {"enabled": True, "annotations": {"grafana_folder": "Platform"}},
            }
        },
    ),
    "admin-open": {
        "config": CONFIG,
        "secrets": {k: SECRETS[k] for k in ("token", "signingKeyCurrent")},
        "admin": {"requireToken": False},
    },
    "persistence-off": merged(REQUIRED, {"persistence": {"enabled": False}}),
    "locked-down": merged(
        REQUIRED,
        {
            "persistence": {
                "existingClaim": "recoveryd-state",
                "accessModes": ["ReadWriteOncePod"],
            },
            "serviceAccount": {"create": False, "name": "recoveryd"},
            "networkPolicy": {
                "public": {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}
                            }
                        }
                    ]
                },
                "egress": {
                    "allowAll": False,
                    "to": [
                        {
                            "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}],
                            "ports": [{"port": 443, "protocol": "TCP"}],
                        }
                    ],
                },
            },
            "image": {"digest": "sha256:" + "ab" * 32},
        },
    ),
    # Several replicas on PostgreSQL, the URL and the credentials key in the chart's Secret,
    # with token rotation.
    "postgres": merged(
        REQUIRED,
        {
            "replicaCount": 3,
            "store": {"type": "postgres", "postgres": {"url": STORE_URL}},
            "config": {"rotateSchedule": "0 3 * * 0"},
            "secrets": {
                "accountUsername": SECRETS["accountUsername"],
                "accountPassword": SECRETS["accountPassword"],
                "credentialsKey": CREDENTIALS_KEY,
            },
        },
    ),
    # The same from Secrets of one's own: the URL in the database operator's (CloudNativePG's
    # `<cluster>-app`, key `uri`), the rest in secrets.existingSecret. persistence is
    # ignored with PostgreSQL.
    "postgres-existing-secret": {
        "replicaCount": 2,
        "config": {**CONFIG, "rotateSchedule": "24h"},
        "secrets": {"existingSecret": "recoveryd-credentials"},
        "store": {"type": "postgres", "postgres": {"existingSecret": "db-app", "key": "uri"}},
        "persistence": {"enabled": False},
    },
}

# Stand-ins for the monitoring files, used only while the chart lacks them.
STAND_IN_ALERTS = """\
groups:
  - name: recoveryd
    rules:
      - alert: RecoverydTokenLockout
        expr: max(recoveryd_token_lockout) == 1
        labels: {severity: critical}
        annotations:
          summary: "{{ $labels.pod }}: the service refuses the token in hand"
"""
STAND_IN_DASHBOARD = '{"title": "recoveryd", "uid": "recoveryd", "panels": []}\n'

Manifest = dict[str, Any]


@pytest.fixture(scope="module")
def chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart, with stand-ins for files/alerts.yaml and files/dashboard.json written
    into a copy while they are missing (they are written beside the chart's templates)."""
    missing = {
        name: text
        for name, text in (("alerts.yaml", STAND_IN_ALERTS), ("dashboard.json", STAND_IN_DASHBOARD))
        if not (CHART / "files" / name).is_file()
    }
    if not missing:
        return CHART
    copied = tmp_path_factory.mktemp("chart") / "recoveryd"
    shutil.copytree(CHART, copied)
    (copied / "files").mkdir(exist_ok=True)
    for name, text in missing.items():
        (copied / "files" / name).write_text(text)
    return copied


@pytest.fixture(scope="module")
def chart(chart_dir: Path) -> Iterator[helm.Chart]:
    with helm.Chart.load(chart_dir) as loaded:
        yield loaded


Render = Callable[[dict[str, Any]], list[Manifest]]


def manifests_of(rendered: dict[str, str]) -> list[Manifest]:
    """The objects of `helm template`'s output: every YAML document but NOTES.txt's."""
    return [
        doc
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


@pytest.fixture(scope="module")
def render(chart: helm.Chart) -> Render:
    """Render with Helm (schema checked, templates executed), cached by values."""
    cache: dict[str, list[Manifest]] = {}

    def rendered(values: dict[str, Any]) -> list[Manifest]:
        key = json.dumps(values, sort_keys=True)
        if key not in cache:
            output = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
            cache[key] = manifests_of(output)
        return copy.deepcopy(cache[key])

    return rendered


def only(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} rendered"
    return found[0]


def kinds(manifests: list[Manifest]) -> list[str]:
    return sorted(m["kind"] for m in manifests)


def container(manifests: list[Manifest]) -> dict[str, Any]:
    (main,) = only(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(main)


def env_of(manifests: list[Manifest]) -> dict[str, dict[str, Any]]:
    env = container(manifests)["env"]
    names = [item["name"] for item in env]
    assert len(names) == len(set(names)), f"a variable is set twice: {names}"
    return {item["name"]: item for item in env}


def error_of(call: Callable[[], object]) -> str:
    with pytest.raises(helm.HelmError) as caught:
        call()
    return str(caught.value)


# --- the chart as a package -------------------------------------------------------------


def test_chart_metadata_follows_the_project(chart: helm.Chart) -> None:
    """Chart.yaml: apiVersion v2, an application at 0.1.0, appVersion the project's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    meta = chart.metadata
    assert (meta["apiVersion"], meta["name"], meta["type"]) == ("v2", "recoveryd", "application")
    assert meta["version"] == "0.1.0"
    assert meta["appVersion"] == project["version"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_lint_strict_passes(chart_dir: Path, value_set: str) -> None:
    """`helm lint --strict` finds nothing worse than information."""
    report = helm.lint(chart_dir, VALUE_SETS[value_set], strict=True, namespace=NAMESPACE)
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["total_charts_linted"] == 1
    assert (serious, report["errors"]) == ([], [])


# --- every manifest valid ---------------------------------------------------------------


def check_service_monitor(manifest: Manifest) -> None:
    """monitoring.coreos.com/v1 ServiceMonitor, checked by shape: its CRD's schema is not
    among kubernetes-validate's core schemas."""
    spec = manifest["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
    assert isinstance(spec["selector"]["matchLabels"], dict)
    assert set(spec["namespaceSelector"]) <= {"matchNames", "any"}
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "scheme", "interval", "scrapeTimeout"}
        assert isinstance(endpoint["port"], str)
        for duration in ("interval", "scrapeTimeout"):
            assert re.fullmatch(r"([0-9]+(ms|s|m|h|d|w|y))+", endpoint[duration])


def check_prometheus_rule(manifest: Manifest) -> None:
    """monitoring.coreos.com/v1 PrometheusRule, checked by shape (its CRD's schema is not
    among the core schemas): groups of named rules, each an alert or a record."""
    assert set(manifest["spec"]) == {"groups"}
    names = [group["name"] for group in manifest["spec"]["groups"]]
    assert len(names) == len(set(names)) > 0
    for group in manifest["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit", "partial_response_strategy"}
        assert group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {
                "alert",
                "record",
                "expr",
                "for",
                "keep_firing_for",
                "labels",
                "annotations",
            }
            assert ("alert" in rule) != ("record" in rule), rule
            assert isinstance(rule["expr"], str | int)
            for mapping in ("labels", "annotations"):
                assert all(isinstance(v, str) for v in rule.get(mapping, {}).values()), rule


CUSTOM_RESOURCES = {
    "ServiceMonitor": check_service_monitor,
    "PrometheusRule": check_prometheus_rule,
}


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_manifest_is_valid_kubernetes(render: Render, value_set: str) -> None:
    """Each object validates (strictly: no unknown field) against the Kubernetes schemas of
    the oldest and the newest supported version; the Prometheus Operator's by shape."""
    manifests = render(VALUE_SETS[value_set])
    assert manifests
    for manifest in manifests:
        assert manifest["metadata"]["namespace"] == NAMESPACE
        assert manifest["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        if manifest["apiVersion"] == "monitoring.coreos.com/v1":
            CUSTOM_RESOURCES[manifest["kind"]](manifest)
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize(
    ("value_set", "expected"),
    [
        ("default", {"ConfigMap", "Deployment", "NetworkPolicy", "PersistentVolumeClaim",
                     "PodDisruptionBudget", "Secret", "Service", "ServiceAccount"}),
        ("existing-secret", {"ConfigMap", "Deployment", "NetworkPolicy", "PersistentVolumeClaim",
                             "PodDisruptionBudget", "Service", "ServiceAccount"}),
        ("ingress", {"ConfigMap", "Deployment", "Ingress", "NetworkPolicy", "PersistentVolumeClaim",
                     "PodDisruptionBudget", "Secret", "Service", "ServiceAccount"}),
        ("monitoring", {"ConfigMap", "Deployment", "NetworkPolicy", "PersistentVolumeClaim",
                        "PodDisruptionBudget", "PrometheusRule", "Secret", "Service",
                        "ServiceAccount", "ServiceMonitor"}),
        ("persistence-off", {"ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget",
                             "Secret", "Service", "ServiceAccount"}),
        ("locked-down", {"ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget",
                         "Secret", "Service"}),
        ("postgres", {"ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Secret",
                      "Service", "ServiceAccount"}),
        ("postgres-existing-secret", {"ConfigMap", "Deployment", "NetworkPolicy",
                                      "PodDisruptionBudget", "Service", "ServiceAccount"}),
        ("shadow", {"ConfigMap", "Deployment", "NetworkPolicy", "PersistentVolumeClaim",
                    "PodDisruptionBudget", "Secret", "Service", "ServiceAccount"}),
    ],
)  # fmt: skip
def test_each_value_set_renders_its_objects(
    render: Render, value_set: str, expected: set[str]
) -> None:
    """Which kinds each value set makes: the optional ones only when asked for, and
    always the Job that checks the rules before an upgrade."""
    assert set(kinds(render(VALUE_SETS[value_set]))) == expected | {"Job"}


def test_an_upgrade_checks_the_new_rules_with_the_new_image_before_changing_anything(
    render: Render,
) -> None:
    """A pre-install/pre-upgrade hook: its own ConfigMap holds the new rules (the
    release's is not updated yet), its Job runs `recoveryd check` on them with the
    Deployment's image and security context, once; the ConfigMap is deleted when it
    passes, the Job a day later (its log holds the replay's summary)."""
    rules = "version: 1\nrules: []\n"
    manifests = render(merged(REQUIRED, {"rules": rules}))
    hooks = [m for m in manifests if "helm.sh/hook" in m["metadata"].get("annotations", {})]
    assert [(m["kind"], m["metadata"]["name"]) for m in hooks] == [
        ("ConfigMap", f"{FULLNAME}-rules-check"),
        ("Job", f"{FULLNAME}-rules-check"),
    ]
    config_map, job = hooks
    policies = [hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"] for hook in hooks]
    assert policies == ["before-hook-creation,hook-succeeded", "before-hook-creation"]
    for hook in hooks:
        assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    weights = [int(hook["metadata"]["annotations"]["helm.sh/hook-weight"]) for hook in hooks]
    assert weights[0] < weights[1]  # the rules exist before the Job starts
    assert config_map["data"] == {"rules.yaml": rules}
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    pod = job["spec"]["template"]["spec"]
    [check] = pod["containers"]
    assert check["command"] == ["/bin/sh", "-c"]
    assert check["args"][0].startswith("recoveryd check /etc/recoveryd/rules.yaml || exit\n")
    assert check["image"] == container(manifests)["image"]
    assert check["securityContext"] == container(manifests)["securityContext"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod  # the chart's does not exist at a first install
    assert pod["volumes"] == [{"name": "rules", "configMap": {"name": f"{FULLNAME}-rules-check"}}]
    off = render(merged(REQUIRED, {"rulesCheck": {"enabled": False}}))
    assert "Job" not in kinds(off)


def run_check_script(
    script: str, recoveryd: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """The Job's script run by sh, `recoveryd` being the shell function `recoveryd`."""
    return subprocess.run(
        ["/bin/sh", "-c", f"recoveryd() {{ {recoveryd}; }}\n{script}"],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("check", "replay", "status"),
    [(0, 0, 0), (0, 1, 0), (1, 0, 1), (2, 0, 2)],
    ids=["nothing-changes", "replay-finds-changes", "invalid-rules", "unreadable-rules"],
)
def test_the_hook_fails_on_the_check_alone_never_on_the_replay(
    render: Render, tmp_path: Path, check: int, replay: int, status: int
) -> None:
    """The replay is informational: its exit 1 (changes, or no daemon to ask) leaves the
    hook passing; the check's exit fails it, and the replay is then not run."""
    [job] = [m for m in render(REQUIRED) if m["kind"] == "Job"]
    [script] = job["spec"]["template"]["spec"]["containers"][0]["args"]
    fake = f'echo "$1"; case "$1" in check) return {check};; replay) return {replay};; esac'

    ran = run_check_script(script, fake, tmp_path)

    assert ran.returncode == status
    assert ran.stdout.split()[:2] == (["check", "replay"] if check == 0 else ["check"])


def test_the_replay_asks_the_running_daemon_through_its_admin_service(render: Render) -> None:
    """The Job reaches the admin Service with the admin token, optional (none at a first
    install from the chart's Secret), and the NetworkPolicy lets it through."""
    manifests = render(REQUIRED)
    [job] = [m for m in manifests if m["kind"] == "Job"]
    env = {v["name"]: v for v in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RECOVERYD_ADMIN_LISTEN"]["value"] == f"{FULLNAME}-admin:9090"
    token = env["RECOVERYD_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (token["name"], token["key"], token["optional"]) == (FULLNAME, "admin-token", True)
    spec = only(manifests, "NetworkPolicy")["spec"]
    check_pod = {"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "recoveryd", "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "rules-check",
    }}}  # fmt: skip
    assert check_pod in spec["ingress"][1]["from"]


# --- values refused ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"replicaCount": "two"}, "/replicaCount"),
        ({"replicaCount": 0}, "/replicaCount"),
        ({"replicaCount": 1.5}, "/replicaCount"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"replicaCont": 1}, "'replicaCont' not allowed"),
        ({"config": {"serviceURL": "https://x.example"}}, "'serviceURL' not allowed"),
        ({"persistence": {"size": "lots"}}, "/persistence/size"),
        ({"persistence": {"accessModes": ["ReadWriteMany"]}}, "/persistence/accessModes"),
        ({"config": {"logFormat": "xml"}}, "/config/logFormat"),
        ({"config": {"serviceUrl": "https://user:pw@qstash.upstash.io"}}, "/config/serviceUrl"),
        ({"config": {"headerPrefix": "Up-stash"}}, "/config/headerPrefix"),
        ({"config": {"retention": "a week"}}, "/config/retention"),
        ({"service": {"type": "ExternalName"}}, "/service/type"),
        ({"ingress": {"hosts": ["https://recoveryd.example.com"]}}, "/ingress/hosts"),
        ({"secrets": {"keys": {"token": "a token"}}}, "/secrets/keys/token"),
        ({"extraEnv": [{"value": "no name"}]}, "/extraEnv/0"),
        ({"store": {"type": "postgresql"}}, "/store/type"),
        ({"store": {"type": "mysql"}}, "/store/type"),
        ({"store": {"postgres": {"password": "pw"}}}, "'password' not allowed"),
        ({"store": {"postgres": {"existingSecret": "DB_App"}}}, "/store/postgres/existingSecret"),
        ({"store": {"postgres": {"key": "the url"}}}, "/store/postgres/key"),
        ({"store": {"postgres": {"url": 5432}}}, "/store/postgres/url"),
        ({"rollingUpdate": {"maxSurge": "one"}}, "/rollingUpdate/maxSurge"),
        ({"rollingUpdate": {"maxUnavailable": -1}}, "/rollingUpdate/maxUnavailable"),
        ({"secrets": {"keys": {"credentialsKey": "a key"}}}, "/secrets/keys/credentialsKey"),
        ({"topologySpreadConstraints": {"maxSkew": 1}}, "/topologySpreadConstraints"),
    ],
)
def test_schema_refuses_bad_values(chart: helm.Chart, changes: dict[str, Any], named: str) -> None:
    """values.schema.json stops the render, naming the value."""
    values = merged(REQUIRED, changes)
    with pytest.raises(helm.HelmValuesError) as caught:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert named in str(caught.value)
    assert named in error_of(lambda: chart.validate_schema(values))


def test_two_replicas_are_refused(chart: helm.Chart) -> None:
    """replicaCount: 2 on SQLite fails the render with the reason (SQLite is one pod's
    file) and the way out: the PostgreSQL store, its URL from a Secret."""
    message = error_of(lambda: chart.render(merged(REQUIRED, {"replicaCount": 2}), name=RELEASE))
    assert (
        "replicaCount: 2 is refused: the SQLite store is one file that one pod may use; "
        "for several replicas use the PostgreSQL store: set store.type: postgres and give "
        "the database's URL from a Secret (store.postgres.existingSecret and "
        "store.postgres.key, or store.postgres.url)"
    ) in message


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"secrets": REQUIRED["secrets"]}, "config.serviceUrl is required"),
        ({"config": CONFIG, "secrets": {"signingKeyCurrent": "k", "adminToken": "a"}},
         "secrets.token is required"),
        ({"config": CONFIG, "secrets": {"token": "t", "adminToken": "a"}},
         "secrets.signingKeyCurrent is required"),
        ({"config": CONFIG, "secrets": {"token": "t", "signingKeyCurrent": "k"}},
         "secrets.adminToken is required while admin.requireToken is true"),
        (merged(REQUIRED, {"config": {"rotateSchedule": "24h"}}),
         "config.rotateSchedule needs secrets.accountUsername and secrets.accountPassword"),
        (merged(VALUE_SETS["all-settings"], {"persistence": {"enabled": False}}),
         "config.rotateSchedule needs persistence.enabled"),
        (merged(REQUIRED, {"secrets": {"accountUsername": "u", "accountPassword": "p"},
                           "persistence": {"enabled": False}}),
         "secrets.accountUsername and secrets.accountPassword need persistence.enabled"),
        (merged(REQUIRED, {"secrets": {"existingSecret": "mine"}}),
         "secrets.token is set together with secrets.existingSecret"),
        (merged(REQUIRED, {"ingress": {"enabled": True}}), "ingress.hosts needs at least one"),
        (merged(REQUIRED, {"store": {"type": "postgres"}}),
         "store.type postgres needs the database's URL: name the Secret holding it in "
         "store.postgres.existingSecret"),
        (merged(VALUE_SETS["postgres"], {"store": {"postgres": {"existingSecret": "db-app"}}}),
         'store.postgres.url is set together with store.postgres.existingSecret: put the URL '
         'in the Secret "db-app" (key "store-url")'),
        (merged(VALUE_SETS["postgres-existing-secret"],
                {"store": {"postgres": {"url": STORE_URL, "existingSecret": ""}}}),
         'store.postgres.url is set together with secrets.existingSecret: put the URL in the '
         'Secret "recoveryd-credentials" (key "uri")'),
        (merged(VALUE_SETS["postgres"], {"secrets": {"credentialsKey": ""}}),
         "config.rotateSchedule with store.type postgres needs secrets.credentialsKey"),
        (merged(VALUE_SETS["postgres"], {"store": {"postgres": {"key": "token"}}}),
         'store.postgres.key "token" is also the key of another secret in secrets.keys'),
        (merged(VALUE_SETS["postgres"], {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}}),
         "rollingUpdate.maxSurge and rollingUpdate.maxUnavailable are both 0"),
        (merged(REQUIRED, {"store": {"postgres": {"existingSecret": "db-app"}}}),
         "store.postgres.url and store.postgres.existingSecret are for the PostgreSQL store, but "
         "store.type is sqlite: set store.type: postgres"),
        (merged(REQUIRED, {"secrets": {"credentialsKey": CREDENTIALS_KEY}}),
         "secrets.credentialsKey is for store.type postgres only"),
        (merged(VALUE_SETS["postgres-existing-secret"],
                {"secrets": {"credentialsKey": CREDENTIALS_KEY}}),
         "secrets.credentialsKey is set together with secrets.existingSecret"),
    ],
)  # fmt: skip
def test_incomplete_values_are_refused(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    """What the daemon cannot start (or keep its token) without stops the render first."""
    assert message in error_of(lambda: chart.render(values, name=RELEASE))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"store": {"postgres": {"url": f"mysql://root:{STORE_PASSWORD}@db/recoveryd"}}},
         "store.postgres.url is not a PostgreSQL URL: it must read "
         "postgresql://USER:PASSWORD@HOST:5432/DATABASE"),
        ({"store": {"postgres": {"url": f"postgresql://rd:{STORE_PASSWORD} @db/recoveryd"}}},
         "store.postgres.url is not a PostgreSQL URL"),
        ({"secrets": {"credentialsKey": CREDENTIALS_KEY.rstrip("=")}},
         "secrets.credentialsKey is not a Fernet key, or several comma-separated (each 32 "
         "bytes in URL-safe base64, 44 characters)"),
        ({"secrets": {"credentialsKey": f"{CREDENTIALS_KEY},{STORE_PASSWORD}"}},
         "secrets.credentialsKey is not a Fernet key"),
        ({"secrets": {"credentialsKey": STORE_PASSWORD}},
         "secrets.credentialsKey is not a Fernet key"),
    ],
)  # fmt: skip
def test_bad_postgres_secrets_are_refused_without_being_printed(
    chart: helm.Chart, changes: dict[str, Any], message: str
) -> None:
    """The URL and the key are checked by the templates, not the schema (whose errors quote
    the value): the refusal says what is wrong and never shows the password or the key."""
    error = error_of(lambda: chart.render(merged(VALUE_SETS["postgres"], changes), name=RELEASE))
    assert message in error
    assert STORE_PASSWORD not in error
    assert CREDENTIALS_KEY[:20] not in error


# --- the pod ------------------------------------------------------------------------------


def test_pod_runs_locked_down(render: Render) -> None:
    """Non-root 10001, read-only root, no escalation, no capabilities, RuntimeDefault
    seccomp, and no service account token."""
    manifests = render(REQUIRED)
    pod = only(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    context = container(manifests)["securityContext"]
    assert context["runAsNonRoot"] is True
    assert (context["runAsUser"], context["runAsGroup"]) == (10001, 10001)
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == FULLNAME
    assert only(manifests, "ServiceAccount")["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False


def test_one_replica_replaced_with_recreate(render: Render) -> None:
    """Recreate: the old pod is gone before the new one opens the SQLite file."""
    spec = only(render(REQUIRED), "Deployment")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    assert "topologySpreadConstraints" not in spec["template"]["spec"]


def test_image_ports_and_probes(render: Render) -> None:
    """The image at appVersion runs `serve` on ports http 8080 and admin 9090; liveness
    /healthz and readiness /readyz on http, a startup probe before them."""
    main = container(render(REQUIRED))
    assert main["image"] == "ghcr.io/recoveryd/recoveryd:0.1.0"
    assert main["imagePullPolicy"] == "IfNotPresent"
    assert main["args"] == ["serve"]
    assert "command" not in main  # the image's entrypoint, recoveryd
    assert [(p["name"], p["containerPort"]) for p in main["ports"]] == [
        ("http", 8080),
        ("admin", 9090),
    ]
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                        ("readinessProbe", "/readyz")):  # fmt: skip
        assert main[probe]["httpGet"] == {"path": path, "port": "http"}
        assert main[probe]["periodSeconds"] >= 1
        assert main[probe]["failureThreshold"] >= 1
    # The readiness check waits up to 5 s on the store: the probe must wait longer.
    assert main["readinessProbe"]["timeoutSeconds"] > 5
    assert set(main["resources"]) == {"requests", "limits"}


def test_image_digest_pins_the_image(render: Render) -> None:
    main = container(render(VALUE_SETS["locked-down"]))
    assert main["image"] == "ghcr.io/recoveryd/recoveryd@sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("value_set", "state"),
    [
        ("default", {"persistentVolumeClaim": {"claimName": f"{FULLNAME}-state"}}),
        ("locked-down", {"persistentVolumeClaim": {"claimName": "recoveryd-state"}}),
        ("persistence-off", {"emptyDir": {}}),
    ],
)
def test_volumes(render: Render, value_set: str, state: dict[str, Any]) -> None:
    """The store's volume at /var/lib/recoveryd, the rules read-only at /etc/recoveryd,
    and /tmp: the only writable paths."""
    manifests = render(VALUE_SETS[value_set])
    volumes = {
        v.pop("name"): v
        for v in only(manifests, "Deployment")["spec"]["template"]["spec"]["volumes"]
    }
    mounts = {m["name"]: m for m in container(manifests)["volumeMounts"]}
    assert volumes["state"] == state
    assert volumes["rules"] == {"configMap": {"name": f"{FULLNAME}-rules"}}
    assert "emptyDir" in volumes["tmp"]
    assert mounts["state"]["mountPath"] == "/var/lib/recoveryd"
    assert mounts["rules"] == {"name": "rules", "mountPath": "/etc/recoveryd", "readOnly": True}
    assert mounts["tmp"]["mountPath"] == "/tmp"


def test_claim_is_kept_read_write_once(render: Render) -> None:
    claim = only(render(REQUIRED), "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == f"{FULLNAME}-state"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "storageClassName" not in claim["spec"]


def test_environment(render: Render) -> None:
    """The settings the image's volumes and ports need, and the values given."""
    env = env_of(render(VALUE_SETS["all-settings"]))
    plain = {name: item["value"] for name, item in env.items() if "value" in item}
    assert plain == {
        "RECOVERYD_SERVICE_URL": "https://qstash.upstash.io",
        "RECOVERYD_ACCOUNT_URL": "https://qstash.upstash.io",
        "RECOVERYD_PUBLIC_URL": "https://recoveryd.example.com/callbacks",
        "RECOVERYD_HEADER_PREFIX": "Upstash",
        "RECOVERYD_STORE": "sqlite:////var/lib/recoveryd/recoveryd.db",
        "RECOVERYD_CREDENTIALS_FILE": "/var/lib/recoveryd/credentials.json",
        "RECOVERYD_RULES": "/etc/recoveryd/rules.yaml",
        "RECOVERYD_LISTEN": "0.0.0.0:8080",
        "RECOVERYD_ADMIN_LISTEN": "0.0.0.0:9090",
        "RECOVERYD_ROTATE_SCHEDULE": "0 3 * * 0",
        "RECOVERYD_LOG_FORMAT": "console",
        "RECOVERYD_DRY_RUN": "true",
        "RECOVERYD_FETCH": "needed",
        "RECOVERYD_RETENTION": "3d",
        "RECOVERYD_MAX_RPS": "50",
        "RECOVERYD_MAX_REMOVALS_PER_HOUR": "0",
        "RECOVERYD_MAX_BODY_BYTES": "1048576",
        "RECOVERYD_ALLOW_UNSIGNED": "false",
    }
    assert set(env) - set(plain) == set(SECRET_VARIABLES.values())


def test_default_environment_logs_json_and_leaves_optional_settings_out(render: Render) -> None:
    env = env_of(render(REQUIRED))
    assert env["RECOVERYD_LOG_FORMAT"]["value"] == "json"
    for optional in ("RECOVERYD_PUBLIC_URL", "RECOVERYD_ROTATE_SCHEDULE", "RECOVERYD_MAX_RPS",
                     "RECOVERYD_SIGNING_KEY_NEXT", "RECOVERYD_ACCOUNT_PASSWORD"):  # fmt: skip
        assert optional not in env


def resolved_environ(manifests: list[Manifest]) -> dict[str, str]:
    """The container's environment as the kubelet would give it, from the chart's Secret."""
    secret = only(manifests, "Secret")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    environ = {}
    for name, item in env_of(manifests).items():
        if "value" in item:
            environ[name] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"]
            environ[name] = data[ref["key"]]
    return environ


@pytest.mark.parametrize(
    "value_set", ["default", "all-settings", "ingress", "admin-open", "shadow"]
)
def test_daemon_accepts_the_environment(render: Render, value_set: str) -> None:
    """recoveryd's own settings loader takes the rendered environment: every name a
    setting (no typo stops the start), every value valid, the secrets where it reads them."""
    settings = load_settings(resolved_environ(render(VALUE_SETS[value_set])))
    assert settings.SERVICE_URL == "https://qstash.upstash.io"
    assert settings.TOKEN is not None
    assert settings.TOKEN.get_secret_value() == SECRETS["token"]
    assert settings.SIGNING_KEY_CURRENT is not None
    assert settings.SIGNING_KEY_CURRENT.get_secret_value() == SECRETS["signingKeyCurrent"]
    assert str(settings.CREDENTIALS_FILE).startswith("/var/lib/recoveryd/")
    assert (settings.ADMIN_TOKEN is None) == (value_set == "admin-open")
    assert (settings.SHADOW_RULES is None) == (value_set != "shadow")


# --- several replicas on PostgreSQL ---------------------------------------------------------


def test_postgres_replicas_roll_with_rolling_update(render: Render) -> None:
    """With the PostgreSQL store replicaCount may be above 1, and a rollout starts each new
    pod before it stops an old one: callbacks are served throughout."""
    spec = only(render(VALUE_SETS["postgres"]), "Deployment")["spec"]
    assert spec["replicas"] == 3
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    tuned = merged(
        VALUE_SETS["postgres"], {"rollingUpdate": {"maxUnavailable": 1, "maxSurge": "50%"}}
    )
    rolling = only(render(tuned), "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert rolling == {"maxUnavailable": 1, "maxSurge": "50%"}


@pytest.mark.parametrize(
    ("value_set", "store", "credentials_key"),
    [
        ("postgres",
         {"name": FULLNAME, "key": "store-url"},
         {"name": FULLNAME, "key": "credentials-key"}),
        ("postgres-existing-secret",
         {"name": "db-app", "key": "uri"},
         {"name": "recoveryd-credentials", "key": "credentials-key"}),
    ],
)  # fmt: skip
def test_postgres_url_and_credentials_key_come_from_secrets(
    render: Render, value_set: str, store: dict[str, str], credentials_key: dict[str, str]
) -> None:
    """RECOVERYD_STORE is the URL from its Secret (it holds a password), and with rotation
    on RECOVERYD_CREDENTIALS_KEY from the secrets' Secret, required; no credentials file:
    rotated credentials are kept in the store for every replica."""
    env = env_of(render(VALUE_SETS[value_set]))
    assert env["RECOVERYD_STORE"] == {
        "name": "RECOVERYD_STORE",
        "valueFrom": {"secretKeyRef": store},
    }
    assert env["RECOVERYD_CREDENTIALS_KEY"] == {
        "name": "RECOVERYD_CREDENTIALS_KEY",
        "valueFrom": {"secretKeyRef": credentials_key},
    }
    assert "RECOVERYD_CREDENTIALS_FILE" not in env


def test_postgres_secrets_in_the_charts_secret(render: Render) -> None:
    """store.postgres.url and secrets.credentialsKey are written to the chart's Secret, under
    store.postgres.key and secrets.keys.credentialsKey."""
    secret = only(render(VALUE_SETS["postgres"]), "Secret")
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded["store-url"] == STORE_URL
    assert decoded["credentials-key"] == CREDENTIALS_KEY


def test_postgres_credentials_key_without_rotation(render: Render) -> None:
    """No rotation schedule: the key is left out when the chart's Secret lacks it, and is
    optional in an existing Secret (where it lets `recoveryd rotate-token` keep its token)."""
    owned = merged(VALUE_SETS["postgres"], {"config": {"rotateSchedule": ""},
                                            "secrets": {"credentialsKey": ""}})  # fmt: skip
    assert "RECOVERYD_CREDENTIALS_KEY" not in env_of(render(owned))
    existing = merged(VALUE_SETS["postgres-existing-secret"], {"config": {"rotateSchedule": ""}})
    ref = env_of(render(existing))["RECOVERYD_CREDENTIALS_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "recoveryd-credentials", "key": "credentials-key", "optional": True}


def test_postgres_url_from_the_secrets_existing_secret(render: Render) -> None:
    """With no Secret of its own for the URL, it is read from secrets.existingSecret."""
    values = merged(VALUE_SETS["postgres-existing-secret"], {"store": {"postgres": {
        "existingSecret": "", "key": "store-url"}}})  # fmt: skip
    ref = env_of(render(values))["RECOVERYD_STORE"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "recoveryd-credentials", "key": "store-url"}


@pytest.mark.parametrize(
    "persistence",
    [{}, {"enabled": False}, {"existingClaim": "recoveryd-state"}],
    ids=["default", "off", "existing-claim"],
)
def test_postgres_needs_no_claim(render: Render, persistence: dict[str, Any]) -> None:
    """No PVC with PostgreSQL, whatever `persistence` says: nothing is kept in the pod.
    /var/lib/recoveryd (the image's TMPDIR) is a size-limited emptyDir."""
    manifests = render(merged(VALUE_SETS["postgres"], {"persistence": persistence}))
    assert "PersistentVolumeClaim" not in kinds(manifests)
    volumes = only(manifests, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (state,) = [v for v in volumes if v["name"] == "state"]
    assert state == {"name": "state", "emptyDir": {"sizeLimit": "64Mi"}}
    mounts = {m["name"]: m["mountPath"] for m in container(manifests)["volumeMounts"]}
    assert mounts["state"] == "/var/lib/recoveryd"


@pytest.mark.parametrize("value_set", ["postgres", "postgres-existing-secret"])
def test_several_replicas_keep_one_up_in_a_drain(render: Render, value_set: str) -> None:
    """minAvailable: 1 over the Deployment's pods: a drain never evicts the last ready
    replica, and an unhealthy one never holds a drain up. Valid for every supported
    Kubernetes."""
    manifests = render(VALUE_SETS[value_set])
    budget = only(manifests, "PodDisruptionBudget")
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(budget, version, strict=True)
    assert budget["spec"]["minAvailable"] == 1
    assert "maxUnavailable" not in budget["spec"]
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    pod_labels = only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_several_replicas_prefer_different_nodes(render: Render) -> None:
    """The replicas are spread across nodes as a preference (ScheduleAnyway: never a pod
    left unscheduled), each rollout's pods among themselves; a list of one's own wins."""
    manifests = render(VALUE_SETS["postgres"])
    template = only(manifests, "Deployment")["spec"]["template"]
    (spread,) = template["spec"]["topologySpreadConstraints"]
    assert spread == {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "recoveryd",
                                          "app.kubernetes.io/instance": RELEASE}},
        "matchLabelKeys": ["pod-template-hash"],
    }  # fmt: skip
    assert spread["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    one = only(render(merged(VALUE_SETS["postgres"], {"replicaCount": 1})), "Deployment")
    assert "topologySpreadConstraints" not in one["spec"]["template"]["spec"]
    zones = [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": RELEASE}},
        }
    ]
    own = merged(VALUE_SETS["postgres"], {"topologySpreadConstraints": zones})
    pod = only(render(own), "Deployment")["spec"]["template"]["spec"]
    assert pod["topologySpreadConstraints"] == zones


def test_daemon_accepts_the_postgres_environment(render: Render) -> None:
    """recoveryd's settings loader takes the PostgreSQL environment: the store's URL, the
    credentials key in place of a credentials file, rotation on."""
    settings = load_settings(resolved_environ(render(VALUE_SETS["postgres"])))
    assert settings.STORE == STORE_URL
    assert settings.CREDENTIALS_KEY is not None
    assert settings.CREDENTIALS_KEY.get_secret_value() == CREDENTIALS_KEY
    assert settings.CREDENTIALS_FILE is None
    assert settings.ROTATE_SCHEDULE == "0 3 * * 0"


def test_the_several_replicas_example_renders(render: Render) -> None:
    """The values the chart's README gives under "Several replicas" render valid objects:
    three replicas on PostgreSQL, rolled with RollingUpdate, with a budget."""
    readme = (CHART / "README.md").read_text()
    part = readme.split("## Several replicas", 1)[1]
    example = re.search(r"```yaml\n(.*?)```", part, re.DOTALL)
    assert example is not None
    manifests = render(yaml.safe_load(example.group(1)))
    deployment = only(manifests, "Deployment")
    assert deployment["spec"]["replicas"] > 1
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "PersistentVolumeClaim" not in kinds(manifests)
    assert only(manifests, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    for manifest in manifests:
        if manifest["kind"] not in CUSTOM_RESOURCES:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSIONS[-1], strict=True)


# --- secrets --------------------------------------------------------------------------------


def encodings(value: str) -> set[str]:
    return {value, base64.b64encode(value.encode()).decode()}


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_secrets_only_in_the_secret(render: Render, value_set: str) -> None:
    """No secret value, plain or base64, outside the Secret: not in a ConfigMap, not in an
    env value; every secret variable (the PostgreSQL URL and the credentials key too)
    comes from a secretKeyRef."""
    manifests = render(VALUE_SETS[value_set])
    values = [*SECRETS.values(), *POSTGRES_SECRETS.values()]
    outside = "\n".join(yaml.safe_dump(m) for m in manifests if m["kind"] != "Secret")
    for value in values:
        for form in encodings(value):
            assert form not in outside
    secret_variables = {*SECRET_VARIABLES.values(), "RECOVERYD_CREDENTIALS_KEY"}
    for name, item in env_of(manifests).items():
        if name in secret_variables or item.get("value", "").startswith("postgres"):
            assert set(item) == {"name", "valueFrom"}
            assert set(item["valueFrom"]) == {"secretKeyRef"}
    # Nor in plain text in the Secret: its data is base64.
    assert not [m["kind"] for m in manifests if any(v in json.dumps(m) for v in values)]


def test_chart_secret_holds_the_given_secrets(render: Render) -> None:
    secret = only(render(VALUE_SETS["all-settings"]), "Secret")
    assert secret["metadata"]["name"] == FULLNAME
    assert secret["type"] == "Opaque"
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == {SECRET_KEYS[k]: v for k, v in SECRETS.items()}
    env = env_of(render(VALUE_SETS["all-settings"]))
    for setting, variable in SECRET_VARIABLES.items():
        # Every key is there: none is optional.
        ref = env[variable]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": FULLNAME, "key": SECRET_KEYS[setting]}


def test_existing_secret_is_referenced_by_its_documented_keys(render: Render) -> None:
    """With secrets.existingSecret no Secret is made; each variable names its key there,
    the required ones (token, signing key, admin token) not optional."""
    manifests = render(VALUE_SETS["existing-secret"])
    env = env_of(manifests)
    for setting, variable in SECRET_VARIABLES.items():
        ref = env[variable]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("recoveryd-credentials", SECRET_KEYS[setting])
        required = setting in {"token", "signingKeyCurrent", "adminToken"}
        assert ref.get("optional", False) is not required, variable
    annotations = only(manifests, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/secret" not in annotations


def test_open_admin_api_leaves_the_admin_token_out(render: Render) -> None:
    manifests = render(VALUE_SETS["admin-open"])
    assert "RECOVERYD_ADMIN_TOKEN" not in env_of(manifests)
    assert SECRET_KEYS["adminToken"] not in only(manifests, "Secret")["data"]


# --- rules ----------------------------------------------------------------------------------


def rules_of(manifests: list[Manifest]) -> str:
    config_map = only(manifests, "ConfigMap", f"{FULLNAME}-rules")
    assert set(config_map["data"]) == {"rules.yaml"}
    return str(config_map["data"]["rules.yaml"])


def test_rendered_rules_pass_recoveryd_check(render: Render, tmp_path: Path) -> None:
    """The ConfigMap's rules.yaml, as mounted, passes `recoveryd check`."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_of(render(REQUIRED)))
    checked = subprocess.run(
        [sys.executable, "-m", "daemon", "check", str(rules)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_default_rules_record_and_call_nothing(render: Render) -> None:
    """Without `rules` nothing is called: the one rule ignores (records), and no sweep runs."""
    default = parse_rules(rules_of(render(REQUIRED)))
    assert [rule.spec.action for rule in default.rules] == ["ignore"]
    assert default.sweeps == ()


def test_rules_checksum_is_the_rules_files_sha256(render: Render) -> None:
    """checksum/rules is the mounted file's sha256, the one /api/v1/status reports."""
    manifests = render(REQUIRED)
    annotations = only(manifests, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/rules"] == hashlib.sha256(rules_of(manifests).encode()).hexdigest()


def test_a_rules_change_rolls_the_pod(render: Render) -> None:
    """Other rules, another checksum/rules: the Deployment's pod template changes."""
    rules = (ROOT / "rules.yaml").read_text().replace("maxPerRun: 500", "maxPerRun: 400")
    before = render(REQUIRED)
    after = render(merged(REQUIRED, {"rules": rules}))
    assert rules_of(after) == rules

    def checksums(manifests: list[Manifest]) -> dict[str, str]:
        template = only(manifests, "Deployment")["spec"]["template"]
        return dict(template["metadata"]["annotations"])

    assert checksums(before)["checksum/rules"] != checksums(after)["checksum/rules"]
    assert checksums(before)["checksum/secret"] == checksums(after)["checksum/secret"]


def annotations_of(manifests: list[Manifest]) -> dict[str, str]:
    return dict(only(manifests, "Deployment")["spec"]["template"]["metadata"]["annotations"])


def test_shadow_rules_are_mounted_beside_the_rules(render: Render) -> None:
    """shadowRules is the ConfigMap's shadow-rules.yaml, byte for byte, and
    RECOVERYD_SHADOW_RULES names it where the rules volume mounts it."""
    manifests = render(VALUE_SETS["shadow"])
    data = only(manifests, "ConfigMap", f"{FULLNAME}-rules")["data"]
    assert data == {"rules.yaml": rules_of(render(REQUIRED)), "shadow-rules.yaml": SHADOW_RULES}
    (mount,) = [m for m in container(manifests)["volumeMounts"] if m["name"] == "rules"]
    path = f"{mount['mountPath']}/shadow-rules.yaml"
    assert env_of(manifests)["RECOVERYD_SHADOW_RULES"] == {
        "name": "RECOVERYD_SHADOW_RULES",
        "value": path,
    }
    assert env_of(manifests)["RECOVERYD_RULES"]["value"] == "/etc/recoveryd/rules.yaml"


def test_mounted_shadow_rules_load_with_the_digest_the_pod_is_annotated_with(
    render: Render, tmp_path: Path
) -> None:
    """The ConfigMap's shadow-rules.yaml, as mounted, loads as the daemon's shadow, and
    checksum/shadow-rules is its digest (GET /api/v1/shadow's)."""
    manifests = render(VALUE_SETS["shadow"])
    path = tmp_path / "shadow-rules.yaml"
    data = only(manifests, "ConfigMap", f"{FULLNAME}-rules")["data"]
    path.write_text(data["shadow-rules.yaml"])
    shadow = ShadowRules(path, Metrics(CollectorRegistry()))
    assert (shadow.error, shadow.problems) == (None, ())
    assert shadow.digest == annotations_of(manifests)["checksum/shadow-rules"]
    assert shadow.digest == hashlib.sha256(SHADOW_RULES.encode()).hexdigest()


def test_a_shadow_rules_change_rolls_the_pod_and_leaves_the_rules_checksum(
    render: Render,
) -> None:
    """Other shadow rules, another checksum/shadow-rules; checksum/rules stays the live
    rules' (what /api/v1/status reports)."""
    other = SHADOW_RULES.replace("maxPerRun: 500", "maxPerRun: 400")
    assert other != SHADOW_RULES
    before = annotations_of(render(VALUE_SETS["shadow"]))
    after = annotations_of(render(merged(REQUIRED, {"shadowRules": other})))
    assert before["checksum/shadow-rules"] != after["checksum/shadow-rules"]
    assert before["checksum/rules"] == after["checksum/rules"]
    assert before["checksum/rules"] == annotations_of(render(REQUIRED))["checksum/rules"]


@pytest.mark.parametrize("shadow", [None, ""])
def test_without_shadow_rules_no_shadow_file_variable_or_checksum(
    render: Render, shadow: str | None
) -> None:
    """shadowRules empty (the default) or null: the ConfigMap holds rules.yaml alone, and
    neither RECOVERYD_SHADOW_RULES nor checksum/shadow-rules is set."""
    values = REQUIRED if shadow is None else merged(REQUIRED, {"shadowRules": shadow})
    manifests = render(values)
    assert set(only(manifests, "ConfigMap", f"{FULLNAME}-rules")["data"]) == {"rules.yaml"}
    assert "RECOVERYD_SHADOW_RULES" not in env_of(manifests)
    assert "checksum/shadow-rules" not in annotations_of(manifests)


def test_an_upgrade_reusing_values_from_a_chart_without_shadow_rules_renders(
    tmp_path: Path,
) -> None:
    """`helm upgrade --reuse-values` renders with the previous chart's values.yaml, which
    had no shadowRules: the chart renders as without shadow rules (the schema does not
    require it)."""
    older = tmp_path / "recoveryd"
    shutil.copytree(CHART, older)
    values = older / "values.yaml"
    text = values.read_text()
    assert '\nshadowRules: ""\n' in text
    values.write_text(text.replace('\nshadowRules: ""\n', "\n"))
    with helm.Chart.load(older) as chart:
        manifests = manifests_of(chart.render(REQUIRED, name=RELEASE, namespace=NAMESPACE))
    assert set(only(manifests, "ConfigMap", f"{FULLNAME}-rules")["data"]) == {"rules.yaml"}
    assert "RECOVERYD_SHADOW_RULES" not in env_of(manifests)


def test_invalid_shadow_rules_never_stop_an_upgrade(render: Render) -> None:
    """A shadow file recoveryd refuses still renders, and the upgrade's rules check leaves
    it alone: it never affects the live rules, so it never fails an upgrade."""
    invalid = "version: 1\nrules:\n  - name: broken\n    action: explode\n"
    manifests = render(merged(REQUIRED, {"shadowRules": invalid}))
    data = only(manifests, "ConfigMap", f"{FULLNAME}-rules")["data"]
    assert data["shadow-rules.yaml"] == invalid
    hooks = [m for m in manifests if "helm.sh/hook" in m["metadata"].get("annotations", {})]
    assert hooks
    for hook in hooks:
        assert "shadow" not in json.dumps(hook)


def test_a_secret_change_rolls_the_pod(render: Render) -> None:
    def checksum(values: dict[str, Any]) -> str:
        template = only(render(values), "Deployment")["spec"]["template"]
        return str(template["metadata"]["annotations"]["checksum/secret"])

    assert checksum(REQUIRED) != checksum(merged(REQUIRED, {"secrets": {"token": "another"}}))


# --- services, ingress, network ------------------------------------------------------------


def test_public_and_admin_services(render: Render) -> None:
    """`<name>` serves the callbacks on 8080, `<name>-admin` (ClusterIP) metrics and the
    admin API on 9090; both select the pod."""
    manifests = render(REQUIRED)
    pod_labels = only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    public = only(manifests, "Service", FULLNAME)["spec"]
    admin = only(manifests, "Service", f"{FULLNAME}-admin")["spec"]
    assert public["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    assert admin["type"] == "ClusterIP"
    assert admin["ports"] == [
        {"name": "admin", "port": 9090, "targetPort": "admin", "protocol": "TCP"}
    ]
    for spec in (public, admin):
        assert spec["selector"].items() <= pod_labels.items()


def test_ingress_routes_only_the_callback_path(render: Render) -> None:
    ingress = only(render(VALUE_SETS["ingress"]), "Ingress")
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"secretName": "recoveryd-tls", "hosts": ["recoveryd.example.com"]}]
    (rule,) = spec["rules"]
    assert rule["host"] == "recoveryd.example.com"
    assert rule["http"]["paths"] == [
        {
            "path": "/callbacks",
            "pathType": "Exact",
            "backend": {"service": {"name": FULLNAME, "port": {"name": "http"}}},
        }
    ]


def test_network_policy_admits_the_admin_port_from_its_peers_only(render: Render) -> None:
    """Callbacks from anywhere; 9090 only from the configured peers (Prometheus); egress
    open, since the service's API is outside the cluster."""
    spec = only(render(REQUIRED), "NetworkPolicy")["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    public, admin = spec["ingress"]
    assert public == {"ports": [{"port": "http", "protocol": "TCP"}]}
    assert admin["ports"] == [{"port": "admin", "protocol": "TCP"}]
    assert admin["from"][0] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    assert [peer["podSelector"]["matchLabels"].get("app.kubernetes.io/component")
            for peer in admin["from"][1:]] == ["rules-check"]  # fmt: skip
    assert spec["egress"] == [{}]
    unchecked = render(merged(REQUIRED, {"rulesCheck": {"enabled": False}}))
    assert len(only(unchecked, "NetworkPolicy")["spec"]["ingress"][1]["from"]) == 1


def test_network_policy_restricted_egress_keeps_dns(render: Render) -> None:
    spec = only(render(VALUE_SETS["locked-down"]), "NetworkPolicy")["spec"]
    assert spec["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    ]
    dns, admin, https = spec["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert admin["ports"] == [{"port": "admin", "protocol": "TCP"}]  # the rules check's replay
    assert https["ports"] == [{"port": 443, "protocol": "TCP"}]


@pytest.mark.parametrize(
    "values",
    [REQUIRED, merged(VALUE_SETS["postgres"], {"replicaCount": 1})],
    ids=["sqlite", "postgres"],
)
def test_disruption_budget_never_blocks_a_drain(render: Render, values: dict[str, Any]) -> None:
    """One replica, on either store: a drain may move it."""
    spec = only(render(values), "PodDisruptionBudget")["spec"]
    assert spec["maxUnavailable"] == 1
    assert "minAvailable" not in spec


# --- monitoring -------------------------------------------------------------------------------


def test_service_monitor_scrapes_the_admin_service(render: Render) -> None:
    manifests = render(VALUE_SETS["monitoring"])
    monitor = only(manifests, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [
        m["metadata"]["name"]
        for m in manifests
        if m["kind"] == "Service" and selector.items() <= m["metadata"]["labels"].items()
    ]
    assert selected == [f"{FULLNAME}-admin"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("admin", "/metrics")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_prometheus_rule_holds_the_alerts_files_groups(render: Render, chart_dir: Path) -> None:
    rule = only(render(VALUE_SETS["monitoring"]), "PrometheusRule")
    alerts = yaml.safe_load((chart_dir / "files" / "alerts.yaml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
    assert rule["metadata"]["labels"]["release"] == "prometheus"


def test_dashboard_config_map_for_the_grafana_sidecar(render: Render, chart_dir: Path) -> None:
    """The file's dashboard, made the release's own: its uid, its name in the title, its
    namespace chosen; everything else as the file has it."""
    dashboard = only(render(VALUE_SETS["monitoring"]), "ConfigMap", f"{FULLNAME}-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "Platform"}
    assert list(dashboard["data"]) == ["recoveryd.json"]
    rendered = json.loads(dashboard["data"]["recoveryd.json"])
    file = json.loads((chart_dir / "files" / "dashboard.json").read_text())
    assert rendered["uid"] != file["uid"]
    assert rendered["title"] == f"{file['title']} ({NAMESPACE}/{RELEASE})"
    variables = {v["name"]: v for v in rendered["templating"]["list"]}
    if "namespace" in variables:  # the stand-in dashboard has none
        chosen = variables["namespace"].pop("current")
        assert chosen == {"selected": True, "text": [NAMESPACE], "value": [NAMESPACE]}
        {v["name"]: v for v in file["templating"]["list"]}["namespace"].pop("current")
    for changed in ("uid", "title"):
        del rendered[changed], file[changed]
    assert rendered == file


def test_each_release_has_a_dashboard_of_its_own(chart: helm.Chart) -> None:
    """Grafana keeps one dashboard a uid: two releases (two names, or one name in two
    namespaces) must not overwrite each other's. The uid fits Grafana's 40 characters."""
    uids = set()
    for name, namespace in (("rd", "a"), ("other", "a"), ("rd", "b"), ("x" * 53, "y" * 63)):
        output = chart.render(VALUE_SETS["monitoring"], name=name, namespace=namespace)
        (dashboard,) = [
            m for m in manifests_of(output)
            if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-dashboard")
        ]  # fmt: skip
        uid = json.loads(dashboard["data"]["recoveryd.json"])["uid"]
        assert len(uid) <= 40
        uids.add(uid)
    assert len(uids) == 4


def test_dashboard_sidecar_label_is_configurable(render: Render) -> None:
    values = merged(
        VALUE_SETS["monitoring"],
        {
            "monitoring": {
                "dashboard": {
                    "sidecarLabel": "dashboards",
                    "sidecarLabelValue": "recoveryd",
                    "namespace": "grafana",
                }
            }
        },
    )
    dashboard = only(render(values), "ConfigMap", f"{FULLNAME}-dashboard")
    assert dashboard["metadata"]["namespace"] == "grafana"
    assert dashboard["metadata"]["labels"]["dashboards"] == "recoveryd"
    assert "grafana_dashboard" not in dashboard["metadata"]["labels"]


def test_monitoring_renders_without_its_files(tmp_path: Path) -> None:
    """A chart without files/alerts.yaml and files/dashboard.json (they are written apart
    from the templates) still renders with monitoring on: no PrometheusRule, no dashboard."""
    bare = tmp_path / "recoveryd"
    shutil.copytree(CHART, bare, ignore=shutil.ignore_patterns("alerts.yaml", "dashboard.json"))
    with helm.Chart.load(bare) as chart:
        manifests = manifests_of(
            chart.render(VALUE_SETS["monitoring"], name=RELEASE, namespace=NAMESPACE)
        )
    assert "ServiceMonitor" in kinds(manifests)
    assert "PrometheusRule" not in kinds(manifests)
    assert [m["metadata"]["name"] for m in manifests if m["kind"] == "ConfigMap"] == [
        f"{FULLNAME}-rules",
        f"{FULLNAME}-rules-check",  # the rules check's, not a dashboard
    ]


# --- names and notes --------------------------------------------------------------------------


def test_release_named_recoveryd_is_not_repeated(chart: helm.Chart) -> None:
    """A release called recoveryd makes `recoveryd` and `recoveryd-admin`."""
    manifests = manifests_of(chart.render(REQUIRED, name="recoveryd", namespace=NAMESPACE))
    assert only(manifests, "Deployment")["metadata"]["name"] == "recoveryd"
    services = sorted(m["metadata"]["name"] for m in manifests if m["kind"] == "Service")
    assert services == ["recoveryd", "recoveryd-admin"]


@pytest.mark.parametrize(
    ("value_set", "warnings"),
    [
        ("ingress", []),
        ("default", ["config.publicUrl is empty"]),
        ("admin-open", ["config.publicUrl is empty", "admin.requireToken is false"]),
        ("persistence-off", ["config.publicUrl is empty", "persistence.enabled is false"]),
        # persistence is ignored with PostgreSQL: nothing is kept in the pod.
        ("postgres-existing-secret", ["config.publicUrl is empty"]),
    ],
)
def test_notes_warn_about_what_is_unsafe(
    chart: helm.Chart, value_set: str, warnings: list[str]
) -> None:
    rendered = chart.render(VALUE_SETS[value_set], name=RELEASE, namespace=NAMESPACE)
    notes = rendered["recoveryd/templates/NOTES.txt"]
    assert f"svc/{FULLNAME}-admin 9090" in notes
    found = re.findall(r"^WARNING: (.*?)[,:]", notes, re.MULTILINE)
    assert found == warnings


@pytest.mark.parametrize(("value_set", "asks"), [("default", True), ("admin-open", False)])
def test_notes_say_how_to_reach_the_console(chart: helm.Chart, value_set: str, asks: bool) -> None:
    """Through the admin Service's port-forward, at /ui/, asking for the token when the
    admin API needs it."""
    rendered = chart.render(VALUE_SETS[value_set], name=RELEASE, namespace=NAMESPACE)
    notes = rendered["recoveryd/templates/NOTES.txt"]
    assert "the console: http://localhost:9090/ui/" in notes
    assert ("asks for the admin token once" in notes) is asks


PUBLIC_URL = "https://recoveryd.example.com/callbacks"
TLS = [{"secretName": "recoveryd-tls", "hosts": ["recoveryd.example.com"]}]


@pytest.mark.parametrize(
    ("public_url", "ingress", "served"),
    [
        (PUBLIC_URL, {"hosts": ["recoveryd.example.com"], "tls": TLS}, True),
        (PUBLIC_URL, {"hosts": ["recoveryd.example.com"]}, False),  # http only
        ("http://recoveryd.example.com/callbacks", {"hosts": ["recoveryd.example.com"]}, True),
        (
            "http://recoveryd.example.com/callbacks",
            {"hosts": ["recoveryd.example.com"], "tls": TLS},
            False,
        ),
        (PUBLIC_URL, {"hosts": ["other.example.com"], "tls": [{"secretName": "t"}]}, False),
        (
            "https://recoveryd.example.com/hooks",
            {"hosts": ["recoveryd.example.com"], "tls": TLS},
            False,
        ),
        (
            "https://recoveryd.example.com:443/callbacks",
            {"hosts": ["recoveryd.example.com"], "tls": TLS},
            True,
        ),
        (
            "https://recoveryd.example.com:8443/callbacks",
            {"hosts": ["recoveryd.example.com"], "tls": TLS},
            False,
        ),
        (
            PUBLIC_URL,
            {"hosts": ["*.example.com"], "tls": [{"secretName": "t", "hosts": ["*.example.com"]}]},
            True,
        ),
        (
            "https://a.recoveryd.example.com/callbacks",
            {"hosts": ["*.example.com"], "tls": [{"secretName": "t"}]},
            False,
        ),
    ],
)
def test_notes_give_the_signed_url_and_warn_when_the_ingress_serves_another(
    chart: helm.Chart, public_url: str, ingress: dict[str, Any], served: bool
) -> None:
    """The NOTES' callback URL is config.publicUrl, and they warn if the ingress serves another."""
    values = merged(
        REQUIRED, {"config": {"publicUrl": public_url}, "ingress": {"enabled": True, **ingress}}
    )
    notes = chart.render(values, name=RELEASE, namespace=NAMESPACE)["recoveryd/templates/NOTES.txt"]
    assert callback_urls(notes) == [public_url]
    warned = "WARNING: config.publicUrl is not a URL the ingress serves" in notes
    assert warned is not served


# Each flag of `helm install` the docs' commands may use, and how it reads its argument:
# Helm's own parsers, applied in Helm's order (values files, then --set, --set-string,
# --set-file, each kind in the order given).
SET_FLAGS = {
    "--set": helm.parse_set_string,
    "--set-string": helm.parse_set_string_values,
    "--set-file": helm.parse_set_file,
}
PLAIN_FLAGS = {"--create-namespace"}  # flags with no argument and no effect on the values


def install_command(page: Path) -> list[str]:
    """The words of the page's `helm install` command, as a shell splits them."""
    text = page.read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("helm install ")]
    return shlex.split(line)


class Install(NamedTuple):
    values: dict[str, Any]
    name: str
    namespace: str


def install_values(words: list[str]) -> Install:
    """What `helm install` makes of `words`: the values, as Helm reads them (`--set-file`
    paths from the working directory), the release's name and namespace. A flag this does
    not know fails."""
    files: list[str] = []
    sets: dict[str, list[str]] = {flag: [] for flag in SET_FLAGS}
    namespace = "default"
    arguments = iter(words[4:])  # after `helm install NAME CHART`
    for flag in arguments:
        if flag in ("-f", "--values"):
            files.append(next(arguments))
        elif flag in SET_FLAGS:
            sets[flag].append(next(arguments))
        elif flag in ("-n", "--namespace"):
            namespace = next(arguments)
        else:
            assert flag in PLAIN_FLAGS, f"the test does not read {flag}"
    values: dict[str, Any] = {}
    for path in files:
        values = merged(values, helm.values_from_yaml(Path(path).read_text()))
    for flag, parse in SET_FLAGS.items():
        if sets[flag]:
            values = merged(values, parse(",".join(sets[flag])))
    return Install(values, words[2], namespace)


def callback_urls(notes: str) -> list[str]:
    """The URLs the NOTES tell users to point their failure callbacks at."""
    found = re.search(r"-Failure-Callback\) at\n\n?((?:  \S+://\S+\n)+)", notes)
    assert found is not None, notes
    return found[1].split()


def ingress_urls(manifests: list[Manifest]) -> list[str]:
    """The callback URLs the rendered Ingress serves: https for a host its TLS covers."""
    spec = only(manifests, "Ingress")["spec"]
    secured = {host for tls in spec.get("tls", []) for host in tls.get("hosts", [])}
    return [
        f"{'https' if rule['host'] in secured else 'http'}://{rule['host']}{path['path']}"
        for rule in spec["rules"]
        for path in rule["http"]["paths"]
    ]


INSTALL_PAGES = [ROOT / "README.md", CHART / "README.md"]


@pytest.fixture(params=INSTALL_PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def install(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Install:
    """The values and namespace of a page's `helm install`, run from the repository's
    root as its `./helm/recoveryd` says."""
    monkeypatch.chdir(ROOT)
    return install_values(install_command(request.param))


def test_the_readme_install_command_renders_valid_manifests(
    render: Render, install: Install
) -> None:
    """What a newcomer copies from the docs renders, and every object is valid."""
    for manifest in render(install.values):
        if manifest["kind"] not in CUSTOM_RESOURCES:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_readme_install_command_deploys_the_repository_rules(
    render: Render, install: Install
) -> None:
    """The docs' `helm install` passes the rules file, not the chart's default."""
    assert rules_of(render(install.values)) == (ROOT / "rules.yaml").read_text()


def test_the_readme_install_command_points_callbacks_at_the_signed_url(
    chart: helm.Chart, install: Install
) -> None:
    """The docs' `helm install` NOTES point callbacks at RECOVERYD_PUBLIC_URL, served, unwarned."""
    rendered = chart.render(
        install.values, name=install.name, namespace=install.namespace, is_install=True
    )
    manifests = manifests_of(rendered)
    notes = rendered["recoveryd/templates/NOTES.txt"]
    public_url = env_of(manifests)["RECOVERYD_PUBLIC_URL"]["value"]
    assert callback_urls(notes) == [public_url]
    if install.values.get("ingress", {}).get("enabled"):
        assert ingress_urls(manifests) == [public_url]
    assert "WARNING" not in notes
