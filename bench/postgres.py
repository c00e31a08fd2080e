"""A durable PostgreSQL server for bench.ingest, started for the run on loopback.

The tests' helpers (tests/postgres.py) start it from this machine's binaries (Debian's
`postgresql` package) in a temporary directory, on a free loopback port, as the `postgres`
user when run as root; `durable=True` keeps PostgreSQL's own defaults for what a commit
waits for: fsync, synchronous_commit and full_page_writes on. A commit is on disk before
recoveryd answers "accepted", as with the SQLite store's synchronous=FULL.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.servers import proc_stat, stat_cpu_seconds
from tests.postgres import binaries, own_cluster

DATABASE = "recoveryd_bench"
# The settings bench.ingest reports, as the server itself says them (SHOW).
SHOWN = (
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "shared_buffers",
    "max_connections",
)


class Unavailable(Exception):
    """No PostgreSQL server could be started here; the message says why."""


@dataclass(frozen=True)
class PostgresServer:
    """The running server: `url` is a superuser's on a database of its own for recoveryd,
    `settings` what SHOW says of SHOWN, `base` the temporary directory of its data."""

    url: str
    version: str
    settings: dict[str, str]
    base: Path
    postmaster: int

    def cpu_seconds(self) -> float:
        """CPU time of the server's processes so far: the postmaster's, that of its
        running children (backends, WAL writer, checkpointer...) and of those that ended."""
        used = stat_cpu_seconds(proc_stat(self.postmaster), ended_children=True)
        parent = str(self.postmaster)
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                fields = proc_stat(int(entry.name))
            except OSError:  # ended since the listing
                continue
            if fields[1] == parent:
                used += stat_cpu_seconds(fields)
        return used

    def stored_dlq_ids(self) -> list[str]:
        """Every dlqId in recoveryd's callbacks table."""
        with psycopg.connect(self.url) as connection:
            return [row[0] for row in connection.execute("SELECT dlq_id FROM callbacks")]


@contextlib.contextmanager
def durable_server() -> Iterator[PostgresServer]:
    """A durable server for the block, stopped and deleted after it; Unavailable when this
    machine has no PostgreSQL binaries or the server does not start."""
    if binaries() is None:
        raise Unavailable(
            "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/postgres); "
            "install Debian's `postgresql` package"
        )
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(own_cluster(durable=True))
        except subprocess.CalledProcessError as exc:
            said = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
            raise Unavailable(f"the server did not start ({said[-1] if said else exc})") from None
        except (KeyError, OSError) as exc:  # no `postgres` account, no setpriv...
            raise Unavailable(f"the server did not start ({exc})") from None
        with psycopg.connect(cluster.url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{DATABASE}"')
            version = _show(admin, "server_version")
            settings = {name: _show(admin, name) for name in SHOWN}
        postmaster = int((cluster.base / "data/postmaster.pid").read_text().split()[0])
        url = cluster.url.rsplit("/", 1)[0] + "/" + DATABASE
        yield PostgresServer(url, version, settings, cluster.base, postmaster)


def _show(connection: psycopg.Connection[Any], name: str) -> str:
    row = connection.execute(f"SHOW {name}").fetchone()
    return str(row[0]) if row else "?"
