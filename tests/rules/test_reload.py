"""Hot reload on a running daemon: a valid file decides the next callback, an invalid one
changes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from daemon.emulator import create_app
from daemon.http.serving import serve
from daemon.metrics import Metrics
from daemon.rules import FileError
from daemon.rules.live import LiveRules
from tests.support import Recoveryd, callback_json, emulator_config, running_recoveryd, workflows

RULES = """\
version: 1
rules:
  - name: {name}
    match: {{workflow: true}}
    action: {action}
"""


def write_rules(path: Path, name: str, action: str = "resume") -> None:
    path.write_text(RULES.format(name=name, action=action))


async def decided_by(recoveryd: Recoveryd, dlq_id: str) -> tuple[str, str]:
    """Send the callback of `dlq_id` and wait for its decision: (rule, action)."""
    before = decisions(recoveryd)
    response = await recoveryd.post(callback_json(dlq_id, "failure-callback-workflow.json"))
    assert response.json()["status"] == "accepted"
    async with asyncio.timeout(10):
        while True:
            for key, count in decisions(recoveryd).items():
                if count > before.get(key, 0.0):
                    return key
            await asyncio.sleep(0.01)


def decisions(recoveryd: Recoveryd) -> dict[tuple[str, str], float]:
    """recoveryd_decisions_total by (rule, action)."""
    return {
        (sample.labels["rule"], sample.labels["action"]): sample.value
        for metric in recoveryd.registry.collect()
        if metric.name == "recoveryd_decisions"
        for sample in metric.samples
        if sample.name == "recoveryd_decisions_total"
    }


async def seed(service_url: str, count: int) -> list[str]:
    """Workflow entries in the emulator's DLQ; their dlqIds."""
    async with httpx.AsyncClient(base_url=service_url) as control:
        response = await control.post("/_emulator/dlq", json={"messages": workflows(count)})
        response.raise_for_status()
        ids: list[str] = response.json()["dlqIds"]
        return ids


async def test_a_valid_change_decides_the_next_callback(tmp_path: Path) -> None:
    """After POST /-/reload with a new file, the next callback is decided by the new rule."""
    rules = tmp_path / "rules.yaml"
    write_rules(rules, "first")
    async with (
        serve(create_app(emulator_config())) as service_url,
        running_recoveryd(tmp_path, SERVICE_URL=service_url, RULES=str(rules)) as recoveryd,
    ):
        one, two = await seed(service_url, 2)
        assert await decided_by(recoveryd, one) == ("first", "resume")

        write_rules(rules, "second", action="restart")
        response = await recoveryd.admin.post("/-/reload")
        assert response.status_code == 200, response.text
        assert response.json()["rules"] == 1

        assert await decided_by(recoveryd, two) == ("second", "restart")
        assert recoveryd.metric("recoveryd_rules_reloads_total", result="success") == 2
        assert recoveryd.metric("recoveryd_rules_last_reload_successful") == 1


async def test_an_invalid_file_is_refused_and_the_old_rules_keep_deciding(
    tmp_path: Path,
) -> None:
    """A reload of a file with a mistake answers 400 with the problem, and changes nothing."""
    rules = tmp_path / "rules.yaml"
    write_rules(rules, "first")
    async with (
        serve(create_app(emulator_config())) as service_url,
        running_recoveryd(tmp_path, SERVICE_URL=service_url, RULES=str(rules)) as recoveryd,
    ):
        (dlq_id,) = await seed(service_url, 1)
        digest = recoveryd.daemon.rules.current.digest
        rules.write_text(RULES.format(name="second", action="restrat"))

        response = await recoveryd.admin.post("/-/reload")

        assert response.status_code == 400
        assert response.json()["problems"] == [
            f"{rules}:5:13: rules[0].action: must be one of 'resume', 'restart', "
            "'remove-endpoint', 'notify' or 'ignore'; got 'restrat'; did you mean 'restart'?"
        ]
        assert recoveryd.metric("recoveryd_rules_last_reload_successful") == 0
        assert recoveryd.metric("recoveryd_rules_reloads_total", result="failure") == 1
        assert recoveryd.metric("recoveryd_rules_info", sha256=digest, rules="1") == 1
        assert await decided_by(recoveryd, dlq_id) == ("first", "resume")


async def test_a_missing_file_is_refused_and_the_old_rules_stay(tmp_path: Path) -> None:
    """A reload when the file has gone answers 400 saying so; the rules in force stay."""
    rules = tmp_path / "rules.yaml"
    write_rules(rules, "first")
    async with running_recoveryd(tmp_path, RULES=str(rules)) as recoveryd:
        rules.unlink()
        response = await recoveryd.admin.post("/-/reload")
        assert response.status_code == 400
        assert "cannot read" in response.json()["error"]
        rule = recoveryd.daemon.rules.current.rule("first")
        assert rule is not None


def test_loading_the_shipped_rules_warns_of_nothing() -> None:
    """Every action of the shipped rules.yaml and its sweep are carried out: the daemon's
    load of it logs no warning of anything only recorded."""
    with capture_logs() as logs:
        LiveRules(Path(__file__).parents[2] / "rules.yaml", Metrics(CollectorRegistry()))
    assert [entry for entry in logs if entry["log_level"] == "warning"] == []


def series(registry: CollectorRegistry, family: str) -> dict[tuple[str, ...], float]:
    """The samples of `family` (a counter, by its `_total` samples) by label values."""
    return {
        tuple(sample.labels.values()): sample.value
        for metric in registry.collect()
        if metric.name == family
        for sample in metric.samples
        if sample.name == f"{family}_total"
    }


async def test_a_reload_adds_the_new_rules_series_at_zero_and_drops_the_removed_ones(
    tmp_path: Path,
) -> None:
    """The series a rule or sweep can count follow the file: a reload adds a new rule's
    at 0, drops the uncounted series of the rules and sweeps it removed, and leaves the rest."""
    path = tmp_path / "rules.yaml"
    path.write_text(
        "version: 1\nrules:\n"
        "  - {name: kept, match: {responseStatus: 503}, action: restart}\n"
        "  - {name: removed, match: {responseStatus: 500}, action: resume,\n"
        "     budget: {maxRecoveries: 1, within: 1h}}\n"
        "sweeps:\n"
        "  - {name: gone, schedule: 10m, action: restart, filter: {label: x}}\n"
    )
    registry = CollectorRegistry()
    rules = LiveRules(path, Metrics(registry))
    assert series(registry, "recoveryd_budget_exhausted") == {("removed",): 0}
    assert ("gone", "restart") in series(registry, "recoveryd_sweep_recovered")

    path.write_text(
        "version: 1\nrules:\n"
        "  - {name: kept, match: {responseStatus: 503}, action: restart}\n"
        "  - {name: added, match: {}, action: notify, notify: {url: 'https://h.example.com'}}\n"
    )
    await rules.reload()

    assert series(registry, "recoveryd_decisions") == {
        ("", "none"): 0,
        ("kept", "restart"): 0,
        ("added", "notify"): 0,
    }
    assert series(registry, "recoveryd_dlq_ids_failed") == {
        ("", "fetch_refused"): 0,
        ("kept", "call_rejected"): 0,
        ("kept", "check_refused"): 0,
        ("added", "notify_failed"): 0,
    }
    assert series(registry, "recoveryd_notifications") == {
        ("added", "sent"): 0,
        ("added", "retried"): 0,
        ("added", "failed"): 0,
    }
    assert series(registry, "recoveryd_budget_exhausted") == {}
    assert series(registry, "recoveryd_sweep_runs") == {}
    assert series(registry, "recoveryd_sweep_recovered") == {}


async def test_a_reload_keeps_the_counts_of_the_rules_it_keeps(tmp_path: Path) -> None:
    """A rule still in the file keeps its series and its count across a reload."""
    path = tmp_path / "rules.yaml"
    write_rules(path, "kept")
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    rules = LiveRules(path, metrics)
    metrics.decisions.labels("kept", "resume").inc(3)
    path.write_text(path.read_text() + "  - {name: more, match: {}, action: ignore}\n")
    await rules.reload()
    assert series(registry, "recoveryd_decisions")[("kept", "resume")] == 3


async def test_a_reload_keeps_a_removed_rules_counted_series_and_drops_its_uncounted_ones(
    tmp_path: Path,
) -> None:
    """A removed rule's counted series stay, frozen, through every later reload, counted
    before or after its removal; its series still at 0 go."""
    path = tmp_path / "rules.yaml"
    write_rules(path, "early")
    path.write_text(path.read_text() + "  - {name: late, match: {}, action: resume}\n")
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    rules = LiveRules(path, metrics)
    metrics.count_failed("call_rejected", ["early"])
    path.write_text("version: 1\nrules: []\n")
    await rules.reload()
    metrics.count_failed("check_refused", ["late"])  # work left under way ends
    path.write_text("version: 1\nrules: []\nsweeps: []\n")
    await rules.reload()
    assert series(registry, "recoveryd_dlq_ids_failed") == {
        ("", "fetch_refused"): 0,
        ("early", "call_rejected"): 1,
        ("late", "check_refused"): 1,
    }


async def test_the_last_reload_is_kept_with_its_problems_at_their_line(tmp_path: Path) -> None:
    """A refused reload is kept with each problem's file, line and column (the console
    shows it); one that succeeds replaces it."""
    path = tmp_path / "rules.yaml"
    write_rules(path, "kept")
    rules = LiveRules(path, Metrics(CollectorRegistry()))
    assert rules.last_reload is None
    path.write_text(RULES.format(name="kept", action="resume") + "    batch: {maxSize: 0}\n")
    with pytest.raises(FileError):
        await rules.reload()
    refused = rules.last_reload
    assert refused is not None
    assert refused.ruleset is None
    assert refused.error == "1 problem in the rules file"
    assert [problem.split(": ")[0] for problem in refused.problems] == [f"{path}:6:22"]
    write_rules(path, "kept")
    loaded = await rules.reload()
    assert rules.last_reload is not None
    assert rules.last_reload.ruleset is loaded
