"""A user's workflow apps, written with the official SDKs (tests/apps/python, tests/apps/node),
each run as a process of its own on a free loopback port, pointed at a service URL and
holding the tests' token and signing keys; and the Node app's packages, installed from
its lock with `npm ci`."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.servers import free_port
from tests import system_tools
from tests.processes import stop
from tests.support import SIGNING_KEY_CURRENT, SIGNING_KEY_NEXT, TOKEN

APPS = Path(__file__).parent
PYTHON_APP = APPS / "python"
NODE_APP = APPS / "node"
# What `npm ci` needs, and the app: copied to a folder of the session's, where
# node_modules is made (never in the repository, which two workers share).
NODE_FILES = ("package.json", "package-lock.json", "app.mjs")
# npm's codes for a registry it cannot reach: a machine offline, not a defect here.
OFFLINE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ECONNRESET", "ENETUNREACH")


@dataclass
class App:
    """A workflow app running: `url` is its base, the workflow endpoint is `workflow_url`."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path  # its stdout and stderr: a file, as a pipe nobody reads blocks it when full
    sdk: str  # "python" or "node": which SDK serves it

    @property
    def workflow_url(self) -> str:
        return f"{self.url}/workflow"

    def switch(self, *, fail: bool) -> dict[str, Any]:
        """Turn step two's failure on or off; the app's answer."""
        response = httpx.post(f"{self.url}/switch", json={"fail": fail}, timeout=10)
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    def steps(self) -> dict[str, Any]:
        """What the app recorded: `fail`, `runs` (each step's executions), `deliveries`
        (when, headers, status, steps run) and `failures` (the failure function's calls)."""
        response = httpx.get(f"{self.url}/steps", timeout=10)
        response.raise_for_status()
        recorded: dict[str, Any] = response.json()
        return recorded

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


def sdk_env(service_url: str, **extra: str) -> dict[str, str]:
    """The environment of an app: the SDKs' variables for `service_url` with the tests'
    token and signing keys, and `extra` (the app's own, such as WORKFLOW_RETRIES). None of
    the caller's QSTASH_* or UPSTASH_* passes (QSTASH_DEV would start the service's
    own dev server instead)."""
    inherited = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("QSTASH_", "UPSTASH_", "RECOVERYD_"))
    }
    return inherited | {
        "QSTASH_URL": service_url,
        "QSTASH_TOKEN": TOKEN,
        "QSTASH_CURRENT_SIGNING_KEY": SIGNING_KEY_CURRENT,
        "QSTASH_NEXT_SIGNING_KEY": SIGNING_KEY_NEXT,
        "UPSTASH_DISABLE_TELEMETRY": "1",
        **extra,
    }


@contextlib.contextmanager
def python_app(tmp_path: Path, service_url: str, **extra: str) -> Iterator[App]:
    """The FastAPI app under uvicorn, once it answers; stopped at the end."""

    def command(port: int) -> list[str]:
        return [
            sys.executable, "-m", "uvicorn", "app:app", "--app-dir", str(PYTHON_APP),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        ]  # fmt: skip

    with _running("python", command, PYTHON_APP, sdk_env(service_url, **extra), tmp_path) as app:
        yield app


@contextlib.contextmanager
def node_app(tmp_path: Path, installed: Path, service_url: str, **extra: str) -> Iterator[App]:
    """The node:http app from `installed` (a folder `install_node_app` made), once it
    answers; stopped at the end."""
    node = system_tools.path("node")

    def command(port: int) -> list[str]:
        return [node, "app.mjs"]

    env = sdk_env(service_url, **extra)
    with _running("node", command, installed, env, tmp_path, port_variable="PORT") as app:
        yield app


def install_node_app(folder: Path, cache: Path, *, offline: bool = False) -> None:
    """Copy the Node app into `folder` and `npm ci` it there from its lock, with `cache` as
    npm's cache (`offline`: from that cache alone). A registry out of reach skips the test
    (fails under CI)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in NODE_FILES:
        shutil.copy2(NODE_APP / name, folder / name)
    ran = npm_ci(folder, cache, offline=offline)
    if ran.returncode != 0:
        output = ran.stdout + ran.stderr
        if not offline and any(code in output for code in OFFLINE):
            system_tools.unavailable(f"`npm ci` could not reach the npm registry: {output}")
        raise AssertionError(f"npm ci failed in {folder}: {output}")


def npm_ci(folder: Path, cache: Path, *, offline: bool = False) -> subprocess.CompletedProcess[str]:
    """`npm ci` in `folder`, exactly what its package-lock.json pins, integrity checked."""
    command = [system_tools.path("npm"), "ci", "--cache", str(cache), "--no-audit", "--no-fund"]
    return subprocess.run(
        [*command, "--offline"] if offline else command,
        cwd=folder, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@contextlib.contextmanager
def _running(
    name: str,
    command: Callable[[int], list[str]],
    cwd: Path,
    env: dict[str, str],
    tmp_path: Path,
    *,
    port_variable: str | None = None,
) -> Iterator[App]:
    """`command(port)` run in `cwd` on a free port (told in `port_variable` where the app
    reads it there), once GET /steps answers; killed at the end. A port found free can be
    taken before the app binds it: then it starts again on another."""
    for attempt in range(3):
        port = free_port()
        log = tmp_path / f"{name}-app-{port}.log"
        with log.open("w") as output:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(
                command(port),
                cwd=cwd,
                env=env | ({port_variable: str(port)} if port_variable else {}),
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        app = App(process, f"http://127.0.0.1:{port}", log, name)
        try:
            _wait_until_answering(app)
        except AssertionError:
            stop(process)
            taken = any(sign in app.logs() for sign in ("EADDRINUSE", "address already in use"))
            if attempt == 2 or not taken:
                raise
            continue
        break
    try:
        yield app
    finally:
        stop(process)


def _wait_until_answering(app: App, seconds: float = 60) -> None:
    """Until GET /steps answers 200; an exit or the deadline fails with the app's log."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if app.process.poll() is not None:
            raise AssertionError(f"the app exited ({app.process.returncode}): {app.logs()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{app.url}/steps", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"the app did not answer within {seconds} s: {app.logs()}")
