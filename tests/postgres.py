"""A real PostgreSQL server for the tests, on loopback, started from Debian's binaries.

`RECOVERYD_TEST_POSTGRES=postgresql://...` names a server to use instead (a role that
may create databases). Otherwise each pytest worker starts its own cluster in a
temporary directory, on a free loopback port, with durability off (a test server need
not survive a power loss), and stops it at the end. As root, the server runs as the
`postgres` user, since PostgreSQL refuses to run as root. bench.ingest starts a durable
one with these helpers (`own_cluster(durable=True)`).

Each test gets a database of its own (`fresh_database`), dropped afterwards. A test that
stops and starts the server takes one of its own (`own_cluster`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests import system_tools

ENVIRONMENT = "RECOVERYD_TEST_POSTGRES"
USER = "recoveryd"


def binaries() -> Path | None:
    """The newest PostgreSQL server's bin directory on this machine, if any."""
    server = system_tools.find("postgres")
    return Path(server).parent if server else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _as_server_user() -> tuple[list[str], int | None, int | None]:
    """The command prefix, uid and gid the server runs under."""
    if os.geteuid() != 0:
        return [], None, None
    account = pwd.getpwnam("postgres")
    return ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
            "--init-groups"], account.pw_uid, account.pw_gid  # fmt: skip


@dataclass(frozen=True)
class Cluster:
    """A server of the tests' own: `url` is a superuser's on it. `stop()` ends it as a
    crash would (`pg_ctl stop -m immediate`: no checkpoint, connections cut), `start()`
    starts it again, on the same port, with the same data."""

    url: str
    base: Path
    options: str
    prefix: list[str]
    bin_dir: Path

    def start(self) -> None:
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.base / "server.log"),
                     "-o", self.options)  # fmt: skip

    def stop(self, *, check: bool = True) -> None:
        """`check`: fail when it was not running."""
        self._pg_ctl("stop", "-m", "immediate", check=check)

    def _pg_ctl(self, *arguments: str, check: bool = True) -> None:
        command = [*self.prefix, str(self.bin_dir / "pg_ctl"), *arguments]
        subprocess.run([*command, "-D", str(self.base / "data")], check=check,
                       capture_output=True)  # fmt: skip


@contextlib.contextmanager
def cluster() -> Iterator[str]:
    """A running server for the block: the URL of a superuser on it."""
    if url := os.environ.get(ENVIRONMENT):
        yield url
        return
    with own_cluster(crash_safe=False) as server:
        yield server.url


@contextlib.contextmanager
def own_cluster(*, crash_safe: bool = True, durable: bool = False) -> Iterator[Cluster]:
    """A server started for the block from this machine's binaries, whatever ENVIRONMENT
    says (so that a test may stop it). `crash_safe`: a commit is written out before it
    returns (synchronous_commit on), so that it outlives `stop()`; without it, as for the
    shared server, the last few commits before a crash may be lost. `durable`: crash-safe
    and flushed to disk as well (fsync and full_page_writes on, PostgreSQL's defaults), so
    that a commit outlives a power loss: bench.ingest's server, timed against SQLite's
    synchronous=FULL."""
    bin_dir = binaries()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server here: install Debian's `postgresql` package")
    prefix, uid, gid = _as_server_user()
    base = Path(tempfile.mkdtemp(prefix="recoveryd-pg-"))
    sockets = base / "run"
    sockets.mkdir()
    if uid is not None:
        for path in (base, sockets):
            os.chown(path, uid, gid)
    port = _free_port()
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -k {sockets} "
        f"-c fsync={_on(durable)} -c synchronous_commit={_on(crash_safe or durable)} "
        f"-c full_page_writes={_on(durable)} -c max_connections=300 -c shared_buffers=64MB"
    )
    server = Cluster(f"postgresql://{USER}@127.0.0.1:{port}/postgres", base, options, prefix,
                     bin_dir)  # fmt: skip
    try:
        subprocess.run(
            [*prefix, str(bin_dir / "initdb"), "-D", str(base / "data"), "-U", USER,
             "-A", "trust", "-E", "UTF8", "--no-sync"],
            check=True, capture_output=True,
        )  # fmt: skip
        server.start()
        try:
            yield server
        finally:
            server.stop(check=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _on(value: bool) -> str:
    """A boolean setting's value."""
    return "on" if value else "off"


@contextlib.contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the server for the block: its URL."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            # FORCE ends the connections a test left open (a killed daemon's included).
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
