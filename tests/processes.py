"""`recoveryd serve`, or the emulator, as a separate process on free loopback ports, as
the tests run them."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from bench.servers import free_port
from daemon.emulator import EmulatorConfig, create_app
from daemon.http.serving import bind
from tests.support import LOOPBACK_TLS, daemon_env


@dataclass
class Served:
    process: subprocess.Popen[str]
    url: str
    admin_url: str
    log: Path  # its stderr: a file, since a pipe nobody reads would block it when full

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> tuple[int, str]:
        """Send `sig`, wait for the exit; the exit status and everything it logged."""
        self.process.send_signal(sig)
        self.process.wait(timeout=30)
        return self.process.returncode, self.logs()

    def logs(self) -> str:
        return self.log.read_text()


def environ(tmp_path: Path, **settings: str) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERYD_")}
    return inherited | daemon_env(tmp_path, **settings)


def run(environ: dict[str, str], log: Path, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """`recoveryd serve`, its stderr appended to `log`; `prefix` runs it under a wrapper
    (`prlimit --nofile=...`)."""
    with log.open("a") as stderr:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [*prefix, sys.executable, "-m", "daemon", "serve"],
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )


@contextlib.contextmanager
def serving(tmp_path: Path, *, prefix: tuple[str, ...] = (), **settings: str) -> Iterator[Served]:
    """`recoveryd serve` on free loopback ports, once /healthz answers; killed at the end.
    A port found free can be taken by another process before serve binds it: then serve
    is started again on other ports (unless the test chose them)."""
    for attempt in range(3):
        port, admin_port = free_port(), free_port()
        ports = {"LISTEN": f"127.0.0.1:{port}", "ADMIN_LISTEN": f"127.0.0.1:{admin_port}"}
        log = tmp_path / f"serve-{port}.log"
        process = run(environ(tmp_path, **(ports | settings)), log, prefix)
        served = Served(process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", log)
        try:
            wait_until_healthy(served)
        except AssertionError:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
            chose_ports = "LISTEN" in settings or "ADMIN_LISTEN" in settings
            if chose_ports or attempt == 2 or "Address already in use" not in served.logs():
                raise
            continue
        break
    try:
        yield served
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def stop(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def wait_until_healthy(served: Served) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if served.process.poll() is not None:
            raise AssertionError(f"serve exited: {served.logs()}")
        with contextlib.suppress(httpx.HTTPError):
            if (
                httpx.get(f"{served.url}/healthz", timeout=1, verify=LOOPBACK_TLS).status_code
                == 200
            ):
                return
        time.sleep(0.05)
    raise AssertionError("serve did not become healthy")


@contextlib.contextmanager
def emulator_process(config: EmulatorConfig) -> Iterator[str]:
    """The emulator in a process of its own; yields its base URL.

    For tests that assert on when calls *arrive*: the service's rate limit is counted in
    one-second windows at arrival. An emulator on a thread of the test's process shares
    the GIL with recoveryd, so a busy moment there delays some arrivals more than others
    and moves calls sent a window apart into one window, which the network between two
    machines does far less. (The client's 50 ms of headroom is for that network.)"""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of this loop
    port_in, port_out = context.Pipe(duplex=False)
    process = context.Process(
        target=_serve_emulator, args=(config, port_out), name="emulator", daemon=True
    )
    process.start()
    port_out.close()
    try:
        if not port_in.poll(60):
            raise RuntimeError("the emulator process did not start")
        yield f"http://127.0.0.1:{port_in.recv()}"
    finally:
        process.terminate()
        process.join(10)


def _serve_emulator(config: EmulatorConfig, port_out: Connection) -> None:
    """The emulator process: bind a free port (calls queue there until it serves), tell
    the parent, serve until SIGTERM."""
    # The service runs on machines of its own; here it shares the CPU with the daemons
    # and the test workers. Where it may (as root, as in CI), it is served before them, so
    # that a loaded machine does not hold arrivals back and then stamp them bunched.
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    sock = bind("127.0.0.1", 0)
    port_out.send(sock.getsockname()[1])
    port_out.close()
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning", lifespan="on"))
    server.run(sockets=[sock])


async def recoveryd(
    tmp_path: Path, *args: str, **settings: str
) -> subprocess.CompletedProcess[str]:
    """`recoveryd ARGS` as a user runs it, with `settings`, off the event loop (the daemon
    it may ask runs on it)."""
    command = [sys.executable, "-m", "daemon", *args]
    return await asyncio.to_thread(
        subprocess.run, command, env=environ(tmp_path, **settings), capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
