"""The assembled daemon: probes on the public listener, metrics on the admin listener."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import httpx

from tests.account.support import rotation_settings
from tests.pipeline.support import RESUME_ALL, harness
from tests.support import Recoveryd, callback_json, eventually, running_recoveryd, write_locked


async def test_healthz_answers_while_the_process_serves(recoveryd: Recoveryd) -> None:
    """Liveness is 200 with a JSON body."""
    response = await recoveryd.public.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_is_200_when_the_store_answers(recoveryd: Recoveryd) -> None:
    """Ready: the store answers, so a callback sent now is stored."""
    response = await recoveryd.public.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready"}


async def test_without_a_token_callbacks_are_stored_and_the_status_says_why_none_is_sent(
    tmp_path: Path,
) -> None:
    """With only a credentials file named (not written yet), there is no token to call with:
    still ready, since callbacks are stored; `/api/v1/status` names the missing token."""
    settings = {"TOKEN": "", "CREDENTIALS_FILE": str(tmp_path / "credentials.json")}
    async with running_recoveryd(tmp_path, **settings) as recoveryd:
        assert (await recoveryd.post(callback_json("d-1"))).json()["status"] == "accepted"
        assert (await recoveryd.public.get("/readyz")).status_code == 200
        status = (await recoveryd.admin.get("/api/v1/status")).json()
        assert "no token" in status["token"]["problems"][0]


async def test_a_rotation_brings_the_token_the_start_lacked(tmp_path: Path) -> None:
    """The token's problems are read each time: a daemon started with a credentials file
    still to be written has none once the reset (basic auth, no token needed) gives it one."""
    settings = rotation_settings(tmp_path / "credentials.json", TOKEN="")
    async with harness(tmp_path, RESUME_ALL, **settings) as h:
        assert (await h.status())["token"]["problems"] != []
        assert (await h.recoveryd.admin.post("/-/rotate-token", timeout=30)).status_code == 200
        assert (await h.status())["token"]["problems"] == []


async def test_readyz_is_503_while_the_store_does_not_answer(tmp_path: Path) -> None:
    """A store stuck behind another process's lock does not answer in time: not ready."""
    options = {"busy_timeout": 6.0, "read_timeout": 0.1}
    async with running_recoveryd(tmp_path, store_options=options) as recoveryd:
        with write_locked(tmp_path / "recoveryd.db"):
            stuck = asyncio.create_task(recoveryd.post(callback_json("d-stuck")))

            # Not ready once the store's writer is waiting for the lock, well within the
            # busy timeout (after it the commit fails and the store answers again).
            async def not_ready() -> httpx.Response | None:
                response = await recoveryd.public.get("/readyz")
                return response if response.status_code == 503 else None

            response = await eventually(not_ready, 4.0, "/readyz to answer 503")
            assert response.json()["error"] == "not ready: store: the store did not answer in time"
        assert (await stuck).json()["status"] == "accepted"
        assert (await recoveryd.public.get("/readyz")).status_code == 200


async def test_metrics_count_callbacks_by_result_and_show_the_inbox(
    recoveryd: Recoveryd,
) -> None:
    """After accepted, duplicate and invalid callbacks, /metrics shows each and the depth."""
    for dlq_id in ("d-1", "d-2", "d-1"):
        await recoveryd.post(callback_json(dlq_id))
    await recoveryd.post(b'{"status": 500}')
    text = (await recoveryd.admin.get("/metrics")).text
    assert 'recoveryd_callbacks_total{result="accepted"} 2.0' in text
    assert 'recoveryd_callbacks_total{result="duplicate"} 1.0' in text
    assert 'recoveryd_callbacks_total{result="invalid"} 1.0' in text
    assert "recoveryd_inbox_depth 2.0" in text
    assert "recoveryd_callback_request_duration_seconds_count 4.0" in text
    assert recoveryd.metric("recoveryd_store_commit_callbacks_sum") == 3
    assert "_created" not in text  # one series a counter, not two


async def test_the_inbox_depth_is_read_from_the_store_at_scrape_time(
    recoveryd: Recoveryd, tmp_path: Path
) -> None:
    """A callback written by another replica into the same database shows in the depth."""
    with contextlib.closing(sqlite3.connect(tmp_path / "recoveryd.db")) as other, other:
        other.execute(
            "INSERT INTO callbacks (dlq_id, body, received_at) VALUES ('d-elsewhere', x'7b7d', 0)"
        )
    await recoveryd.admin.get("/metrics")
    assert recoveryd.metric("recoveryd_inbox_depth") == 1
