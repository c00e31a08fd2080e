"""The chart's monitoring files hold against the real tools: promtool accepts the alert
rules and their unit tests pass, and on a real Prometheus scraping `recoveryd serve`
every dashboard query has data and every alert rule evaluates without error."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from daemon.metrics import Metrics
from tests import system_tools
from tests.account.support import rotation_settings, send_callbacks, status
from tests.pipeline.support import FINAL, RESUME_ALL
from tests.processes import Served, free_port, serving, stop
from tests.support import LOOPBACK_TLS, callback_json, emulator_config, workflows

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "helm" / "recoveryd" / "files" / "alerts.yaml"
DASHBOARD = ROOT / "helm" / "recoveryd" / "files" / "dashboard.json"
ALERT_TESTS = Path(__file__).parent / "alerts_test.yaml"

# What Grafana puts in place of its variables, for a Prometheus that has scraped every
# second for a few seconds: a rate window holding several scrapes, all instances.
GRAFANA_VARIABLES = {
    "__rate_interval": "10s",
    "__interval": "1s",
    "__range": "1m",
    "namespace": ".*",
    "instance": ".*",
}
# Alerts a daemon that recovered work, with a few refused calls on the way, must not
# even have pending. (RecoverydDlqIdsFailed must: some dlqIds end failed here.)
QUIET = {
    "RecoverydDown",
    "RecoverydNotReady",
    "RecoverydTaskCrashing",
    "RecoverydTokenLockout",
    "RecoverydTokenRotationFailing",
    "RecoverydBacklogGrowing",
    "RecoverydBacklogStuck",
    "RecoverydDlqRetentionNear",
    "RecoverydRulesReloadFailing",
}
WORK = 30  # workflow dlqIds to recover, a batch of them refused for good


def alert_names() -> list[str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def dashboard_targets() -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of every panel, rows' panels included."""
    found = []
    panels = list(json.loads(DASHBOARD.read_text())["panels"])
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            found.append((panel["title"], target["refId"], target["expr"]))
    return found


def as_grafana_sends(expr: str) -> str:
    def value(variable: re.Match[str]) -> str:
        name = variable.group(1) or variable.group(2)
        assert name in GRAFANA_VARIABLES, f"{expr}: a variable the test does not know: {name}"
        return GRAFANA_VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def metric_names(text: str) -> set[str]:
    """recoveryd's metrics named in `text`, histogram series by their family's name."""
    names = set(re.findall(r"\brecoveryd_[a-z_]*[a-z]\b", text))
    return {re.sub(r"_(bucket|count|sum)$", "", name) for name in names}


def exported_metrics() -> set[str]:
    """Every metric family daemon/metrics.py defines, counters by their `_total` name."""
    metrics = Metrics(CollectorRegistry())
    metrics.last_rotation_success.set(0)  # registered at their first value
    metrics.last_rotation_failure.set(0)
    return {
        family.name + "_total" if family.type == "counter" else family.name
        for family in metrics.registry.collect()
    }


# -- the files as files -------------------------------------------------------------------


@pytest.mark.needs("promtool")
def test_promtool_accepts_the_alert_rules() -> None:
    checked = subprocess.run(
        [system_tools.path("promtool"), "check", "rules", str(ALERTS)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in checked.stdout


@pytest.mark.needs("promtool")
def test_each_alert_fires_on_its_failure_and_not_on_a_healthy_daemon() -> None:
    """promtool's unit tests pass, and they show every alert of the file both firing and
    quiet (each group of alerts_test.yaml also holds healthy targets that must not fire)."""
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    evaluations = [check for test in tests for check in test["alert_rule_test"]]
    fired = {check["alertname"] for check in evaluations if check["exp_alerts"]}
    quiet = {check["alertname"] for check in evaluations if not check["exp_alerts"]}
    assert fired == quiet == set(alert_names())
    ran = subprocess.run(
        [system_tools.path("promtool"), "test", "rules", str(ALERT_TESTS)],
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_the_dashboard_queries_recoveryds_metrics_per_grafana_variables() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    targets = dashboard_targets()
    assert len(targets) >= len(dashboard["panels"])
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert all(t["expr"] and t["refId"] for t in panel["targets"]), panel["title"]
    for title, _, expr in targets:
        windows = set(re.findall(r"\[([^\]]+)\]", expr))
        assert windows <= {"$__rate_interval", "$__range"}, (title, expr)
        # Every selector keeps to the namespace and the instances chosen (one release's
        # replicas), so that two releases on one Prometheus are told apart.
        for selector in re.findall(r"\brecoveryd_\w+(\{[^}]*\})?", expr):
            assert 'namespace=~"$namespace", instance=~"$instance"' in selector, (title, expr)
    # The instances offered are those of the namespaces chosen.
    assert (
        variables["namespace"]["query"]["query"] == "label_values(recoveryd_rules_info, namespace)"
    )
    assert variables["instance"]["query"]["query"] == (
        'label_values(recoveryd_rules_info{namespace=~"$namespace"}, instance)'
    )
    assert variables["namespace"]["includeAll"] is True
    assert variables["namespace"]["allValue"] == ".*"  # outside Kubernetes: no such label
    named = metric_names(" ".join(expr for _, _, expr in targets) + ALERTS.read_text())
    assert named - exported_metrics() == set()


# -- a live Prometheus scraping recoveryd -------------------------------------------------


def scrape_config(target: str) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "recoveryd", "static_configs": [{"targets": [target]}]}],
    }


@contextlib.contextmanager
def prometheus(tmp_path: Path, target: str) -> Iterator[httpx.Client]:
    """A Prometheus server on a free loopback port scraping `target` every second, with
    the chart's alert rules; a client for its HTTP API. Stopped at the end, always."""
    binary = system_tools.path("prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(target)))
    for attempt in range(3):  # a port found free may be taken before Prometheus binds it
        port = free_port()
        log = tmp_path / f"prometheus-{port}.log"
        with log.open("w") as stderr:
            process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
                 f"--storage.tsdb.path={tmp_path / f'tsdb-{port}'}"],
                stdout=subprocess.DEVNULL, stderr=stderr,
            )  # fmt: skip
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as api:
                if ready(process, api):
                    yield api
                    return
            if attempt == 2 or "address already in use" not in log.read_text():
                raise AssertionError(f"prometheus did not start: {log.read_text()}")
        finally:
            stop(process)


def ready(process: subprocess.Popen[bytes], api: httpx.Client) -> bool:
    deadline = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if api.get("/-/ready").status_code == 200:
                return True
        time.sleep(0.1)
    return False


def query(api: httpx.Client, expr: str) -> list[dict[str, Any]]:
    answer = api.get("/api/v1/query", params={"query": expr})
    assert answer.status_code == 200, (expr, answer.text)
    result: list[dict[str, Any]] = answer.json()["data"]["result"]
    return result


def rules(api: httpx.Client) -> list[dict[str, Any]]:
    groups = api.get("/api/v1/rules").json()["data"]["groups"]
    return [rule for group in groups for rule in group["rules"]]


def active_alerts(api: httpx.Client) -> set[str]:
    """The alerts pending or firing."""
    alerts = api.get("/api/v1/alerts").json()["data"]["alerts"]
    return {alert["labels"]["alertname"] for alert in alerts}


def poll(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def recover_with_trouble(served: Served, control: httpx.Client) -> None:
    """Rotate the token (so the token and account limit gauges exist), then recover WORK
    workflow dlqIds through refused calls: an outage of the service long enough to open
    the circuit of DLQ reads, two 429s, and a 400 to the first bulk resume (its dlqIds end
    failed). Also a callback with no signature, and one sent twice."""
    rotated = httpx.post(f"{served.admin_url}/-/rotate-token", timeout=30, verify=LOOPBACK_TLS)
    assert rotated.status_code == 200, rotated.text
    dlq_ids = control.post("/_emulator/dlq", json={"messages": workflows(WORK)}).json()["dlqIds"]
    for fault in (
        {"kind": "rate_limit", "times": 2, "paths": ["/v2/dlq/"]},
        {"kind": "status", "status": 400, "times": 1, "paths": ["/v2/workflows/dlq/resume"]},
    ):
        control.post("/_emulator/faults", json=fault).raise_for_status()
    control.post("/_emulator/outage", json={"mode": "503"}).raise_for_status()
    send_callbacks(served, [*dlq_ids, dlq_ids[0]])
    unsigned = httpx.post(
        f"{served.url}/callbacks",
        content=callback_json("dlq_unsigned"),
        headers={"Content-Type": "application/json"},
        timeout=10,
        verify=LOOPBACK_TLS,
    )
    assert unsigned.status_code == 401
    reads = "get_dlq_message"
    poll(lambda: status(served)["upstream"]["circuits"][reads] == "open", 30, "an open circuit")
    control.delete("/_emulator/outage").raise_for_status()  # the next probe succeeds
    poll(lambda: sum(status(served)["states"][s] for s in FINAL) == WORK, 60, "the recovery")
    assert 0 < status(served)["states"]["failed"] < WORK


@pytest.mark.timeout(180)
@pytest.mark.needs("prometheus")
def test_every_dashboard_query_and_alert_rule_works_on_a_live_daemon(tmp_path: Path) -> None:
    resume_all = tmp_path / "rules.yaml"
    resume_all.write_text(RESUME_ALL)
    service = create_app(emulator_config(execute_runs=False, max_requests_per_second=1000))
    settings = rotation_settings(tmp_path / "credentials.json", RULES=str(resume_all))
    with (
        serve_in_thread(service) as service_url,
        httpx.Client(base_url=service_url, timeout=10) as control,
        serving(tmp_path, SERVICE_URL=service_url, **settings) as served,
        prometheus(tmp_path, served.admin_url.removeprefix("http://")) as api,
    ):
        # Scraped before the work, so the rises of the gauges and counters are seen.
        poll(lambda: bool(query(api, "recoveryd_dlq_ids")), 30, "a first scrape")
        recover_with_trouble(served, control)
        targets = [(title, ref, as_grafana_sends(expr)) for title, ref, expr in dashboard_targets()]

        # A rate has data once its series was scraped twice in the window.
        deadline = time.monotonic() + 30
        while without_data := [target for target in targets if not query(api, target[2])]:
            assert time.monotonic() < deadline, f"panels without data: {without_data}"
            time.sleep(0.2)
        # The failed dlqIds, counted as they fail, scraped and evaluated.
        poll(lambda: "RecoverydDlqIdsFailed" in active_alerts(api), 15, "the failed dlqIds alert")
        evaluated, active = rules(api), active_alerts(api)

    assert sorted(rule["name"] for rule in evaluated) == sorted(alert_names())
    assert [
        (r["name"], r["health"], r["lastError"]) for r in evaluated if r["health"] != "ok"
    ] == []
    assert active & QUIET == set()
