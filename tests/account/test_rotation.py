"""Token rotation against the emulator, in process: scheduled rotations under traffic, a
reset refused, a reset whose answer is lost, and the lockout and its end."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import stat
from pathlib import Path
from typing import Any

import httpx
import structlog
from cryptography.fernet import Fernet
from prometheus_client.parser import text_string_to_metric_families

from daemon.account.credentials_file import Saved
from daemon.account.vault import StoreVault
from daemon.emulator.account import DEFAULT_LIMITS
from daemon.store import open_store
from daemon.upstream import Credentials
from daemon.upstream.client import TOKEN_CHECK_ID
from tests.account.support import RESET, rotation_settings
from tests.pipeline.support import RESUME_ALL, Harness, harness
from tests.support import (
    FAST_ROTATION,
    FAST_TUNING,
    PASSWORD,
    TOKEN,
    USERNAME,
    eventually,
    workflows,
)

# A read of a dlqId that does not exist: 404 with a token that works, 401 without.
TOKEN_PROBE = "/v2/dlq/no-such-id"


async def token_answer(control: httpx.AsyncClient, token: str) -> int:
    """The status the service gives `token` on a read of a dlqId that does not exist."""
    response = await control.get(TOKEN_PROBE, headers={"Authorization": f"Bearer {token}"})
    return response.status_code


async def wait_for_metric(
    h: Harness, name: str, value: float, seconds: float = 20.0, **labels: str
) -> None:
    await eventually(lambda: h.recoveryd.metric(name, **labels) >= value, seconds, name)


async def rotate(h: Harness) -> httpx.Response:
    return await h.recoveryd.admin.post("/-/rotate-token", timeout=30)


def saved(tmp_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / "credentials.json").read_text())
    return data


async def test_scheduled_rotations_under_traffic_never_fail_a_call(tmp_path: Path) -> None:
    """Every second the token is reset while 150 dead letters are being fetched and
    resumed: the old token is refused afterwards, the new one is saved 0600 and in use,
    and not one call to the service failed."""
    settings = rotation_settings(tmp_path / "credentials.json", ROTATE_SCHEDULE="1s")
    async with harness(tmp_path, RESUME_ALL, **settings) as h:
        # A slow account, so the drain takes longer than several rotation intervals.
        await h.control.post("/_emulator/account", json={"max_requests_per_second": 40})
        dlq_ids = await h.seed(workflows(150))
        for wave in range(5):
            await h.send_callbacks(dlq_ids[wave * 30 : (wave + 1) * 30])
            await asyncio.sleep(0.5)
        await wait_for_metric(h, "recoveryd_token_rotations_total", 3, result="success")
        states = await h.settled(150, seconds=60)
        assert states == {"done": 150}

        assert await token_answer(h.control, TOKEN) == 401

        # Rotating every second: between a reset and the save of its answer the file still
        # holds the token just reset, so a refusal then is no fault; ask until a save is in.
        async def saved_token_works() -> bool:
            return await token_answer(h.control, saved(tmp_path)["token"]) == 404

        await eventually(saved_token_works, 10, "a saved token that works")
        assert h.recoveryd.metric("recoveryd_account_limit", limit="requests_per_second") == 40
        retention = h.recoveryd.metric("recoveryd_account_limit_seconds", limit="dlq_retention")
        assert retention == 604_800
        assert h.recoveryd.metric("recoveryd_token_last_rotation_success_timestamp_seconds") > 0
        # Rotating every second: the latest may be under way as the status is read.
        status = await h.status()
        last = status["lastTokenRotation"]
        assert last["result"] == "success" or last["finishedAt"] is None, last
        assert status["token"]["lockedOut"] is False

    # Read once both have stopped (recoveryd finishes a rotation under way first): while
    # they run, the emulator counts a reset before it answers and journals it after, and
    # the file lags the service by a save, so reads made apart could disagree.
    service = h.emulator
    journal = [call for call in service.journal.to_json() if call["path"] != TOKEN_PROBE]
    assert service.account.rotations >= 3
    resets = [call for call in journal if call["path"] == RESET]
    assert len(resets) == service.account.rotations
    # The rotations happened while the pipeline was calling, not before or after it.
    reads = [call["at"] for call in journal if call["path"].startswith("/v2/dlq/")]
    assert any(min(reads) < reset["at"] < max(reads) for reset in resets)
    assert {call["status"] for call in journal} == {200}, "a call failed"
    assert h.recoveryd.metric("recoveryd_token_rotations_total", result="failure") == 0

    current = saved(tmp_path)
    assert current["token"] == service.account.token
    assert current["password"] == service.account.password
    mode = stat.S_IMODE((tmp_path / "credentials.json").stat().st_mode)
    assert mode == 0o600
    assert current["limits"]["max_requests_per_second"] == 40


async def test_a_refused_reset_changes_nothing(tmp_path: Path) -> None:
    """Wrong basic credentials: the service refuses the reset, which is a failure; no
    check is needed, the token in hand keeps working and nothing is written."""
    settings = rotation_settings(tmp_path / "credentials.json", ACCOUNT_PASSWORD="not-the-password")
    async with harness(tmp_path, RESUME_ALL, **settings) as h:
        answer = await rotate(h)
        assert answer.status_code == 502
        assert answer.json()["rotation"]["result"] == "failure"
        assert "401" in answer.json()["error"]
        assert [call["path"] for call in await h.journal()] == [RESET]
        assert not (tmp_path / "credentials.json").exists()
        assert (await h.recoveryd.public.get("/readyz")).status_code == 200
        dlq_ids = await h.seed(workflows(3))
        await h.send_callbacks(dlq_ids)
        assert await h.settled(3) == {"done": 3}


async def test_a_reset_lost_before_it_happened_is_a_failure(tmp_path: Path) -> None:
    """A 503 may come after the change, so the outcome is unknown: the token in hand still
    works, so the reset did not happen and the daemon carries on with it."""
    async with harness(
        tmp_path, RESUME_ALL, **rotation_settings(tmp_path / "credentials.json")
    ) as h:
        await h.fault(kind="status", status=503, times=10, paths=[RESET])
        answer = await rotate(h)
        assert answer.status_code == 502
        rotation = answer.json()["rotation"]
        assert rotation["result"] == "failure"
        assert "still works: the reset did not happen" in rotation["reason"]
        checks = [c for c in await h.journal() if c["path"] == "/v2/dlq/recoveryd-token-check"]
        assert [check["status"] for check in checks] == [404]
        assert h.emulator.account.token == TOKEN
        assert (await h.recoveryd.public.get("/readyz")).status_code == 200
        assert h.recoveryd.metric("recoveryd_token_lockout") == 0


async def test_a_reset_that_times_out_after_succeeding_is_a_lockout(tmp_path: Path) -> None:
    """The service resets the token but its answer never arrives: the old token is
    refused and the new one unknown. recoveryd says so and makes no call until a token
    that works is put in the credentials file, then carries on."""
    # The reset's answer is lost (held 2 s, the call gives up after 0.5 s) and the service
    # acts once the hold is over, at ~2 s; the first check, at ~3.5 s, must come later
    # than that, with room for an emulator or a client that lags on a loaded machine.
    patient = dataclasses.replace(FAST_ROTATION, check_first=3.0)
    async with harness(
        tmp_path,
        RESUME_ALL,
        http_timeout=0.5,
        rotation=patient,
        **rotation_settings(tmp_path / "credentials.json"),
    ) as h:
        await h.fault(kind="latency", seconds=2.0, times=1, paths=[RESET])
        with structlog.testing.capture_logs() as logs:
            answer = await rotate(h)
        assert answer.status_code == 503
        rotation = answer.json()["rotation"]
        assert rotation["result"] == "lockout"
        assert "never received" in rotation["reason"]
        assert h.emulator.account.rotations == 1  # the reset did happen upstream
        assert any(
            entry["log_level"] == "error" and entry["event"].startswith("TOKEN LOCKOUT")
            for entry in logs
        )
        status = await h.status()
        assert "locked out" in status["token"]["problems"][0]
        assert h.recoveryd.metric("recoveryd_token_lockout") == 1
        assert h.recoveryd.metric("recoveryd_token_rotations_total", result="lockout") == 1
        assert status["token"]["lockedOut"] is True
        refused = await rotate(h)  # no rotation while locked out: it could only fail
        assert refused.status_code == 409

        # Work that arrives now waits: no call goes out with a token that is refused.
        calls_before = len(await h.journal())
        dlq_ids = await h.seed(workflows(5))
        await h.send_callbacks(dlq_ids)
        await asyncio.sleep(0.5)
        assert len(await h.journal()) == calls_before
        assert (await h.status())["states"]["received"] == 5

        # The operator puts the token from the service's console in the file.
        (tmp_path / "credentials.json").write_text(json.dumps({"token": h.emulator.account.token}))
        assert await h.settled(5) == {"done": 5}
        assert h.recoveryd.metric("recoveryd_token_lockout") == 0
        status = await h.status()
        assert status["token"]["problems"] == []
        last = status["lastTokenRotation"]
        assert last["result"] == "lockout"
        assert last["resolvedAt"] is not None
        secrets = {TOKEN, PASSWORD, h.emulator.account.token, h.emulator.account.password}
        shown = json.dumps(logs, default=str) + answer.text + json.dumps(status)
        assert not [secret for secret in secrets if secret in shown]


async def test_a_token_reset_elsewhere_locks_out_after_the_first_refusal(tmp_path: Path) -> None:
    """Someone resets the token in the console: the first refused calls lead to one check,
    then to a lockout, instead of every dead letter spending its tries on 401s. No
    dlqId is failed for it, and they all go through once the file has the new token: at
    once, not when the backoffs of the refused fetches end (ten minutes here)."""
    tuning = dataclasses.replace(FAST_TUNING, retry_base=600.0, retry_cap=600.0)
    file = str(tmp_path / "c.json")
    async with harness(tmp_path, RESUME_ALL, tuning=tuning, CREDENTIALS_FILE=file) as h:
        reset = await h.control.post(RESET, auth=(USERNAME, PASSWORD))
        assert reset.status_code == 200
        dlq_ids = await h.seed(workflows(30))
        await h.send_callbacks(dlq_ids)
        await wait_for_metric(h, "recoveryd_token_lockout", 1)
        assert "refuses the token" in (await h.status())["token"]["problems"][0]
        refused = len(await h.journal())
        await asyncio.sleep(0.5)
        journal = await h.journal()
        assert len(journal) == refused, [
            (c["path"], c["status"], c.get("at")) for c in journal
        ]  # nothing more once locked out
        assert {call["status"] for call in journal[1:]} == {401}
        assert (await h.status())["states"]["received"] == 30

        (tmp_path / "c.json").write_text(json.dumps({"token": reset.json()["token"]}))
        assert await h.settled(30) == {"done": 30}
        assert h.recoveryd.metric("recoveryd_token_lockout") == 0


async def test_a_check_answered_after_the_token_changed_locks_nothing_out(
    tmp_path: Path, postgres_url: str
) -> None:
    """A refused fetch starts a check of the token in hand. While the check waits for
    its answer (slow here), `recoveryd set-token` seals the console's new token into the
    store and the replica takes it up: the check's refusal is about the token it sent,
    not the one now in hand, so no lockout follows, and the work goes through. (Locked
    out holding a token that works, a replica stayed so: its watch only looks for a
    token other than the one in hand.)"""
    key = Fernet.generate_key().decode()
    timing = dataclasses.replace(FAST_ROTATION, follow=0.1)
    settings = {"STORE": postgres_url, "CREDENTIALS_KEY": key}
    async with harness(tmp_path, RESUME_ALL, rotation=timing, **settings) as h:
        new = (await h.control.post(RESET, auth=(USERNAME, PASSWORD))).json()
        check = {"kind": "latency", "seconds": 2.0, "paths": [f"/v2/dlq/{TOKEN_CHECK_ID}"]}
        (await h.control.post("/_emulator/faults", json=check)).raise_for_status()
        await h.send_callbacks(await h.seed(workflows(3)))

        async def refused() -> bool:
            return any(call["status"] == 401 for call in await h.journal())

        await eventually(refused, 10, "a refused fetch")
        await asyncio.sleep(0.3)  # the check is on its way, held 2 s by the service
        async with open_store(postgres_url) as store:
            await StoreVault(store, key).write(Saved(Credentials(new["token"])))

        async def checked() -> bool:
            return any(call["path"] == check["paths"][0] for call in await h.journal())

        await eventually(checked, 10, "the check's answer")
        assert await h.settled(3) == {"done": 3}
        assert (await h.status())["token"]["lockedOut"] is False
        assert h.recoveryd.metric("recoveryd_token_lockout") == 0


async def test_a_lockout_leaves_the_one_replica_ready_and_storing_callbacks(
    tmp_path: Path,
) -> None:
    """Locked out, a lone replica still stores every callback, so `/readyz` stays 200: a
    Service whose only endpoint failed readiness would refuse the service's callbacks for
    nothing. The lockout shows in its gauge, the status and the log instead."""
    async with harness(tmp_path, RESUME_ALL, CREDENTIALS_FILE=str(tmp_path / "c.json")) as h:
        reset = await h.control.post(RESET, auth=(USERNAME, PASSWORD))
        assert reset.status_code == 200
        await h.send_callbacks(await h.seed(workflows(1)))
        await wait_for_metric(h, "recoveryd_token_lockout", 1)

        during = await h.seed(workflows(20))
        await h.send_callbacks(during)  # each answered 200
        ready = await h.recoveryd.public.get("/readyz")
        assert ready.status_code == 200, ready.text
        scraped = (await h.recoveryd.admin.get("/metrics")).text
        assert "recoveryd_token_lockout 1.0" in scraped
        assert "recoveryd_ready 1.0" in scraped
        status = await h.status()
        assert status["token"]["lockedOut"] is True
        assert "refuses the token" in status["token"]["problems"][0]
        assert status["states"]["received"] == 21
        assert {(await h.record(dlq_id))["state"] for dlq_id in during} == {"received"}


async def test_no_reset_when_the_new_credentials_could_not_be_saved(tmp_path: Path) -> None:
    """The credentials file's folder is missing: the rotation is refused before the reset,
    since a new token with nowhere to go would be a lockout at the next restart."""
    settings = rotation_settings(tmp_path / "missing" / "credentials.json")
    async with harness(tmp_path, RESUME_ALL, **settings) as h:
        answer = await rotate(h)
        assert answer.status_code == 409
        assert "could not be saved" in answer.json()["error"]
        assert await h.journal() == []
        assert h.emulator.account.rotations == 0


# The account limits as exported: our names, one family a unit (spec section 8).
EXPORTED_LIMITS = {
    "recoveryd_account_limit": {
        "requests_per_second",
        "requests_per_day",
        "requests_per_day_hard",
        "endpoints_per_url_group",
        "dlq_messages",
        "retries",
        "url_groups",
        "schedules",
        "events_size",
        "parallelism",
        "global_parallelism",
        "queues",
    },
    "recoveryd_account_limit_bytes": {"message_size"},
    "recoveryd_account_limit_seconds": {"dlq_retention", "delay", "request_timeout"},
}


async def test_account_limits_are_exported_by_our_names_one_family_a_unit(
    tmp_path: Path,
) -> None:
    """After a rotation, the account record's limits are in three families (counts, bytes,
    seconds) under label values of ours, milliseconds turned into seconds; the service's
    field names (misspelt `_milis` included) appear nowhere in /metrics."""
    async with harness(
        tmp_path, RESUME_ALL, **rotation_settings(tmp_path / "credentials.json")
    ) as h:
        assert (await rotate(h)).status_code == 200
        text = (await h.recoveryd.admin.get("/metrics")).text
        rate = h.emulator.max_requests_per_second
    limits = {
        family.name: {sample.labels["limit"]: sample.value for sample in family.samples}
        for family in text_string_to_metric_families(text)
        if family.name in EXPORTED_LIMITS
    }
    assert {name: set(values) for name, values in limits.items()} == EXPORTED_LIMITS
    assert limits["recoveryd_account_limit"]["requests_per_second"] == rate
    assert limits["recoveryd_account_limit_bytes"]["message_size"] == 1_048_576
    assert limits["recoveryd_account_limit_seconds"] == {
        "dlq_retention": 604_800,  # max_dlq_retention_time_milis: 604800000
        "delay": 604_800,
        "request_timeout": 7200,
    }
    for wire in DEFAULT_LIMITS:
        assert f'"{wire}"' not in text
        assert not wire.startswith("max_") or wire not in text
    assert "recoveryd_account_dlq_retention_seconds" not in text  # now dlq_retention above
    # The credentials file keeps the service's names: it holds what the service said.
    assert saved(tmp_path)["limits"] == DEFAULT_LIMITS | {"max_requests_per_second": rate}


async def test_a_failure_after_a_success_is_exported_newer_and_a_restart_keeps_both(
    tmp_path: Path,
) -> None:
    """A rotation fails after one succeeded: the last failure's time is exported beside
    the last success's, and newer (RecoverydTokenRotationFailing compares the two); a
    restart reads both back from the store."""
    settings = rotation_settings(tmp_path / "credentials.json")
    names = (
        "recoveryd_token_last_rotation_success_timestamp_seconds",
        "recoveryd_token_rotation_last_failure_timestamp_seconds",
    )
    async with harness(tmp_path, RESUME_ALL, **settings) as h:
        assert names[1] not in (await h.recoveryd.admin.get("/metrics")).text
        assert (await rotate(h)).status_code == 200
        await h.fault(kind="status", status=400, times=1, paths=[RESET])
        assert (await rotate(h)).status_code == 502
        success, failure = (h.recoveryd.metric(name) for name in names)
    assert 0 < success < failure

    async with harness(tmp_path, RESUME_ALL, **settings) as h:

        def read_back() -> tuple[float, ...] | None:
            values = tuple(h.recoveryd.metric(name) for name in names)
            return values if all(values) else None

        assert await eventually(read_back, 10, "the timestamps read back") == (success, failure)


async def test_the_last_rotation_success_is_absent_before_the_first_rotation(
    tmp_path: Path,
) -> None:
    """No series at all, not a 0 that reads as a rotation in 1970; there once one worked."""
    name = "recoveryd_token_last_rotation_success_timestamp_seconds"
    async with harness(
        tmp_path, RESUME_ALL, **rotation_settings(tmp_path / "credentials.json")
    ) as h:
        assert name not in (await h.recoveryd.admin.get("/metrics")).text
        assert (await rotate(h)).status_code == 200
        text = (await h.recoveryd.admin.get("/metrics")).text
    assert re.search(rf"^{name} \d", text, re.MULTILINE), text
