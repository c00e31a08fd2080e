"""A sweep survives `kill -9` of `recoveryd serve` mid-run: the run is closed as
interrupted at the next start, a run follows at once, and every selected workflow run
is restarted exactly once, as the emulator saw it."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from tests.processes import serving
from tests.support import LOOPBACK_TLS, emulator_config, wait_for
from tests.sweeps.support import RESTART, interleaved, matching, not_matching, split, sweep_rules
from tests.sweeps.support import sources as made_from


@pytest.fixture
def service_url() -> Iterator[str]:
    config = emulator_config(execute_runs=False, max_requests_per_second=1000)
    with serve_in_thread(create_app(config)) as url:
        yield url


def runs(admin_url: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{admin_url}/api/v1/sweeps", params={"runs": 100}, timeout=5, verify=LOOPBACK_TLS
    ).json()
    found: list[dict[str, Any]] = answer["sweeps"][0]["lastRuns"]
    return list(reversed(found))


def finished(listed: list[dict[str, Any]], count: int) -> list[dict[str, Any]] | None:
    """The first `count` runs with a result, once there are that many."""
    ended = [run for run in listed if run["result"]]
    return ended[:count] if len(ended) >= count else None


def test_a_kill_mid_sweep_neither_loses_nor_repeats_a_run(tmp_path: Path, service_url: str) -> None:
    """Pages answered after 0.8s; serve is killed once the first page is recorded, with
    the second out. The next start closes the run as interrupted and runs the sweep again
    at once (its schedule, now hourly, would not for an hour): the 180 selected runs are
    each restarted exactly once, the rest stay."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(sweep_rules("1s"))
    settings = {"SERVICE_URL": service_url, "RULES": str(rules)}
    slow = {"kind": "latency", "seconds": 0.8, "times": 50, "paths": [RESTART]}
    messages = interleaved(matching(180), not_matching())
    with httpx.Client(base_url=service_url, timeout=10) as control:
        control.post("/_emulator/faults", json=slow).raise_for_status()
        seeded = control.post("/_emulator/dlq", json={"messages": messages})
        selected, others = split(seeded.raise_for_status().json()["dlqIds"], messages)

        with serving(tmp_path, **settings) as served:
            # Killed once page 1 is done and the next is recorded as out: between the two
            # the sweep is in neither state, and a kill there would test a different case.
            wait_for(lambda: page_out_after_one_done(runs(served.admin_url)))
            served.process.kill()
            served.process.wait(timeout=30)
        under_way = pages_under_way(tmp_path / "recoveryd.db")

        def left() -> list[str]:
            return sorted(entry["dlqId"] for entry in control.get("/_emulator/dlq").json())

        # Hourly from now on: the run that finishes the job is the one the start makes.
        rules.write_text(sweep_rules("1h"))
        with serving(tmp_path, **settings) as served:
            wait_for(lambda: left() == sorted(others))
            # Both ended: the interrupted run, and the one the start made (its last page may
            # be done a moment before its result is recorded).
            after = wait_for(lambda: finished(runs(served.admin_url), 2))
        made = control.get("/_emulator/runs").json()
    assert under_way[0] == (1, "done")
    assert under_way[-1][1] == "sending"  # killed with a page out
    assert made_from(made) == dict.fromkeys(selected, 1)
    interrupted = after[0]
    assert interrupted["result"] == "interrupted"
    assert f"while page {under_way[-1][0]} was out" in interrupted["error"]
    assert interrupted["pages"][-1]["outcome"] == "unknown"
    assert sum(len(page["workflowRuns"]) for page in interrupted["pages"]) >= 50
    assert after[1]["startedAt"] >= interrupted["finishedAt"]


def page_out_after_one_done(recorded: list[dict[str, Any]]) -> bool:
    outcomes = [page["outcome"] for run in recorded for page in run["pages"]]
    return "done" in outcomes and outcomes[-1] == "sending"


def pages_under_way(database: Path) -> list[tuple[int, str]]:
    """The pages of the run the store holds as under way: (page, outcome)."""
    with contextlib.closing(sqlite3.connect(database)) as db:
        rows: list[tuple[int, str]] = db.execute(
            "SELECT p.page, p.outcome FROM sweep_runs r JOIN sweep_pages p ON p.run_id = r.id "
            "WHERE r.result IS NULL ORDER BY p.page"
        ).fetchall()
    return rows
