"""The `recoveryd` command as a user runs it: real subprocesses, real output."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

RECOVERYD = [sys.executable, "-m", "daemon"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RECOVERYD, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_help_lists_the_commands() -> None:
    """`python -m daemon --help` is the recoveryd command."""
    result = run("--help")
    assert result.returncode == 0
    assert "dev" in result.stdout
    assert "emulator" in result.stdout


def test_dev_runs_the_five_operations_and_exits_zero() -> None:
    """`recoveryd dev` fails deliveries for real, then recovers them through the client."""
    result = run("dev", "--duration", "45s")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "signature valid" in out
    assert "GET /v2/dlq/" in out
    assert "has left the DLQ (404)" in out
    assert "POST /v2/workflows/dlq/restart 200" in out
    assert "DELETE /v2/topics/orders/endpoints 200" in out
    assert "orders now has: fulfilment" in out
    assert "POST /service/user/rotatetoken 200" in out
    assert "4 of 4 recovered runs completed" in out
    assert "stopped after" not in out


def test_dev_refuses_a_malformed_duration() -> None:
    """A bad --duration is a usage error that says what a duration looks like."""
    result = run("dev", "--duration", "30 seconds")
    assert result.returncode == 2
    assert "e.g. 30s" in result.stderr


def test_emulator_serves_until_terminated() -> None:
    """`recoveryd emulator` answers on its port, shows only the credentials it made up,
    and stops cleanly on SIGTERM."""
    port = free_port()
    env = os.environ | {"EMULATOR_TOKEN": "tok-cli", "EMULATOR_PASSWORD": "pw-cli"}
    process = subprocess.Popen(
        [*RECOVERYD, "emulator", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx.get(
                    f"http://127.0.0.1:{port}/v2/dlq/1-0",
                    headers={"Authorization": "Bearer tok-cli"},
                )
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the emulator did not start"
                time.sleep(0.1)
        assert response.status_code == 404
        assert response.json() == {"error": response.json()["error"]}
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert "tok-cli" not in out + err
    assert "pw-cli" not in out + err
    assert "emulator signing_key_current: sig_" in out  # generated, so shown once
