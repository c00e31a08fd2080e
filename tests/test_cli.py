"""The `recoveryd` command as a user runs it: real subprocesses, real output."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
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


def test_dev_shows_recoveryd_deciding_and_recovering_live_then_sums_up() -> None:
    """`recoveryd dev` runs the real daemon against the emulator: a line per decision and
    per service call as they happen, then a summary. A recovered run is not a success
    until its new run succeeds: the summary splits the recovered runs by what became of
    them, in numbers that add up and agree with the live lines, which follow the
    emulator's runs; every failure callback received is counted on one line."""
    result = run("dev", "--duration", "6s")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"dead +wfr_billing_0: POST /billing -> 503 \(3 attempts\)", out)
    assert re.search(r"call +GET /v2/dlq/\S+ -> 200", out)
    assert re.search(r"decided +\S+  restart-billing-on-5xx -> restart\n", out)
    assert re.search(r"decided +\S+  resume-transient-failures -> resume\n", out)
    assert re.search(r"decided +\S+  ignore-canaries -> ignore \(skipped\)", out)
    assert re.search(r"call +POST /v2/workflows/dlq/restart -> 200 \(\d+ dlqIds: ", out)
    assert re.search(r"sent +restart batch \d+: \d+ dlqIds, \d+ new runs", out)
    assert re.search(r"ok +restarted run of \S+: POST /billing -> 200", out)
    live, summary = out.split("\nsummary after ")
    recovered = re.search(
        r"\n  recovered +(\d+)  runs resumed or restarted: "
        r"(\d+) succeeded, (\d+) failed again, (\d+) still running\n",
        summary,
    )
    assert recovered is not None, summary
    runs, succeeded, failed_again, running = map(int, recovered.groups())
    assert runs == succeeded + failed_again + running
    assert runs == sum(int(n) for n in re.findall(r"sent +\w+ batch \d+: .*, (\d+) new runs", live))
    assert succeeded == len(re.findall(r"\bok +(restarted|resumed) run of ", live))
    assert failed_again == len(re.findall(r"\bdead +(restarted|resumed) run of ", live))
    assert succeeded < runs  # /reports fails for good: its resumed runs never succeed
    counts = dict(
        re.findall(r"\n  (stopped|skipped|gone|failed|dry-run|in flight) +(\d+)", summary)
    )
    assert set(counts) >= {"stopped", "skipped", "gone", "failed", "dry-run"}
    received = re.search(r"\n  received +(\d+)  failure callbacks\n", summary)
    assert received is not None
    assert int(received.group(1)) == runs + sum(map(int, counts.values()))
    assert re.search(r"calls made +\d+ .*: \d+\.\d per recovered run", summary)


def test_dev_forever_keeps_running_until_interrupted() -> None:
    """With --forever the URLs are printed and stay up; Ctrl-C ends it with the summary."""
    process = subprocess.Popen(
        [*RECOVERYD, "dev", "--forever"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(60, process.kill)
    watchdog.start()
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while not any(" decided " in line for line in lines):
            line = process.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        [admin] = re.findall(r"admin (http://\S+)", "".join(lines))
        status = httpx.get(admin).json()
        assert sum(status["states"].values()) >= 1
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        watchdog.cancel()
        process.kill()
    assert process.returncode == 0, err
    assert "until Ctrl-C" in "".join(lines)
    assert "\nsummary after " in out


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
