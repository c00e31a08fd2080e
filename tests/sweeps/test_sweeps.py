"""Sweeps end to end: recoveryd with a sweep on a short interval against the emulator,
over real sockets. What the service did is read back from the emulator (its runs, its
DLQ, its journal), what recoveryd recorded from its admin API and metrics."""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.support import Harness, harness
from tests.support import eventually
from tests.sweeps.support import (
    FILTER,
    LIST,
    RESTART,
    recovered_ids,
    seed,
    sources,
    sweep_rules,
    sweeps,
)
from tests.sweeps.support import finished_runs as runs_of


async def dlq_ids(h: Harness) -> list[str]:
    return [entry["dlqId"] for entry in (await h.control.get("/_emulator/dlq")).json()]


async def restart_calls(h: Harness) -> list[dict[str, Any]]:
    return [call for call in await h.journal() if call["path"] == RESTART]


def query(call: dict[str, Any]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, value in call["query"]:
        found.setdefault(name, []).append(value)
    return found


async def test_a_sweep_restarts_exactly_what_its_filter_selects_page_by_page(
    tmp_path: Path,
) -> None:
    """120 matching runs among runs that miss the filter by one condition each: the first
    run restarts exactly the 120 (labels OR-ed, the rest AND-ed, both dates included) in
    pages of 50 by filter and cursor, with the overrides, and records each run made."""
    async with harness(tmp_path, sweep_rules("2s")) as h:
        selected, others = await seed(h.control, 120)
        [first, *_] = await runs_of(h.recoveryd.admin, 1)
        calls = (await restart_calls(h))[:3]
        made = await h.runs()
        assert sorted(await dlq_ids(h)) == sorted(others)
        status = await h.status()
    assert sources(made) == dict.fromkeys(selected, 1)
    assert {run["mode"] for run in made} == {"restart"}
    assert {(run["rawHeaders"]["Service-Retries"], run["rawHeaders"]["Service-Label"])
            for run in made} == {("2", "swept")}  # fmt: skip
    assert first["result"] == "success"
    assert (first["recovered"], first["pageCount"]) == (120, 3)
    assert first["filter"] == FILTER
    assert sorted(recovered_ids([first])) == sorted(run["workflowRunId"] for run in made)
    pages = [(page["count"], len(page["workflowRuns"]), page["outcome"]) for page in first["pages"]]
    assert pages == [(50, 50, "done"), (50, 50, "done"), (50, 20, "done")]
    assert [page["cursor"] is None for page in first["pages"]] == [True, False, False]
    assert first["pages"][-1]["nextCursor"] == ""
    for call in calls:
        sent = query(call)
        assert "dlqIds" not in sent
        assert sent["count"] == ["50"]
        assert sorted(sent["label"]) == ["billing", "search"]
        assert sent["fromDate"] == [str(FILTER["fromDate"])]
        assert sent["toDate"] == [str(FILTER["toDate"])]
        assert sent["failureFunctionState"] == ["CALLBACK_FAIL"]
        assert sent["callerIp"] == [FILTER["callerIp"]]
    assert status["sweeps"]["scheduled"] == 1
    # The status shows the newest run: the first, finished, or a later one (every 2s)
    # already under way, which has no result yet.
    newest = status["sweeps"]["lastRuns"]["restart-billing"]
    assert newest["id"] >= first["id"]
    assert newest["result"] in (("success",) if newest["id"] == first["id"] else ("success", None))
    assert (
        h.recoveryd.metric(
            "recoveryd_sweep_recovered_total", sweep="restart-billing", action="restart"
        )
        == 120
    )
    assert (
        h.recoveryd.metric("recoveryd_sweep_runs_total", sweep="restart-billing", result="success")
        >= 1
    )
    assert (
        h.recoveryd.metric(
            "recoveryd_sweep_last_success_timestamp_seconds", sweep="restart-billing"
        )
        >= first["finishedAt"]
    )


async def test_a_run_stops_at_max_per_run_and_the_next_run_goes_on(tmp_path: Path) -> None:
    """maxPerRun 70 of 120: the first run asks for 50 then 20 and stops; the next run
    (a fresh walk: the 70 have left the DLQ) restarts the other 50; none twice."""
    async with harness(tmp_path, sweep_rules("3s", maxPerRun=70)) as h:
        selected, others = await seed(h.control, 120)
        [first] = await runs_of(h.recoveryd.admin, 1)
        after_first = sources(await h.runs())
        first_calls = [query(call)["count"] for call in await restart_calls(h)]
        runs = await runs_of(h.recoveryd.admin, 2)
        made = await h.runs()
        assert sorted(await dlq_ids(h)) == sorted(others)
    assert (first["recovered"], [page["count"] for page in first["pages"]]) == (70, [50, 20])
    assert first["pages"][-1]["nextCursor"] != ""
    assert first_calls == [["50"], ["20"]]
    assert sum(after_first.values()) == 70
    assert (runs[1]["result"], runs[1]["recovered"]) == ("success", 50)
    assert sources(made) == dict.fromkeys(selected, 1)


async def test_an_interval_fires_again_and_again_without_overlapping_runs(
    tmp_path: Path,
) -> None:
    """Every 1s, but each run takes longer (pages answered after 0.6s): a fire while a
    run is under way is skipped, so the runs follow one another, never two at once."""
    async with harness(tmp_path, sweep_rules("1s", maxPerRun=100)) as h:
        await h.fault(kind="latency", seconds=0.6, times=100, paths=[RESTART])
        selected, _ = await seed(h.control, 250)
        runs = await runs_of(h.recoveryd.admin, 3, seconds=60)
        made = await h.runs()
    finished = [run for run in runs if run["result"] is not None]
    assert len(finished) >= 3
    for earlier, later in itertools.pairwise(finished):
        assert later["startedAt"] >= earlier["finishedAt"]
    assert [run["result"] for run in finished] == ["success"] * len(finished)
    assert all(count == 1 for count in sources(made).values())
    assert set(sources(made)) <= set(selected)


async def test_a_lost_answer_is_not_repeated_and_the_next_run_recovers_the_rest(
    tmp_path: Path,
) -> None:
    """The service carries out the first page but its answer cannot be read: that page
    is recorded `unknown` and the run ends there, the call not repeated blind. The next
    run restarts what is left; every selected run is restarted exactly once."""
    async with harness(tmp_path, sweep_rules("2s")) as h:
        await h.fault(kind="corrupt_gzip", carriedOut=True, times=1, paths=[RESTART])
        selected, _ = await seed(h.control, 120)
        runs = await runs_of(h.recoveryd.admin, 2)
        made = await h.runs()
        calls = await restart_calls(h)
    first, second = runs[0], runs[1]
    assert first["result"] == "unknown"
    assert "not repeated" in first["error"]
    assert [page["outcome"] for page in first["pages"]] == ["unknown"]
    assert calls[0]["fault"] == "corrupt_gzip"
    assert calls[1]["at"] >= second["startedAt"]  # the page was not sent again by run 1
    assert (second["result"], second["recovered"]) == ("success", 70)
    assert sources(made) == dict.fromkeys(selected, 1)
    assert (
        h.recoveryd.metric("recoveryd_sweep_runs_total", sweep="restart-billing", result="unknown")
        == 1
    )


async def test_a_refused_page_fails_the_run_and_the_next_run_does_it(tmp_path: Path) -> None:
    """A 400 is surely not carried out: the run ends `failure` with the reason, nothing
    restarted by it; the next run restarts them all."""
    async with harness(tmp_path, sweep_rules("2s")) as h:
        await h.fault(kind="status", status=400, times=1, paths=[RESTART])
        selected, _ = await seed(h.control, 60)
        runs = await runs_of(h.recoveryd.admin, 2)
        made = await h.runs()
    assert (runs[0]["result"], runs[0]["recovered"]) == ("failure", 0)
    assert [page["outcome"] for page in runs[0]["pages"]] == ["refused"]
    assert "400" in runs[0]["error"]
    assert (runs[1]["result"], runs[1]["recovered"]) == ("success", 60)
    assert sources(made) == dict.fromkeys(selected, 1)


@pytest.mark.parametrize("where", ["sweep", "defaults", "setting"])
async def test_a_dry_run_selects_without_acting(tmp_path: Path, where: str) -> None:
    """dryRun on the sweep, defaults.dryRun or RECOVERYD_DRY_RUN: the run lists what the
    filter selects (the listing, never a bulk call) and records it; the DLQ is untouched."""
    rules = sweep_rules("2s", **({"dryRun": True} if where == "sweep" else {}))
    if where == "defaults":
        rules = rules.replace("rules: []", "defaults: {dryRun: true}\nrules: []")
    settings = {"DRY_RUN": "true"} if where == "setting" else {}
    async with harness(tmp_path, rules, **settings) as h:
        selected, others = await seed(h.control, 130)
        [run, *_] = await runs_of(h.recoveryd.admin, 1)
        journal = await h.journal()
        left = await dlq_ids(h)
        made = await h.runs()
        [sweep] = await sweeps(h.recoveryd.admin)
    assert (run["result"], run["dryRun"], run["recovered"], run["selected"]) == (
        "dry-run", True, 0, 130,
    )  # fmt: skip
    listed = [entry["dlqId"] for page in run["pages"] for entry in page["selected"]]
    assert sorted(listed) == sorted(selected)
    assert [page["outcome"] for page in run["pages"]] == ["listed", "listed"]
    assert not [call for call in journal if call["method"] == "POST"]
    assert {call["path"] for call in journal} == {LIST}
    assert sorted(left) == sorted(selected + others)
    assert made == []
    assert sweep["dryRun"] is True


async def test_a_reload_reschedules_adds_and_removes_sweeps(tmp_path: Path) -> None:
    """A new sweep is scheduled and runs, a removed one leaves the API and its schedule,
    and a changed schedule takes effect at once."""
    async with harness(tmp_path, sweep_rules("1h", name="hourly")) as h:
        [hourly] = await sweeps(h.recoveryd.admin)
        rules = tmp_path / "rules.yaml"
        rules.write_text(sweep_rules("1s", name="often"))
        assert (await h.recoveryd.admin.post("/-/reload")).status_code == 200
        selected, _ = await seed(h.control, 10)
        [run, *_] = await runs_of(h.recoveryd.admin, 1, name="often")
        [often] = await sweeps(h.recoveryd.admin)
        rules.write_text(sweep_rules("1h", name="often"))
        assert (await h.recoveryd.admin.post("/-/reload")).status_code == 200
        [slowed] = await sweeps(h.recoveryd.admin)
        made = await h.runs()
    assert hourly["lastRuns"] == []
    assert abs(hourly["nextRunAt"] - (time.time() + 3600)) < 60
    assert often["name"] == "often"
    assert run["result"] == "success"
    assert sources(made) == dict.fromkeys(selected, 1)
    assert slowed["nextRunAt"] - time.time() > 3500


async def test_a_stop_mid_run_ends_it_at_the_end_of_its_page(tmp_path: Path) -> None:
    """SIGTERM's shutdown while a page is out: the page is answered and recorded, then
    the run ends `interrupted`; no page is left with its outcome unknown."""
    async with harness(tmp_path, sweep_rules("1h")) as h:
        # Page 1 answered soon; page 2 held long enough for the stop to come while it is out.
        await h.fault(kind="latency", seconds=0.5, times=1, paths=[RESTART])
        await h.fault(kind="latency", seconds=5, times=10, paths=[RESTART])
        await seed(h.control, 150)
        # Scheduled once the DLQ is seeded, so that the first run has the whole of it.
        (tmp_path / "rules.yaml").write_text(sweep_rules("1s"))
        assert (await h.recoveryd.admin.post("/-/reload")).status_code == 200

        async def page_2_out() -> bool:
            return [page["outcome"] for page in await first_pages(h)] == ["done", "sending"]

        await eventually(page_2_out, 30, "page 1 done and page 2 out")
    with contextlib.closing(sqlite3.connect(tmp_path / "recoveryd.db")) as db:
        [(result, error)] = db.execute("SELECT result, error FROM sweep_runs").fetchall()
        outcomes = [row[0] for row in db.execute("SELECT outcome FROM sweep_pages ORDER BY page")]
    assert result == "interrupted"
    assert "stopped after page 2" in error
    assert outcomes == ["done", "done"]


async def first_pages(h: Harness) -> list[dict[str, Any]]:
    [sweep] = await sweeps(h.recoveryd.admin)
    return sweep["lastRuns"][-1]["pages"] if sweep["lastRuns"] else []
