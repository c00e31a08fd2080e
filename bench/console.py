"""The operator's console and the JSON listings on a store of a million records, against
the same pages on an empty store of the same engine.

Per engine (SQLite, and PostgreSQL on a server the bench starts on loopback), two
stores: the full one holds `--records` records written straight into the schema (COPY
for PostgreSQL, big transactions for SQLite; the store's triggers keep the counts by
state and the failure groups' counts), received over the last 7 days: mostly done
(in batches of 50), some failed, skipped and gone, a few received and waiting for a
retry; decided by the 20 rules of bench.rulecases' typical file, to a few hundred URLs,
half of them in URL Groups, a third of them workflows with a run id. The empty one holds
only the record the one-failure page shows. A `recoveryd serve` on each, with the
emulator as the service, and in rounds alternating between the two, `--requests`
sequential GETs of each page (after a warm-up): the console's pages (/ui/...; skipped,
with a note, where this tree has no console) and the JSON listings (/api/v1/...).

Printed per page: p50 and p95 on the full store, p95 on the empty one, full/empty (the
comparable figure on a noisy machine), and whether p95 is under the 300 ms target.
Figures are printed, nothing asserted; every answer must be a 200, or the run fails.
Run: python -m bench.console [--records N] [--requests N] [--store sqlite|postgres|both]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import psycopg

from bench import drain
from bench.ingest import SIGNING_KEY
from bench.options import positive_int
from bench.postgres import PostgresServer, Unavailable, durable_server
from bench.rulecases import TYPICAL_RULES
from bench.servers import Server, recoveryd_server
from bench.store import SAMPLE, ms, pct
from daemon.rules.ruleset import parse_rules
from daemon.store.postgres import PostgresStore
from daemon.store.sqlite import SQLiteStore

TARGET = 0.300  # seconds, p95 of each page
DAY = 86_400.0
SPAN = 7 * DAY  # the records were received over the last week
URLS = 200  # distinct URLs; two statuses each: 400 failure groups
STATUSES = (503, 500, 502, 504, 429, 404, 410, 400)
BATCH = 50
TRANSACTION = 100_000  # SQLite rows a transaction of the fill
ROUNDS = 4
WARMUP = 3  # GETs of each page before the rounds
PAGE_50 = 50
ENGINES = ("sqlite", "postgres")
SERVICE_RATE = 1000  # the emulator's limit, requests/s, well above what the daemons ask of it
RULES = [(rule.name, rule.action) for rule in parse_rules(TYPICAL_RULES).rules]
SAMPLE_BODY: dict[str, Any] = json.loads(SAMPLE.read_text())
SETTINGS = {"RECOVERYD_RETENTION": "30d"}  # nothing pruned from under the measurement


class BenchmarkError(Exception):
    """A page did not answer 200, or the groups disagree with the records."""


@dataclass(frozen=True)
class Options:
    records: int
    requests: int
    stores: tuple[str, ...]
    folder: Path | None


# -- the records ------------------------------------------------------------------------


@dataclass(frozen=True)
class Fill:
    """The records numbered 0 to `records` - 1, made alike for both engines."""

    records: int
    now: float

    def at(self, number: int) -> float:
        return self.now - SPAN + (number + 0.5) * SPAN / max(self.records, 1)

    def dlq_id(self, number: int) -> str:
        return f"{int(self.at(number) * 1000):013d}-{number}"

    @staticmethod
    def state(number: int) -> str:
        share = number % 100
        if share < 82:
            return "done"
        if share < 90:
            return "failed"
        if share < 95:
            return "skipped"
        return "gone" if share < 99 else "received"

    @staticmethod
    def url_of(number: int) -> int:
        """The number of the URL the record's delivery went to."""
        return number * 7 % URLS

    def run_id(self, number: int) -> str | None:
        """A workflow run's id: a third of the URLs are workflows'."""
        return f"wfr_{number:08d}" if self.url_of(number) % 3 == 0 else None

    def row(self, number: int) -> tuple[Any, ...]:
        """A callbacks row: the columns of COLUMNS."""
        at, dlq_id, state = self.at(number), self.dlq_id(number), self.state(number)
        k = self.url_of(number)
        url, (group, endpoint), run_id = _url(k), _group(k), self.run_id(number)
        status = STATUSES[(k + number // 1000 % 2) % len(STATUSES)]  # two a URL
        body = _body(dlq_id, url, group, endpoint, status, run_id)
        listed = (url, group, endpoint, status, True)
        if state == "received":  # waiting for a retry an hour away: not claimed meanwhile
            waiting = (self.now + 3600, 1, 0, "service: 503", None, None, None, run_id)
            return (dlq_id, body, at, state, *waiting, "[]", "[]", None, at, *listed)
        rule, action = RULES[k % len(RULES)]
        batch = number // BATCH + 1 if state == "done" else None
        history = [
            {"state": "decided", "at": at + 1, "rule": rule},
            {"state": state, "at": at + 2} | ({"batch": batch} if batch else {}),
        ]
        decided = (None, 1, int(batch is not None), REASONS.get(state), rule, action, "{}")
        return (dlq_id, body, at, state, *decided, run_id, f"[{batch}]" if batch else "[]",
                json.dumps(history), at + 1, at + 2, *listed)  # fmt: skip

    def rows(self, numbers: Iterator[int] | range) -> Iterator[tuple[Any, ...]]:
        return (self.row(number) for number in numbers)

    def batches(self) -> Iterator[tuple[Any, ...]]:
        """The batches of 50 records (their done ones): the columns of BATCH_COLUMNS."""
        for first in range(0, self.records, BATCH):
            numbers = range(first, min(first + BATCH, self.records))
            done = [self.dlq_id(n) for n in numbers if self.state(n) == "done"]
            if done:
                at = self.at(first) + 2
                action = RULES[self.url_of(first) % len(RULES)][1]
                yield (
                    first // BATCH + 1,
                    action,
                    "{}",
                    "settled",
                    json.dumps(done),
                    at,
                    at,
                    at + 1,
                )


def _url(k: int) -> str:
    return f"https://svc-{k:03d}.example.com/hooks/{k % 12}"


def _group(k: int) -> tuple[str | None, str | None]:
    """The URL Group and endpoint of URL `k`: half the URLs are a group's endpoint."""
    return (f"group-{k % 40:02d}", f"ep-{k:03d}") if k % 2 == 0 else (None, None)


REASONS = {"failed": "bulk call answered 500", "gone": "the service has no such dlqId",
           "skipped": "the rule's action: ignore"}  # fmt: skip


def _body(
    dlq_id: str, url: str, group: str | None, endpoint: str | None, status: int, run_id: str | None
) -> bytes:
    """The failure callback of the repository's sample, with this record's fields."""
    body = {key: value for key, value in SAMPLE_BODY.items()
            if key not in ("topicName", "endpointName")}  # fmt: skip
    body |= {"dlqId": dlq_id, "url": url, "status": status}
    if group is not None:
        body |= {"topicName": group, "endpointName": endpoint}
    if run_id is not None:
        body["header"] = body["header"] | {"Upstash-Workflow-Runid": [run_id]}
    return json.dumps(body, separators=(",", ":")).encode()


COLUMNS = ("dlq_id, body, received_at, state, lease_until, tries, sends, reason, rule, action, "
           "overrides, workflow_run_id, batch_ids, history, decided_at, updated_at, url, "
           "url_group, endpoint, status, verified")  # fmt: skip
BATCH_COLUMNS = "id, action, overrides, state, dlq_ids, created_at, sent_at, settled_at"


def detail_number(records: int) -> int:
    """The record the one-failure page shows: a failed one (85 % 100) mid-store."""
    middle = records // 2 // 100 * 100
    return middle + 85 if middle + 85 < records else 85 % max(records, 1)


def fill_sqlite(path: Path, fill: Fill, numbers: Sequence[int] | range) -> float:
    """The records `numbers` (and with all of them, their batches) into the store's file;
    the seconds it took. The store's triggers count them by state and group."""
    started = time.perf_counter()
    marks = ", ".join("?" * len(COLUMNS.split(", ")))
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as connection:
        connection.execute("PRAGMA journal_mode = OFF")  # the bench's fill: one writer
        connection.execute("PRAGMA synchronous = OFF")
        for low in range(0, len(numbers), TRANSACTION):
            connection.execute("BEGIN")
            connection.executemany(f"INSERT INTO callbacks ({COLUMNS}) VALUES ({marks})",
                                   fill.rows(iter(numbers[low:low + TRANSACTION])))  # fmt: skip
            connection.execute("COMMIT")
            print(f"  {min(low + TRANSACTION, len(numbers)):,} records ...", end="\r",
                  file=sys.stderr, flush=True)  # fmt: skip
        if len(numbers) == fill.records:
            connection.execute("BEGIN")
            connection.executemany(f"INSERT INTO batches ({BATCH_COLUMNS}) VALUES "
                                   f"(?, ?, ?, ?, ?, ?, ?, ?)", fill.batches())  # fmt: skip
            connection.execute("COMMIT")
        connection.execute("PRAGMA journal_mode = WAL")
    return time.perf_counter() - started


def fill_postgres(url: str, fill: Fill, numbers: Sequence[int] | range) -> float:
    """As fill_sqlite, with COPY in transactions of TRANSACTION rows; then ANALYZE, which
    autovacuum runs on its own soon after a load this size."""
    started = time.perf_counter()
    with psycopg.connect(url) as connection:
        for low in range(0, len(numbers), TRANSACTION):
            with (
                connection.transaction(),
                connection.cursor() as cursor,
                cursor.copy(f"COPY callbacks ({COLUMNS}) FROM STDIN") as copy,
            ):
                for row in fill.rows(iter(numbers[low : low + TRANSACTION])):
                    copy.write_row(row)
            print(f"  {min(low + TRANSACTION, len(numbers)):,} records ...", end="\r",
                  file=sys.stderr, flush=True)  # fmt: skip
        if len(numbers) == fill.records:
            with connection.transaction(), connection.cursor() as cursor:
                with cursor.copy(f"COPY batches ({BATCH_COLUMNS}) FROM STDIN") as copy:
                    for batch in fill.batches():
                        copy.write_row(batch)
                cursor.execute("SELECT setval(pg_get_serial_sequence('batches', 'id'), "
                               "coalesce(max(id), 1)) FROM batches")  # fmt: skip
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("ANALYZE")
    return time.perf_counter() - started


# The failure groups as the records say they are, straight from the callbacks.
GROUPS_FROM_RECORDS = """
    SELECT url_group, endpoint, CASE WHEN url_group IS NULL THEN url END, status, rule,
        state, count(*) FROM callbacks GROUP BY 1, 2, 3, 4, 5, 6
"""


def check_groups(shown: list[dict[str, Any]], rows: list[tuple[Any, ...]], records: int) -> str:
    """What /api/v1/groups shows against the records' own GROUP BY; the line to print, or
    BenchmarkError."""
    counted: dict[tuple[Any, ...], Counter[str]] = {}
    for group, endpoint, url, status, rule, state, n in rows:
        counted.setdefault((group, endpoint, url, status, rule), Counter())[state] += n
    seen = {(g["urlGroup"], g["endpoint"], g["url"], g["status"], g["rule"]): Counter(g["states"])
            for g in shown}  # fmt: skip
    if seen != counted:
        wrong = [key for key in counted.keys() | seen.keys() if counted.get(key) != seen.get(key)]
        raise BenchmarkError(f"{len(wrong)} groups disagree with the records, e.g. {wrong[:3]}")
    total = sum(sum(states.values()) for states in seen.values())
    return (
        f"groups: {len(seen)} groups holding {total:,} of {records:,} records, "
        "as the records say: OK"
    )


# -- the stores and servers -------------------------------------------------------------


@dataclass
class Engine:
    """One engine's two stores under measurement, each served by a recoveryd."""

    name: str
    full: Server
    empty: Server
    notes: list[str] = field(default_factory=list)


def rules_file(folder: Path) -> Path:
    path = folder / "rules.yaml"
    path.write_text(TYPICAL_RULES)
    return path


@contextlib.contextmanager
def sqlite_engine(folder: Path, fill: Fill, emulator: Server, detail: int) -> Iterator[Engine]:
    paths = {kind: folder / f"sqlite-{kind}.db" for kind in ("full", "empty")}
    for path in paths.values():
        asyncio.run(_create_sqlite(path))
    seconds = fill_sqlite(paths["full"], fill, range(fill.records))
    print(f"\rsqlite: filled {fill.records:,} records in {seconds:.0f} s "
          f"({fill.records / seconds:,.0f}/s), {paths['full'].stat().st_size / 2**20:,.0f} MiB",
          file=sys.stderr)  # fmt: skip
    fill_sqlite(paths["empty"], fill, [detail])
    with contextlib.closing(sqlite3.connect(paths["full"])) as connection:
        counted = connection.execute(GROUPS_FROM_RECORDS).fetchall()
    with _servers(folder, "sqlite", paths["full"], paths["empty"], emulator) as (full, empty):
        engine = Engine("sqlite", full, empty)
        engine.notes.append(check_groups(_groups(full), counted, fill.records))
        yield engine


async def _create_sqlite(path: Path) -> None:
    async with SQLiteStore.open(path):
        pass  # the schema, as the daemon creates it


async def _create_postgres(url: str) -> None:
    async with PostgresStore.open(url):
        pass  # the schema, as the daemon creates it


@contextlib.contextmanager
def postgres_engine(
    folder: Path, fill: Fill, emulator: Server, detail: int, server: PostgresServer
) -> Iterator[Engine]:
    empty_url = server.url + "_empty"
    with psycopg.connect(server.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{empty_url.rsplit("/", 1)[1]}"')
    for url in (server.url, empty_url):
        with contextlib.redirect_stdout(sys.stderr):  # its log lines, off the figures
            asyncio.run(_create_postgres(url))
    seconds = fill_postgres(server.url, fill, range(fill.records))
    print(f"\rpostgres: filled {fill.records:,} records in {seconds:.0f} s "
          f"({fill.records / seconds:,.0f}/s)", file=sys.stderr)  # fmt: skip
    fill_postgres(empty_url, fill, [detail])
    with psycopg.connect(server.url) as connection:
        counted = connection.execute(GROUPS_FROM_RECORDS).fetchall()
    with _servers(folder, "postgres", server.url, empty_url, emulator) as (full, empty):
        engine = Engine("postgres", full, empty)
        engine.notes.append(check_groups(_groups(full), counted, fill.records))
        engine.notes.append(f"PostgreSQL {server.version}, "
                            f"shared_buffers={server.settings['shared_buffers']}")  # fmt: skip
        yield engine


@contextlib.contextmanager
def _servers(
    folder: Path, engine: str, full: Path | str, empty: Path | str, emulator: Server
) -> Iterator[tuple[Server, Server]]:
    rules = rules_file(folder)
    common: dict[str, Any] = {"service_url": drain.url_of(emulator), "rules": rules,
                              "token": drain.TOKEN, "more_settings": SETTINGS}  # fmt: skip
    with (
        recoveryd_server(folder, full, SIGNING_KEY, name=f"recoveryd {engine} full", **common) as a,
        recoveryd_server(
            folder, empty, SIGNING_KEY, name=f"recoveryd {engine} empty", **common
        ) as b,
    ):
        yield a, b


def _admin(server: Server) -> str:
    return f"http://{server.host}:{server.admin_port}"


def _groups(server: Server) -> list[dict[str, Any]]:
    answer = httpx.get(f"{_admin(server)}/api/v1/groups", params={"limit": 500}, timeout=60)
    groups: list[dict[str, Any]] = answer.raise_for_status().json()["groups"]
    return groups


# -- the pages --------------------------------------------------------------------------


def pages(fill: Fill, detail: int, full: Server) -> list[tuple[str, str]]:
    """(name, path) of every page measured; page 50 found by following the cursors."""
    k = fill.url_of(detail)
    run_number = next(n for n in range(detail, fill.records) if fill.run_id(n))
    group = next(g for n in range(detail, fill.records) if (g := _group(fill.url_of(n))[0]))
    rule, action = RULES[k % len(RULES)]
    q = {"dlqId": fill.dlq_id(detail), "run id": str(fill.run_id(run_number)), "URL": _url(k),
         "URL Group": group}  # fmt: skip
    reached, cursor = _cursor_of_page(full, PAGE_50)
    listed: list[tuple[str, dict[str, str]]] = [
        ("", {}),
        ("state=failed", {"state": "failed"}),
        (f"rule={rule}", {"rule": rule}),
        (f"action={action}", {"action": action}),
        ("since=1h", {"since": "1h"}),
        *((f"q={what}", {"q": value}) for what, value in q.items()),
        (f"page {reached}", {"cursor": cursor}),
        # The worst of two filters: each walks its own index, none of it matches.
        (f"state=received rule={rule} (none)", {"state": "received", "rule": rule}),
    ]
    found = [(f"/ui/failures {name}".strip(), "/ui/failures" + _query(params))
             for name, params in listed]  # fmt: skip
    return [
        ("/ui/", "/ui/"),
        *found,
        ("/ui/failures/{dlqId}", f"/ui/failures/{fill.dlq_id(detail)}"),
        ("/ui/groups", "/ui/groups"),
        ("/ui/batches", "/ui/batches"),
        ("/ui/removals", "/ui/removals"),
        ("/ui/sweeps", "/ui/sweeps"),
        ("/ui/rules", "/ui/rules"),
        ("/api/v1/dlq", "/api/v1/dlq"),
        ("/api/v1/dlq state=failed", "/api/v1/dlq?state=failed"),
        (f"/api/v1/dlq page {reached}", "/api/v1/dlq" + _query({"cursor": cursor})),
        ("/api/v1/batches", "/api/v1/batches"),
        ("/api/v1/groups", "/api/v1/groups"),
    ]


def _query(params: dict[str, str]) -> str:
    return "?" + urlencode(params) if params else ""


def _cursor_of_page(server: Server, page: int) -> tuple[int, str]:
    """The page `page` of the failures (50 a page), or the last one if there are fewer,
    and its cursor, following each page's `next`."""
    cursor, reached = None, 1
    with httpx.Client(base_url=_admin(server), timeout=60) as client:
        while reached < page:
            given = {"limit": 50} | ({"cursor": cursor} if cursor else {})
            following = client.get("/api/v1/dlq", params=given).raise_for_status().json()["next"]
            if following is None:
                break
            cursor, reached = following, reached + 1
    if cursor is None:
        raise BenchmarkError("a single page of failures: no cursor to follow")
    return reached, cursor


def has_console(server: Server) -> bool:
    return httpx.get(f"{_admin(server)}/ui/", timeout=60).status_code != 404


@dataclass
class Latencies:
    full: dict[str, list[float]] = field(default_factory=dict)
    empty: dict[str, list[float]] = field(default_factory=dict)


def measure(engine: Engine, measured: list[tuple[str, str]], requests: int) -> Latencies:
    """`requests` GETs of each page on each store, in ROUNDS rounds, the store going first
    alternating, after WARMUP GETs of each."""
    found = Latencies()
    rounds = min(ROUNDS, requests)
    with (
        httpx.Client(base_url=_admin(engine.full), timeout=60) as full,
        httpx.Client(base_url=_admin(engine.empty), timeout=60) as empty,
    ):
        for client in (full, empty):
            for _, path in measured:
                for _ in range(WARMUP):
                    _get(client, path)
        for number in range(rounds):
            share = requests // rounds + (1 if number < requests % rounds else 0)
            order = [(full, found.full), (empty, found.empty)]
            for client, into in order if number % 2 == 0 else order[::-1]:
                for name, path in measured:
                    into.setdefault(name, []).extend(_get(client, path) for _ in range(share))
            print(f"{engine.name}: round {number + 1} of {rounds}", file=sys.stderr)
    return found


def _get(client: httpx.Client, path: str) -> float:
    started = time.perf_counter()
    answer = client.get(path)
    answer.read()
    took = time.perf_counter() - started
    if answer.status_code != 200:
        raise BenchmarkError(f"GET {path} answered {answer.status_code}: {answer.text[:300]}")
    return took


def report(engine: Engine, latencies: Latencies, options: Options) -> None:
    print(f"\n{engine.name}: {options.records:,} records; {options.requests} GETs a page on each "
          f"store, rounds alternating; target p95 < {TARGET * 1000:.0f} ms")  # fmt: skip
    for note in engine.notes:
        print(f"  {note}")
    print(f"{'page':<46}{'p50':>11}{'p95':>11}{'empty p95':>11}{'p95 ratio':>11}  target")
    for name, full in latencies.full.items():
        empty = latencies.empty[name]
        p95, base = pct(full, 95), pct(empty, 95)
        verdict = "met" if p95 < TARGET else "MISSED"
        print(f"{name:<46}{ms(pct(full, 50)):>11}{ms(p95):>11}{ms(base):>11}"
              f"{p95 / base if base else float('inf'):>11.2f}  {verdict}")  # fmt: skip


def run_engine(name: str, options: Options, folder: Path, emulator: Server) -> None:
    fill = Fill(options.records, time.time())
    detail = detail_number(options.records)
    with contextlib.ExitStack() as stack:
        if name == "sqlite":
            engine = stack.enter_context(sqlite_engine(folder, fill, emulator, detail))
        else:
            try:
                server = stack.enter_context(durable_server())
            except Unavailable as exc:
                print(f"\npostgres: skipped: {exc}")
                return
            engine = stack.enter_context(postgres_engine(folder, fill, emulator, detail, server))
        measured = pages(fill, detail, engine.full)
        if not has_console(engine.full):
            print(f"\n{name}: this tree has no console (/ui/ answers 404): its pages skipped")
            measured = [(n, p) for n, p in measured if not p.startswith("/ui/")]
        report(engine, measure(engine, measured, options.requests), options)


def parse(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--records", type=positive_int, default=1_000_000)
    parser.add_argument("--requests", type=positive_int, default=200, help="GETs a page a store")
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--dir", type=Path, help="where the stores go (a temporary folder)")
    args = parser.parse_args(argv)
    stores = ENGINES if args.store == "both" else (args.store,)
    return Options(args.records, args.requests, stores, args.dir)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    print(f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
          f"{os.cpu_count()} cores; {options.records:,} records")  # fmt: skip
    with tempfile.TemporaryDirectory(dir=options.folder, prefix="bench-console-") as name:
        folder = Path(name)
        try:
            with drain.emulator_server(folder, SERVICE_RATE) as emulator:
                for engine in options.stores:
                    (folder / engine).mkdir()
                    run_engine(engine, options, folder / engine, emulator)
        except BenchmarkError as exc:
            print(f"bench.console: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
