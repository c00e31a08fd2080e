"""Shadow rules (RECOVERYD_SHADOW_RULES) on a running daemon: a candidate decides every
dlqId beside the live rules, its decisions are recorded and counted where they differ,
and none of them reaches the service (the emulator's journal). A shadow file that fails
to load is reported and leaves the live rules deciding; a reload reloads it."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from tests.pipeline.support import BULK_PATHS, RESUME_ALL, Harness, assert_recovered_once, harness
from tests.support import workflows

IGNORE_ALL = """\
version: 1
rules:
  - name: quiet
    match: {}
    action: ignore
"""
RESTART_ALL = """\
version: 1
rules:
  - name: restart-all
    match: {workflow: true}
    action: restart
"""


async def shadow(h: Harness) -> dict[str, object]:
    answer = await h.recoveryd.admin.get("/api/v1/shadow")
    assert answer.status_code == 200, answer.text
    found: dict[str, object] = answer.json()
    return found


async def test_a_shadow_restart_is_recorded_and_never_made(tmp_path: Path) -> None:
    """Live ignores, the shadow restarts: disagreements counted, no bulk call at all."""
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(RESTART_ALL)
    async with harness(tmp_path, IGNORE_ALL, SHADOW_RULES=str(candidate)) as h:
        dlq_ids = await h.seed(workflows(4))
        await h.send_callbacks(dlq_ids)
        assert await h.settled(4) == {"skipped": 4}
        status = await shadow(h)
        counted = h.recoveryd.metric(
            "recoveryd_shadow_disagreements_total", live_rule="quiet", shadow_rule="restart-all"
        )
        loaded = h.recoveryd.metric("recoveryd_shadow_rules_loaded")
        assert await h.bulk_calls() == []
    assert (counted, loaded) == (4, 1)
    assert status["loaded"] is True
    assert status["path"] == str(candidate)
    [group] = status["disagreements"]  # type: ignore[misc]
    assert group == {
        "liveRule": "quiet",
        "liveAction": "ignore",
        "shadowRule": "restart-all",
        "shadowAction": "restart",
        "count": 4,
        "examples": sorted(dlq_ids),
    }


async def test_the_live_rules_alone_make_the_calls(tmp_path: Path) -> None:
    """Live resumes, the shadow ignores: each dlqId resumed once, none restarted, each
    read once (the shadow decides from the live decision's facts)."""
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(IGNORE_ALL)
    async with harness(tmp_path, RESUME_ALL, SHADOW_RULES=str(candidate)) as h:
        dlq_ids = await h.seed(workflows(4))
        await h.send_callbacks(dlq_ids)
        assert await h.settled(4) == {"done": 4}
        journal, runs = await h.journal(), await h.runs()
        status = await shadow(h)
    assert_recovered_once(journal, runs, dlq_ids)
    assert {call["path"] for call in journal if call["path"] in BULK_PATHS} == {BULK_PATHS[0]}
    reads = [call for call in journal if call["method"] == "GET" and "/dlq/" in call["path"]]
    assert len(reads) == 4
    [group] = status["disagreements"]  # type: ignore[misc]
    assert (group["liveRule"], group["shadowRule"], group["count"]) == ("resume-all", "quiet", 4)


async def test_a_shadow_file_that_fails_to_load_is_reported(tmp_path: Path) -> None:
    """The daemon starts and the live rules recover; the status, the metric and the log
    say why no shadow decides."""
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(RESTART_ALL.replace("action: restart", "action: explode"))
    with capture_logs() as logs:
        async with harness(tmp_path, RESUME_ALL, SHADOW_RULES=str(candidate)) as h:
            dlq_ids = await h.seed(workflows(2))
            await h.send_callbacks(dlq_ids)
            assert await h.settled(2) == {"done": 2}
            status = await shadow(h)
            loaded = h.recoveryd.metric("recoveryd_shadow_rules_loaded")
            rows = await h.recoveryd.daemon.store.replay_rows(None, None, 10)
    assert loaded == 0
    assert status["loaded"] is False
    assert status["error"] == "1 problem in the shadow rules file"
    assert "explode" in str(status["problems"])
    assert [row.rule for row in rows] == ["resume-all"] * 2
    refused = [log for log in logs if log["event"].startswith("shadow rules refused")]
    assert refused[0]["path"] == str(candidate)


async def test_a_reload_reloads_the_shadow(tmp_path: Path) -> None:
    """A fixed shadow file loads at the next reload, and decides the next dlqIds."""
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text("version: 1\nrules: [")
    async with harness(tmp_path, IGNORE_ALL, SHADOW_RULES=str(candidate)) as h:
        before = await shadow(h)
        candidate.write_text(RESTART_ALL)
        assert (await h.recoveryd.admin.post("/-/reload")).status_code == 200
        after = await shadow(h)
        dlq_ids = await h.seed(workflows(2))
        await h.send_callbacks(dlq_ids)
        await h.settled(2)
        disagreements = (await shadow(h))["disagreements"]
    assert (before["loaded"], after["loaded"]) == (False, True)
    assert after["error"] is None
    assert [group["count"] for group in disagreements] == [2]  # type: ignore[attr-defined]
