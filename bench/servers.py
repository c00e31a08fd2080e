"""The servers the benchmarks measure, each its own process on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 30.0
STOP_TIMEOUT = 40.0  # recoveryd drains for up to 30 s after SIGTERM
RECEIVER_ONLY = "receiver, no store"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_UNSAFE_IN_FILE_NAME = re.compile(r"[^\w.@-]+")


class ServerError(Exception):
    """A server did not start or stop as it should; the message carries its log's tail."""


@dataclass
class Server:
    """A server process: where it listens, where it logs, and how much CPU it used."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    admin_port: int | None = None
    exit_status: int | None = None

    @property
    def host(self) -> str:
        return HOST

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu_seconds(self) -> float:
        """User and system CPU time of the process so far, all its threads included."""
        return stat_cpu_seconds(proc_stat(self.pid))

    def stop(self) -> int:
        """SIGTERM, then wait for the exit; the exit status (negative: killed by a signal)."""
        if self.exit_status is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.exit_status = self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.exit_status = self.process.wait()
                raise ServerError(
                    f"{self.name} did not stop within {STOP_TIMEOUT:.0f} s of SIGTERM"
                    + log_tail(self.log)
                ) from None
        return self.exit_status


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the parenthesised command name: the parent's pid
    is [1], utime and stime [11] and [12], cutime and cstime (of ended children waited
    for) [13] and [14], in clock ticks."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def stat_cpu_seconds(fields: list[str], *, ended_children: bool = False) -> float:
    """User and system CPU time in a process's `proc_stat` fields, all its threads included,
    and with `ended_children` that of its children that ended."""
    ticks = int(fields[11]) + int(fields[12])
    if ended_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _CLOCK_TICKS


def free_port() -> int:
    """A loopback port nothing listens on right now, for a server started next to bind.
    Chosen at random below the kernel's range of ephemeral ports: a port the kernel handed
    out (bind to 0) may be given to an outgoing connection before the server binds it, and
    a random one is seldom chosen twice by processes picking at once (the tests' workers)."""
    first_ephemeral = _first_ephemeral_port()
    for _ in range(100):
        port = random.randrange(10_000, first_ephemeral)
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # all taken: whatever the kernel gives
        sock.bind((HOST, 0))
        given: int = sock.getsockname()[1]
        return given


def _first_ephemeral_port() -> int:
    try:
        low = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
        return max(int(low), 10_001)
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def log_tail(log: Path, lines: int = 10) -> str:
    """The last lines of a server's log, to append to an error about it."""
    text = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
    return "\n  " + "\n  ".join(text) if text else " (its log is empty)"


@contextlib.contextmanager
def raw_server(workdir: Path) -> Iterator[Server]:
    """bench.baselines' raw asyncio server, which answers without parsing."""
    port = free_port()
    command = [sys.executable, "-m", "bench.baselines", "--host", HOST, "--port", str(port)]
    with _running("raw asyncio server", command, port, workdir, "/") as server:
        yield server


def _uvicorn(app: str, port: int) -> list[str]:
    """uvicorn serving `app` as recoveryd's listener is configured (daemon/http/serving.py):
    one process, uvloop, httptools, no access log, no lifespan."""
    return [
        sys.executable, "-m", "uvicorn", app,
        "--host", HOST, "--port", str(port),
        "--loop", "uvloop", "--http", "httptools",
        "--no-access-log", "--log-level", "warning", "--lifespan", "off",
    ]  # fmt: skip


@contextlib.contextmanager
def bare_server(workdir: Path) -> Iterator[Server]:
    """bench.baselines' bare ASGI app under uvicorn, configured as recoveryd's listener is."""
    port = free_port()
    with _running("bare uvicorn", _uvicorn("bench.baselines:bare_app", port), port, workdir,
                  "/") as server:  # fmt: skip
        yield server


@contextlib.contextmanager
def naive_server(workdir: Path, store: Path, signing_key: str, issuer: str) -> Iterator[Server]:
    """bench.naive's FastAPI receiver under the same uvicorn, storing into `store`."""
    port = free_port()
    settings = {"BENCH_NAIVE_DB": str(store), "BENCH_NAIVE_KEY": signing_key,
                "BENCH_NAIVE_ISSUER": issuer}  # fmt: skip
    command = _uvicorn("bench.naive:app", port)
    with _running("naive FastAPI", command, port, workdir, "/docs", settings) as server:
        yield server


@contextlib.contextmanager
def receiver_server(workdir: Path, signing_key: str, issuer: str) -> Iterator[Server]:
    """bench.receiver_only: recoveryd's listener and receiver, a store that keeps nothing."""
    port = free_port()
    settings = {"BENCH_RECEIVER_KEY": signing_key, "BENCH_RECEIVER_ISSUER": issuer}
    command = [sys.executable, "-m", "bench.receiver_only", "--host", HOST, "--port", str(port)]
    with _running(RECEIVER_ONLY, command, port, workdir, "/", settings) as server:
        yield server


@contextlib.contextmanager
def recoveryd_server(
    workdir: Path,
    store: Path | str,
    signing_key: str,
    *,
    name: str = "recoveryd serve",
    service_url: str = "http://service.invalid",
    rules: Path = Path(__file__).parent.parent / "rules.yaml",
    token: str = "tok_bench",
    more_settings: Mapping[str, str] | None = None,
    repo: Path = REPO,
) -> Iterator[Server]:
    """`recoveryd serve` as shipped on a SQLite store at `store` (or the store a URL
    names: RECOVERYD_STORE), checking signatures with `signing_key`, plus `more_settings`
    (RECOVERYD_* variables), called `name` in reports and its log's name, run from the
    source tree `repo` (this one by default; see `checkout`). By default nothing
    answers at `service_url`: each accepted callback's fetch fails and backs off in the
    background, off the ingest path that is measured."""
    port, admin_port = free_port(), free_port()
    settings = {
        "RECOVERYD_SERVICE_URL": service_url,
        "RECOVERYD_RULES": str(rules),
        "RECOVERYD_TOKEN": token,
        "RECOVERYD_SIGNING_KEY_CURRENT": signing_key,
        "RECOVERYD_LISTEN": f"{HOST}:{port}",
        "RECOVERYD_ADMIN_LISTEN": f"{HOST}:{admin_port}",
        "RECOVERYD_STORE": store if isinstance(store, str) else f"sqlite:///{store}",
        "RECOVERYD_LOG_FORMAT": "json",
    } | dict(more_settings or {})
    command = [sys.executable, "-m", "daemon", "serve"]
    with _running(name, command, port, workdir, "/readyz", settings, admin_port, repo) as server:
        yield server


@contextlib.contextmanager
def checkout(revision: str, workdir: Path) -> Iterator[Path]:
    """This repository's source at `revision` (anything git names: a commit, a branch,
    HEAD~3) in a worktree under `workdir`, removed at the end. `python -m daemon` run
    from it runs that revision's daemon: the current directory comes first on the
    module path."""
    tree = workdir / "against"
    git = ["git", "-C", str(REPO), "worktree"]
    added = subprocess.run(
        [*git, "add", "--detach", "--quiet", str(tree), revision], capture_output=True, text=True
    )
    if added.returncode != 0:
        raise ServerError(f"cannot check out {revision!r}: {added.stderr.strip()}")
    try:
        yield tree
    finally:
        subprocess.run([*git, "remove", "--force", str(tree)], capture_output=True)


@dataclass(frozen=True)
class Revision:
    """recoveryd's source as it was at a git revision, checked out (`revision`): a
    benchmark's `--against`, started with `recoveryd_server(..., name=rev.name,
    repo=rev.tree)` beside this tree's in the same rounds."""

    revision: str
    tree: Path

    @property
    def name(self) -> str:
        return f"recoveryd @{self.revision[:10]}"


@contextlib.contextmanager
def revision(revision: str, workdir: Path) -> Iterator[Revision]:
    """`revision` checked out under `workdir` (`checkout`), removed at the end."""
    with checkout(revision, workdir) as tree:
        yield Revision(revision, tree)


@contextlib.contextmanager
def _running(
    name: str,
    command: list[str],
    port: int,
    workdir: Path,
    ready_path: str,
    settings: Mapping[str, str] | None = None,
    admin_port: int | None = None,
    repo: Path = REPO,
) -> Iterator[Server]:
    # RECOVERYD_* variables of the shell running the benchmark (a PUBLIC_URL, say) would
    # change what is measured: each server gets only the settings passed here.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERYD_")}
    env |= dict(settings or {})
    # A name may hold a git revision ("recoveryd @exp/fast"): no slashes in a file name.
    log = workdir / (_UNSAFE_IN_FILE_NAME.sub("-", name) + ".log")
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command, cwd=repo, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    server = Server(name, process, port, log, admin_port)
    try:
        _wait_until_ready(server, f"http://{HOST}:{port}{ready_path}")
        yield server
    finally:
        server.stop()


def _wait_until_ready(server: Server, url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ServerError(
                f"{server.name} exited with status {server.process.returncode} at start"
                + log_tail(server.log)
            )
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    message = f"{server.name} was not ready within {START_TIMEOUT:.0f} s"
    raise ServerError(message + log_tail(server.log))
