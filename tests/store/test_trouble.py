"""The daemon when its store goes bad under it: database files deleted, or the store full.

Readiness turns 503 within seconds, naming the problem; callbacks are refused with 503
(the service keeps them and retries), so nothing answered 2xx is lost; the log says it
once, not once per callback."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
from structlog.testing import capture_logs

from tests.support import Recoveryd, callback_json, running_recoveryd

NOTICED_WITHIN = 5.0  # the acceptance: /readyz is 503 within 5 s


async def unready_within(recoveryd: Recoveryd, seconds: float = NOTICED_WITHIN) -> httpx.Response:
    deadline = time.monotonic() + seconds
    while (answer := await recoveryd.public.get("/readyz")).status_code == 200:
        assert time.monotonic() < deadline, "readiness did not notice the store's problem"
        await asyncio.sleep(0.1)
    return answer


async def test_deleted_database_files_make_the_daemon_unready_and_refuse_callbacks(
    tmp_path: Path,
) -> None:
    with capture_logs() as logs:
        async with running_recoveryd(tmp_path) as recoveryd:
            assert (await recoveryd.post(callback_json("d-before"))).status_code == 200
            await recoveryd.admin.get("/metrics")
            assert recoveryd.metric("recoveryd_ready") == 1
            for name in ("recoveryd.db", "recoveryd.db-wal", "recoveryd.db-shm"):
                (tmp_path / name).unlink(missing_ok=True)

            ready = await unready_within(recoveryd)
            assert ready.status_code == 503
            assert "deleted" in ready.json()["error"]
            await recoveryd.admin.get("/metrics")
            assert recoveryd.metric("recoveryd_ready") == 0
            for number in range(20):
                refused = await recoveryd.post(callback_json(f"d-after-{number}"))
                assert refused.status_code == 503
                assert "deleted" in refused.json()["error"]
    problems = [entry for entry in logs if entry["event"] == "store problem"]
    assert len(problems) == 2  # the database and its write-ahead log, once each


async def test_a_full_store_makes_the_daemon_unready_and_refuses_callbacks(
    tmp_path: Path,
) -> None:
    with capture_logs() as logs:
        # An empty store has 45 pages (schema 18): a few left for callbacks.
        async with running_recoveryd(tmp_path, store_options={"max_page_count": 50}) as recoveryd:
            answers = []
            for number in range(400):
                body = callback_json(f"d-{number:04}", padding="x" * 3000)
                answers.append((await recoveryd.post(body)).status_code)
                if answers[-1] == 503:
                    break
            assert answers[-1] == 503, "the store never filled"
            assert set(answers[:-1]) == {200}

            ready = await unready_within(recoveryd)
            assert "full" in ready.json()["error"]
            for number in range(20):
                refused = await recoveryd.post(callback_json(f"d-late-{number}"))
                assert refused.status_code == 503
            accepted = answers.count(200)
            status = (await recoveryd.admin.get("/api/v1/status")).json()
            assert sum(status["states"].values()) == accepted  # every 2xx is kept
    assert [entry["problem"] for entry in logs if entry["event"] == "store problem"] == ["full"]
