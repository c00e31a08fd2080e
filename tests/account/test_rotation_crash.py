"""`recoveryd serve` killed in the middle of a rotation, then started again: with the new
credentials saved it carries on with them; without them it says it is locked out."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx

from tests.account.support import (
    RESET,
    emulator,
    rotate_in_background,
    send_callbacks,
    served_settings,
    status,
)
from tests.processes import serving
from tests.support import LOOPBACK_TLS, TOKEN, faults_taken, wait_for, workflows, write_locked


def rotation_row(database: Path) -> tuple[Any, ...] | None:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        row: tuple[Any, ...] | None = connection.execute(
            "SELECT id, result FROM rotations ORDER BY id DESC LIMIT 1"
        ).fetchone()
    return row


def test_killed_right_after_saving_the_restart_uses_the_new_token(tmp_path: Path) -> None:
    credentials = tmp_path / "credentials.json"
    database = tmp_path / "recoveryd.db"
    with emulator() as (service_url, control, service):
        settings = served_settings(tmp_path, service_url, credentials)
        # The emulator holds the reset for 3 s, ample time to take the database's write
        # lock once the reset is out: the daemon then cannot record the rotation's end,
        # and is killed with the new credentials saved and the rotation still recorded
        # as under way.
        fault = {"kind": "latency", "seconds": 3.0, "times": 1, "paths": [RESET]}
        control.post("/_emulator/faults", json=fault).raise_for_status()
        with serving(tmp_path, **settings) as served:
            rotate_in_background(served)
            wait_for(lambda: rotation_row(database) is not None)
            wait_for(lambda: faults_taken(control))  # the reset is out; the emulator holds it
            with write_locked(database):
                wait_for(lambda: credentials.exists())
                exit_status, _ = served.stop(signal.SIGKILL)
        assert exit_status == -signal.SIGKILL
        assert rotation_row(database) == (1, None)  # under way when the process died
        saved = json.loads(credentials.read_text())
        assert saved["rotation"] == 1
        assert saved["token"] == service.account.token != TOKEN

        # RECOVERYD_TOKEN still holds the old token: the file takes precedence.
        with serving(tmp_path, **settings) as served:
            wait_for(lambda: status(served)["lastTokenRotation"]["result"] is not None)
            last = status(served)["lastTokenRotation"]
            assert last["result"] == "success"
            assert "saved" in last["reason"]
            assert (
                httpx.get(f"{served.url}/readyz", timeout=5, verify=LOOPBACK_TLS).status_code == 200
            )
            calls_before = len(control.get("/_emulator/journal").json())
            dlq_ids = control.post("/_emulator/dlq", json={"messages": workflows(5)}).json()
            send_callbacks(served, dlq_ids["dlqIds"])
            wait_for(lambda: status(served)["states"]["done"] == 5)
        after_restart = control.get("/_emulator/journal").json()[calls_before:]
        assert after_restart
        assert {call["status"] for call in after_restart} == {200}


def test_killed_before_saving_the_restart_reports_a_lockout(tmp_path: Path) -> None:
    """Killed while the reset is at the service, which carries it out for no one: the new
    token never reached recoveryd. The restart finds the rotation under way and the old
    token refused: a lockout, said plainly, with no call made but the check."""
    credentials = tmp_path / "credentials.json"
    database = tmp_path / "recoveryd.db"
    with emulator() as (service_url, control, service):
        settings = served_settings(tmp_path, service_url, credentials)
        # The emulator holds the reset for 5 s: the kill lands well before its answer.
        fault = {"kind": "latency", "seconds": 5.0, "times": 1, "paths": [RESET]}
        control.post("/_emulator/faults", json=fault).raise_for_status()
        with serving(tmp_path, **settings) as served:
            rotate_in_background(served)
            wait_for(lambda: rotation_row(database) is not None)
            wait_for(lambda: faults_taken(control))  # the reset is out; the emulator holds it
            served.stop(signal.SIGKILL)
        wait_for(lambda: service.account.rotations == 1)
        assert not credentials.exists()
        calls_before = len(control.get("/_emulator/journal").json())
        with serving(tmp_path, **settings) as served:
            wait_for(lambda: status(served)["token"]["lockedOut"])
            assert "locked out" in status(served)["token"]["problems"][0]
            # Still ready: the callbacks below are stored, to be recovered once unlocked.
            assert (
                httpx.get(f"{served.url}/readyz", timeout=5, verify=LOOPBACK_TLS).status_code == 200
            )
            metrics = httpx.get(f"{served.admin_url}/metrics", timeout=5, verify=LOOPBACK_TLS).text
            assert "recoveryd_token_lockout 1.0" in metrics
            dlq_ids = control.post("/_emulator/dlq", json={"messages": workflows(3)}).json()
            send_callbacks(served, dlq_ids["dlqIds"])
            time.sleep(0.5)
            _, logs = served.stop()
        assert "TOKEN LOCKOUT" in logs
        assert "never received" in logs
        after_restart = control.get("/_emulator/journal").json()[calls_before:]
        assert [(call["path"], call["status"]) for call in after_restart] == [
            ("/v2/dlq/recoveryd-token-check", 401)
        ]
        assert not credentials.exists()
