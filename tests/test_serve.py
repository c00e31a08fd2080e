"""`recoveryd serve` as a process: start, refuse bad settings, stop cleanly, survive kill -9."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.account.support import emulator, send_callbacks, served_settings
from tests.account.support import status as daemon_status
from tests.processes import Served, environ, serving
from tests.support import (
    LOOPBACK_TLS,
    SIGNING_KEY_CURRENT,
    SIGNING_KEY_NEXT,
    TOKEN,
    callback_json,
    signed,
    wait_for,
    workflows,
)


def _refused_start(tmp_path: Path, **settings: str) -> str:
    """Run serve with `settings`, expecting it to refuse; its one line of error."""
    result = subprocess.run(
        [sys.executable, "-m", "daemon", "serve"],
        env=environ(tmp_path, **settings),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    # Log lines may come first (the rules' warnings); the error is the one plain line.
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("{")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_bare_serve_names_every_required_setting_in_one_run(tmp_path: Path) -> None:
    """No settings at all: one run's error names each setting serve needs, a line each,
    so a first start does not take one run per missing setting."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERYD_")}
    result = subprocess.run(
        [sys.executable, "-m", "daemon", "serve"],
        env=inherited, cwd=tmp_path, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    named = {re.search(r"RECOVERYD_\w+", line)[0] for line in result.stderr.strip().splitlines()}
    assert named == {
        "RECOVERYD_SERVICE_URL",
        "RECOVERYD_TOKEN",
        "RECOVERYD_SIGNING_KEY_CURRENT",
    }, result.stderr


def test_every_bad_setting_is_reported_at_once(tmp_path: Path) -> None:
    """A bad value, a misspelt name and a missing key: three lines, one run."""
    result = subprocess.run(
        [sys.executable, "-m", "daemon", "serve"],
        env=environ(tmp_path, LISTEN="8080", SIGNING_KEY_CURRENT="", SIGNING_KEY_NEXT="")
        | {"RECOVERYD_PUBLC_URL": "https://x.example.com"},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3, result.stderr
    assert any("RECOVERYD_LISTEN: must be HOST:PORT" in line for line in lines)
    assert any("did you mean RECOVERYD_PUBLIC_URL?" in line for line in lines)
    assert any("RECOVERYD_SIGNING_KEY_CURRENT: required" in line for line in lines)


def test_serve_takes_callbacks_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    """A callback is accepted over the real listener; SIGTERM drains and exits 0."""
    with serving(tmp_path) as served:
        body = callback_json("d-serve")
        response = httpx.post(
            f"{served.url}/callbacks", content=body, headers=signed(body), verify=LOOPBACK_TLS
        )
        assert response.json() == {"status": "accepted", "dlqId": "d-serve"}
        assert httpx.get(f"{served.url}/readyz", verify=LOOPBACK_TLS).status_code == 200
        metrics = httpx.get(f"{served.admin_url}/metrics", verify=LOOPBACK_TLS).text
        assert 'recoveryd_callbacks_total{result="accepted"} 1.0' in metrics
        status, logs = served.stop()
    assert status == 0
    assert "recoveryd stopped" in logs


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"LISTEN": "8080"}, "Error: RECOVERYD_LISTEN: must be HOST:PORT"),
        ({"STORE": "mysql://db"}, "Error: RECOVERYD_STORE: must be sqlite:///PATH"),
        ({"TOKEN": ""}, "Error: RECOVERYD_TOKEN: required"),
        ({"SERVICE_URL": ""}, "Error: RECOVERYD_SERVICE_URL: required"),
        ({"PUBLC_URL": "https://x"}, "Error: RECOVERYD_PUBLC_URL: not a recoveryd setting"),
        ({"LOG_FORMAT": "xml"}, "Error: RECOVERYD_LOG_FORMAT: must be 'json' or 'console'"),
        ({"ADMIN_TOKEN": " "}, "Error: RECOVERYD_ADMIN_TOKEN: is set but empty"),
        (
            {"SIGNING_KEY_CURRENT": "", "SIGNING_KEY_NEXT": ""},
            "Error: RECOVERYD_SIGNING_KEY_CURRENT: required: without a signing key",
        ),
    ],
)
def test_a_bad_setting_stops_the_start_with_one_line_naming_it(
    tmp_path: Path, settings: dict[str, str], error: str
) -> None:
    """Exit 1 and a single line that starts with the variable's name."""
    assert _refused_start(tmp_path, **settings).startswith(error)


def test_a_store_that_cannot_be_opened_stops_the_start(tmp_path: Path) -> None:
    """A store in a missing folder is named, with the reason, in one line."""
    line = _refused_start(tmp_path, STORE=f"sqlite:///{tmp_path}/missing/recoveryd.db")
    assert line.startswith("Error: RECOVERYD_STORE: cannot open the SQLite store")


def test_a_busy_port_stops_the_start(tmp_path: Path) -> None:
    """A listener that cannot bind is named by its setting."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _refused_start(tmp_path, LISTEN=f"127.0.0.1:{port}")
    assert line.startswith(f"Error: RECOVERYD_LISTEN: cannot listen on 127.0.0.1:{port}")


def test_running_unsigned_must_be_asked_for_and_is_warned_about(tmp_path: Path) -> None:
    """With RECOVERYD_ALLOW_UNSIGNED=true and no keys it starts, and says what that means."""
    settings = {"ALLOW_UNSIGNED": "true", "SIGNING_KEY_CURRENT": "", "SIGNING_KEY_NEXT": ""}
    with serving(tmp_path, **settings) as served:
        status, logs = served.stop()
    assert status == 0
    assert "unsigned callbacks are accepted" in logs


def test_no_secret_reaches_a_log_line_an_error_body_or_a_metric(tmp_path: Path) -> None:
    """Every answer, every metric and every log line of a session with bad input is free
    of the token, the signing keys and the admin token."""
    admin_token = "adm_never-shown-0123456789"
    secrets = [TOKEN, SIGNING_KEY_CURRENT, SIGNING_KEY_NEXT, admin_token]
    with serving(tmp_path, LOG_FORMAT="console", ADMIN_TOKEN=admin_token) as served:
        body = callback_json("d-secrets")
        answers = [
            httpx.post(
                f"{served.url}/callbacks", content=body, headers=headers, verify=LOOPBACK_TLS
            ).text
            for headers in (
                signed(body),
                signed(body, key="wrong-key-" * 4),
                signed(b"other body"),
                {"Content-Type": "application/json", "Service-Signature": SIGNING_KEY_CURRENT},
                {"Content-Type": "text/plain"},
            )
        ]
        answers.append(httpx.get(f"{served.url}/readyz", verify=LOOPBACK_TLS).text)
        answers.append(httpx.get(f"{served.admin_url}/metrics", verify=LOOPBACK_TLS).text)
        refused = {"Authorization": "Bearer adm_never-shown-01234567"}  # a near miss
        answers.append(
            httpx.get(
                f"{served.admin_url}/api/v1/status", headers=refused, verify=LOOPBACK_TLS
            ).text
        )
        _, logs = served.stop()
    assert "recoveryd serving" in logs  # the log did capture the session
    for secret in secrets:
        assert not any(secret in text for text in [*answers, logs])


async def _send_all(url: str, dlq_ids: list[str], acknowledged: set[str]) -> None:
    """POST a signed callback for each id from 16 concurrent senders; the ids answered
    200 go into `acknowledged`. Sending stops at the first connection error."""
    queue = list(reversed(dlq_ids))

    async def sender(client: httpx.AsyncClient) -> None:
        while queue:
            dlq_id = queue.pop()
            body = callback_json(dlq_id)
            try:
                response = await client.post("/callbacks", content=body, headers=signed(body))
            except httpx.TransportError:
                return  # the daemon is gone
            if response.status_code == 200:
                acknowledged.add(dlq_id)

    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        await asyncio.gather(*(sender(client) for _ in range(16)))


def _stored(database: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        return [dlq_id for (dlq_id,) in connection.execute("SELECT dlq_id FROM callbacks")]


def test_every_acknowledged_callback_survives_kill_9_exactly_once(tmp_path: Path) -> None:
    """Concurrent senders, SIGKILL midway, a restart and the service's retries: every
    callback answered 200 before the kill is stored, and every dlqId is stored once."""
    # Killed after 500 acknowledgements of 1,000: midway, with as many still to come
    # (the resend of all 1,000 then meets 500 or so duplicates and the rest new).
    dlq_ids = [f"d-{i:05d}" for i in range(1000)]
    acknowledged: set[str] = set()
    with serving(tmp_path) as served:
        sending = _threaded(_send_all(served.url, dlq_ids, acknowledged))
        while len(acknowledged) < 500:
            time.sleep(0.005)
        status, _ = served.stop(signal.SIGKILL)
        sending.join(30)
    assert status == -signal.SIGKILL
    assert 500 <= len(acknowledged) < len(dlq_ids), "the kill came too late to mean anything"
    stored = _stored(tmp_path / "recoveryd.db")
    assert acknowledged <= set(stored)
    with serving(tmp_path) as served:  # the service retries everything it has no 2xx for
        asyncio.run(_send_all(served.url, dlq_ids, acknowledged))
        served.stop()
    stored = _stored(tmp_path / "recoveryd.db")
    assert sorted(stored) == dlq_ids


def _threaded(coroutine: Coroutine[Any, Any, None]) -> threading.Thread:
    thread = threading.Thread(target=asyncio.run, args=(coroutine,))
    thread.start()
    return thread


def test_rules_with_a_mistake_stop_the_start_with_every_problem(tmp_path: Path) -> None:
    """Exit 1, naming RECOVERYD_RULES, then each problem as PATH:LINE:COL: path: message."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 2\nrules:\n  - name: a\n    match: {}\n    action: restrat\n")
    result = subprocess.run(
        [sys.executable, "-m", "daemon", "serve"],
        env=environ(tmp_path, RULES=str(rules)),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: RECOVERYD_RULES: the rules file has problems:",
        f"{rules}:1:10: version: must be 1; got 2",
        f"{rules}:5:13: rules[0].action: must be one of 'resume', 'restart', "
        "'remove-endpoint', 'notify' or 'ignore'; got 'restrat'; did you mean 'restart'?",
    ]


def _rules_sha(served: Served) -> str:
    metrics = httpx.get(f"{served.admin_url}/metrics", verify=LOOPBACK_TLS).text
    (line,) = (line for line in metrics.splitlines() if line.startswith("recoveryd_rules_info{"))
    return line.split('sha256="')[1].split('"')[0]


def test_sighup_reloads_the_rules_and_refuses_a_broken_file(tmp_path: Path) -> None:
    """SIGHUP puts a changed file in force; a broken one is logged and changes nothing."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nrules: []\n")
    with serving(tmp_path, RULES=str(rules), LOG_FORMAT="console") as served:
        first = _rules_sha(served)
        rules.write_text("version: 1\nrules:\n  - {name: all, match: {}, action: ignore}\n")
        served.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while _rules_sha(served) == first and time.monotonic() < deadline:
            time.sleep(0.05)
        second = _rules_sha(served)
        assert second != first

        rules.write_text("version: 1\nrules: [{name: x}]\n")
        served.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        metrics = ""
        while "recoveryd_rules_last_reload_successful 0.0" not in metrics:
            assert time.monotonic() < deadline, metrics
            time.sleep(0.05)
            metrics = httpx.get(f"{served.admin_url}/metrics", verify=LOOPBACK_TLS).text
        assert _rules_sha(served) == second
        status, logs = served.stop()
    assert status == 0
    assert "rules refused; the running rules stay" in logs
    assert "rules[0].match: is required" in logs


def test_each_server_lifecycle_event_is_logged_once(tmp_path: Path) -> None:
    """serve runs a uvicorn server per listener (public and admin); the log still says
    once that the process started, is shutting down and finished."""
    with serving(tmp_path) as served:
        status, logs = served.stop()
    assert status == 0
    for event in ("Started server process", "Shutting down", "Finished server process"):
        assert logs.count(event) == 1, logs


def test_calls_to_the_service_are_not_logged_a_line_each(tmp_path: Path) -> None:
    """httpx would log an INFO line ("HTTP Request: GET ...") for every call to the
    service; the daemon's own lines say what the calls were for."""
    with emulator() as (service_url, control, _):
        settings = served_settings(tmp_path, service_url, tmp_path / "credentials.json")
        with serving(tmp_path, **settings) as served:
            dlq_ids = control.post("/_emulator/dlq", json={"messages": workflows(2)}).json()
            send_callbacks(served, dlq_ids["dlqIds"])
            wait_for(lambda: daemon_status(served)["states"]["done"] == 2)
            exit_status, logs = served.stop()
        calls = control.get("/_emulator/journal").json()
    assert exit_status == 0
    assert len(calls) >= 3  # two reads and a resume, at least
    assert "recoveryd serving" in logs  # the log did capture the session
    assert "HTTP Request:" not in logs
