"""`recoveryd replay` on a store of a million records, against reading the same records
alone, in the same run.

Per engine (SQLite, and PostgreSQL on a server the bench starts on loopback), one store
holding `--records` decided records written straight into the schema (big transactions
for SQLite, COPY for PostgreSQL): received over the last 7 days, each with the facts its
decision kept (fields.kept) of a message of bench.rulecases' mix (workflow, URL Group and
plain messages), decided by its 20 typical rules (bench.rulecases.TYPICAL_RULES), the
workflows' records spread over 20,000 workflows so that budgets count repeats. Then, the
bench pinned to one core:

* the baseline: every record read through `Store.replay_rows`, a page at a time, and
  nothing done with it (what the store alone costs);
* the replay: the same pages through the engine (rules/replay.py) with a candidate that
  changes two rules (restart-billing-on-5xx resumes instead; resume-transient-failures
  allows one recovery a day), as `recoveryd replay` runs it.

Printed per engine: each pass's wall-clock and CPU seconds and records/s, replay/read,
the engine's own CPU cost per record, the process's RSS after 10% of the records and at
the end (flat: the replay holds one page and one budget window, never the store), the
peak RSS, the report's figures, and whether the replay took under 20 s for a million
records (met or missed, in the process's CPU time and in wall-clock time: on a shared
machine the core the bench is pinned to also runs others' work, which the wall clock
counts). PostgreSQL's server CPU is printed beside. Figures are printed, nothing asserted.
Run: python -m bench.replay [--records N] [--store sqlite|postgres|both]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import resource
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import structlog

from bench.options import positive_int
from bench.postgres import Unavailable, durable_server
from bench.rulecases import TYPICAL_RULES, message_mix
from daemon.admin.replay import PAGE
from daemon.rules import facts, parse_rules
from daemon.rules.fields import kept
from daemon.rules.model import RECOVERIES
from daemon.rules.replay import Replay
from daemon.store import Store
from daemon.store.postgres import PostgresStore
from daemon.store.sqlite import SQLiteStore

TARGET = 20.0  # seconds for a million records, one core
SPAN = 7 * 86_400.0
WORKFLOWS = 20_000  # workflow keys the workflows' records share
MIX = 500  # distinct messages, taken in turn
TRANSACTION = 100_000
COLUMNS = ("dlq_id, body, received_at, state, reason, rule, action, overrides, "
           "workflow_run_id, workflow_key, facts, decided_at, updated_at")  # fmt: skip
LIVE = parse_rules(TYPICAL_RULES)
CANDIDATE = parse_rules(
    TYPICAL_RULES.replace(
        "      labels: {any: [billing]}\n      responseStatus: {gte: 500, lte: 599}\n"
        "    action: restart",
        "      labels: {any: [billing]}\n      responseStatus: {gte: 500, lte: 599}\n"
        "    action: resume",
    ).replace("maxRecoveries: 5, within: 24h", "maxRecoveries: 1, within: 24h"),
    "candidate.yaml",
)


@dataclass(frozen=True)
class Kind:
    """One message of the mix as every record made of it is stored."""

    state: str
    rule: str | None
    action: str | None
    overrides: str | None
    workflow: bool
    facts: str
    dlq_id: str  # the mix's, in `facts`


def kinds() -> list[Kind]:
    made = []
    for message in message_mix(MIX):
        found = facts(message)
        rule = LIVE.decide(found).rule
        recovery = rule is not None and rule.action in RECOVERIES
        made.append(
            Kind(
                state="done" if recovery or (rule and rule.action == "notify") else "skipped",
                rule=rule and rule.name,
                action=rule and rule.action,
                overrides=rule.overrides_key if rule is not None and recovery else None,
                workflow=bool(found.get("workflow")),
                facts=kept(found, LIVE.reads_all),
                dlq_id=message["dlqId"],
            )
        )
    return made


def rows(records: int, now: float, numbers: range) -> Iterator[tuple[Any, ...]]:
    mix = kinds()
    for number in numbers:
        kind = mix[number % MIX]
        at = now - SPAN + (number + 0.5) * SPAN / records
        run = f"wfr_{number:08d}" if kind.workflow else None
        key = f"wfk_{number % WORKFLOWS:05d}" if kind.workflow else None
        dlq_id = f"{int(at * 1000):013d}-{number}"
        kept_facts = kind.facts.replace(kind.dlq_id, dlq_id)  # each record's own
        yield (dlq_id, b"{}", at, kind.state, None, kind.rule, kind.action, kind.overrides,
               run, key, kept_facts, at + 1, at + 2)  # fmt: skip


def fill_sqlite(path: Path, records: int, now: float) -> float:
    started = time.perf_counter()
    marks = ", ".join("?" * len(COLUMNS.split(", ")))
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as connection:
        connection.execute("PRAGMA journal_mode = OFF")  # the bench's fill: one writer
        connection.execute("PRAGMA synchronous = OFF")
        for low in range(0, records, TRANSACTION):
            connection.execute("BEGIN")
            connection.executemany(
                f"INSERT INTO callbacks ({COLUMNS}) VALUES ({marks})",
                rows(records, now, range(low, min(low + TRANSACTION, records))),
            )
            connection.execute("COMMIT")
        connection.execute("PRAGMA journal_mode = WAL")
    return time.perf_counter() - started


def fill_postgres(url: str, records: int, now: float) -> float:
    started = time.perf_counter()
    with psycopg.connect(url) as connection:
        for low in range(0, records, TRANSACTION):
            with (
                connection.transaction(),
                connection.cursor() as cursor,
                cursor.copy(f"COPY callbacks ({COLUMNS}) FROM STDIN") as copy,
            ):
                for row in rows(records, now, range(low, min(low + TRANSACTION, records))):
                    copy.write_row(row)
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("ANALYZE")
    return time.perf_counter() - started


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Pass:
    seconds: float  # wall clock
    cpu: float  # the process's CPU time: the engine, the driver, SQLite's thread
    records: int
    rss_early: float = 0.0  # MiB, after a tenth of the records
    rss_end: float = 0.0
    report: dict[str, Any] | None = None


async def walk(store: Store, records: int, replaying: Replay | None) -> Pass:
    """Every record, a page at a time (as daemon/admin/replay.py reads them), through
    `replaying` when given."""
    early, seen, rss_early = records // 10, 0, 0.0
    after: tuple[float, str] | None = None
    started, cpu = time.perf_counter(), time.process_time()
    while True:
        page = await store.replay_rows(None, after, PAGE)
        if replaying is not None:
            for row in page:
                replaying.add(row)
        seen += len(page)
        if not rss_early and seen >= early:
            rss_early = rss_mib()
        if len(page) < PAGE:
            break
        after = (page[-1].received_at, page[-1].dlq_id)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    report = replaying.report() if replaying is not None else None
    return Pass(seconds, cpu, seen, rss_early, rss_mib(), report)


async def measure(store: Store, records: int) -> tuple[Pass, Pass]:
    await walk(store, records, None)  # warm the caches, both passes alike
    read = await walk(store, records, None)
    replay = await walk(store, records, Replay(CANDIDATE))
    return read, replay


def show(engine: str, read: Pass, replay: Pass, extra: str = "") -> None:
    report = replay.report or {}
    per = (replay.cpu - read.cpu) / max(replay.records, 1) * 1e6
    scale = 1_000_000 / max(replay.records, 1)  # the target is for a million records
    budget = report.get("budget", {})
    print(f"\n{engine}: {replay.records:,} records{extra}")
    for name, run in (("read alone", read), ("replay", replay)):
        print(f"  {name:<12} {run.seconds:7.2f} s wall, {run.cpu:6.2f} s CPU  "
              f"{run.records / run.seconds:>9,.0f} records/s")  # fmt: skip
    print(f"  replay/read  {replay.seconds / read.seconds:.2f} wall, {replay.cpu / read.cpu:.2f} "
          f"CPU; the engine {per:.1f} us CPU a record")  # fmt: skip
    print(f"  RSS          {replay.rss_early:7.1f} MiB after 10%, {replay.rss_end:.1f} MiB at the "
          f"end (x{replay.rss_end / replay.rss_early:.2f}); peak "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")  # fmt: skip
    print(f"  report       examined {report.get('examined', 0):,}, changed "
          f"{report.get('changed', 0):,} in {len(report.get('groups', []))} groups, budget "
          f"stopped {budget.get('stopped', {}).get('count', 0):,}")  # fmt: skip
    verdicts = [
        f"{'met' if run * scale < TARGET else 'missed'} in {kind} ({run * scale:.1f} s)"
        for kind, run in (("CPU time", replay.cpu), ("wall time", replay.seconds))
    ]
    print(f"  target       < {TARGET:.0f} s a million records on one core: {', '.join(verdicts)}")


async def sqlite_engine(folder: Path, records: int, now: float) -> None:
    path = folder / "replay.db"
    async with SQLiteStore.open(path):
        pass  # the schema, as the daemon makes it
    seconds = fill_sqlite(path, records, now)
    print(f"sqlite: filled {records:,} records in {seconds:.0f} s, "
          f"{path.stat().st_size / 2**20:,.0f} MiB", file=sys.stderr)  # fmt: skip
    async with SQLiteStore.open(path) as store:
        read, replay = await measure(store, records)
    show("sqlite", read, replay)


async def postgres_engine(url: str, records: int, now: float, cpu: Any) -> None:
    async with PostgresStore.open(url):
        pass
    seconds = fill_postgres(url, records, now)
    print(f"postgres: filled {records:,} records in {seconds:.0f} s", file=sys.stderr)
    before = cpu()
    async with PostgresStore.open(url) as store:
        read, replay = await measure(store, records)
    show("postgres", read, replay, f" (server CPU over the three passes: {cpu() - before:.1f} s)")


def main(argv: list[str] | None = None) -> None:
    # The stores' own events (migrations) go to stderr, beside the fill's progress.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    parser.add_argument("--records", type=positive_int, default=1_000_000)
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    options = parser.parse_args(argv)
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})  # one core: the engine, the driver, SQLite's thread
    print(f"bench.replay: Python {platform.python_version()}, pinned to CPU {core}, "
          f"{options.records:,} records, pages of {PAGE:,}")  # fmt: skip
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as folder:
        if options.store in ("sqlite", "both"):
            asyncio.run(sqlite_engine(Path(folder), options.records, now))
        if options.store in ("postgres", "both"):
            try:
                with durable_server() as server:
                    print(f"postgres {server.version} on loopback", file=sys.stderr)
                    asyncio.run(
                        postgres_engine(server.url, options.records, now, server.cpu_seconds)
                    )
            except Unavailable as exc:
                print(f"\npostgres: skipped: {exc}")


if __name__ == "__main__":
    main()
