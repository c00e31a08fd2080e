"""The SQLite store holding 10 million finished records, against the same store empty.

Two stores in one folder: the full one gets `--records` final records (done, gone,
skipped, failed; written straight into the file in big transactions, with bodies made
from the sample failure callback and batches of 50 like the daemon's), and both get the
same `--pending` received dlqIds, 30% of them in backoff. The baseline is the store
holding the pending ones only, so the ratio full/empty is what the finished work costs.
Then, through `SQLiteStore` itself, in rounds alternating between the two stores:

* ingest: `--callers` concurrent `add_callback` calls of new dlqIds (group commit, as
  the receiver calls it), `--ingest` in all, with a `/metrics` scrape every second;
* claim: claim 25 dlqIds as a fetch worker does, then settle them back to `received`
  with a retry due at once (the pool stays the same size, due retries pile up);
* scrape: `status()` + `inbox_depth()`, what `/metrics` reads at each scrape.

Each figure is printed as full/empty; target <= 2 for each. Last, one pruning pass on
the full store with a retention that half its final records are older than: the size
on disk before and after, how long it took, and add_callback's latency while it ran.
Run: python -m bench.store [--records N] [--pending N] [--ingest N] [--rounds N]
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
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.options import positive_int
from daemon.store import Callback
from daemon.store.records import Outcome
from daemon.store.sqlite import SQLiteStore

SAMPLE = Path(__file__).resolve().parent.parent / "tests/testdata/samples/failure-callback.json"
TARGET_RATIO = 2.0
DAY = 86_400.0
RETENTION = 7 * DAY
CLAIM = 25  # a fetch worker's chunk
BACKOFF_SHARE = 0.3
FILL_TRANSACTION = 500_000  # a multiple of BATCH
BATCH = 50
FINAL_MIX = ("done",) * 7 + ("gone", "skipped", "failed")


@dataclass(frozen=True)
class Options:
    records: int
    pending: int
    ingest: int
    callers: int
    rounds: int
    folder: Path | None
    prune_chunk: int | None = None  # None: the store's default


@dataclass
class Figures:
    """Latencies in seconds, gathered over the rounds."""

    ingest: list[float] = field(default_factory=list)
    claim: list[float] = field(default_factory=list)
    scrape: list[float] = field(default_factory=list)


class Ids:
    """dlqIds shaped like the service's (`<ms>-<n>`), later ones sorting after earlier."""

    def __init__(self) -> None:
        self._number = 0

    def next(self, at: float) -> str:
        self._number += 1
        return f"{int(at * 1000):013d}-{self._number}"

    def skip(self, count: int) -> int:
        """Reserve `count` numbers (for ids made elsewhere); the first of them."""
        first = self._number + 1
        self._number += count
        return first


def body_of(dlq_id: str) -> bytes:
    return BODY_HEAD + dlq_id.encode() + BODY_TAIL


_MARK = "@dlqId@"
_sample = json.dumps(json.loads(SAMPLE.read_text()) | {"dlqId": _MARK}, separators=(",", ":"))
BODY_HEAD, BODY_TAIL = (part.encode() for part in _sample.split(_MARK))


# -- filling the store ------------------------------------------------------------------


def fill(path: Path, records: int, pending: int, now: float, ids: Ids) -> float:
    """Write `records` final records and `pending` received ones straight into the
    store's file; the seconds it took."""
    started = time.perf_counter()
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as connection:
        # The bench's own fill, not the daemon's path: no journal and no flush, one writer.
        connection.execute("PRAGMA journal_mode = OFF")
        connection.execute("PRAGMA synchronous = OFF")
        connection.execute("PRAGMA cache_size = -1000000")
        first = ids.skip(records)
        start, step = now - 2 * RETENTION, 2 * RETENTION / max(records, 1)
        for low in range(0, records, FILL_TRANSACTION):
            high = min(records, low + FILL_TRANSACTION)
            connection.execute("BEGIN")
            connection.execute(FILL_FINAL, {"low": low, "high": high - 1, "first": first,
                                            "start": start, "step": step, "head": BODY_HEAD,
                                            "tail": BODY_TAIL, "batch": BATCH})  # fmt: skip
            connection.execute(FILL_BATCHES, {"low": low, "high": high - 1, "batch": BATCH})
            connection.execute("COMMIT")
            print(f"  {high:,} records ...", end="\r", file=sys.stderr, flush=True)
        connection.execute("BEGIN")
        connection.executemany(
            "INSERT INTO callbacks (dlq_id, body, received_at, tries, lease_until) "
            "VALUES (?, ?, ?, ?, ?)",
            _pending_rows(pending, now, ids),
        )
        connection.execute("COMMIT")
        connection.execute("PRAGMA journal_mode = WAL")
    return time.perf_counter() - started


# Final records number `low` to `high`, spread evenly over the last 2 * RETENTION (so
# half of them are past it), shaped as the pipeline leaves them; generated by SQLite
# itself, which is several times faster than building 10 million rows in Python.
FILL_FINAL = """
    WITH RECURSIVE number(i) AS (SELECT :low UNION ALL SELECT i + 1 FROM number WHERE i < :high),
    made AS (
        SELECT i, :start + i * :step AS at, i / :batch + 1 AS batch,
            printf('%013d-%d', CAST((:start + i * :step) * 1000 AS INTEGER), :first + i) AS id,
            CASE i % 10 WHEN 7 THEN 'gone' WHEN 8 THEN 'skipped' WHEN 9 THEN 'failed'
                ELSE 'done' END AS state
        FROM number
    )
    INSERT INTO callbacks (dlq_id, body, received_at, state, rule, action, overrides,
        workflow_run_id, tries, sends, batch_ids, history, decided_at, updated_at)
    SELECT id, CAST(:head || id || :tail AS BLOB), at, state, 'resume-all', 'resume', '{}',
        'wfr_' || i, 1, state = 'done', '[' || batch || ']',
        printf('[{"state":"decided","at":%f,"rule":"resume-all"},'
            || '{"state":"%s","at":%f,"batch":%d}]', at, state, at + 1, batch),
        at, at + 1
    FROM made
"""
# Their batches of 50 (a rowid is the record's number + 1: the file had none before; a
# transaction holds whole batches).
FILL_BATCHES = """
    INSERT INTO batches (id, action, overrides, state, dlq_ids, created_at, sent_at,
        settled_at)
    SELECT (rowid - 1) / :batch + 1, 'resume', '{}', 'settled', json_group_array(dlq_id),
        min(received_at), min(received_at), max(updated_at)
    FROM callbacks WHERE rowid BETWEEN :low + 1 AND :high + 1 GROUP BY 1
"""


def _pending_rows(
    pending: int, now: float, ids: Ids
) -> Iterator[tuple[str, bytes, float, int, float | None]]:
    for number in range(pending):
        at = now - 60 + number * 60 / pending
        dlq_id = ids.next(at)
        backoff = number % 10 < BACKOFF_SHARE * 10
        yield dlq_id, body_of(dlq_id), at, int(backoff), now + 3600 if backoff else None


# -- measuring --------------------------------------------------------------------------


async def ingest(store: SQLiteStore, count: int, callers: int, ids: Ids) -> list[float]:
    """`count` new callbacks from `callers` concurrent callers, a scrape every second;
    the latency of each add_callback."""
    latencies: list[float] = []
    left = iter(range(count))

    async def caller() -> None:
        for _ in left:
            now = time.time()
            dlq_id = ids.next(now)
            started = time.perf_counter()
            outcome = await store.add_callback(Callback(dlq_id, body_of(dlq_id), now))
            latencies.append(time.perf_counter() - started)
            assert outcome == "accepted", (dlq_id, outcome)

    async def scraper() -> None:
        while True:
            await asyncio.sleep(1.0)
            await scrape(store)

    scraping = asyncio.create_task(scraper())
    try:
        await asyncio.gather(*(caller() for _ in range(callers)))
    finally:
        scraping.cancel()
    return latencies


async def claims(store: SQLiteStore, count: int) -> list[float]:
    """`count` claims of 25, each settled back to received with its retry due at once."""
    latencies: list[float] = []
    for _ in range(count):
        now = time.time()
        started = time.perf_counter()
        claimed = await store.claim("bench", CLAIM, 300.0, now)
        latencies.append(time.perf_counter() - started)
        assert len(claimed) == CLAIM, len(claimed)
        outcomes = [Outcome(item.dlq_id, "received", retry_at=now) for item in claimed]
        await store.settle("bench", outcomes, now)
    return latencies


async def scrape(store: SQLiteStore) -> None:
    await store.status(time.time())
    await store.inbox_depth()


async def scrapes(store: SQLiteStore, count: int) -> list[float]:
    latencies: list[float] = []
    for _ in range(count):
        started = time.perf_counter()
        await scrape(store)
        latencies.append(time.perf_counter() - started)
    return latencies


async def measure(store: SQLiteStore, figures: Figures, options: Options, ids: Ids) -> None:
    per_round = max(1, options.ingest // options.rounds)
    figures.ingest += await ingest(store, per_round, options.callers, ids)
    figures.claim += await claims(store, 100)
    figures.scrape += await scrapes(store, 200)


async def prune_pass(store: SQLiteStore, options: Options, ids: Ids) -> None:
    """One pass with half of the final records past the retention, callbacks arriving."""
    size_before = await store.size_bytes()
    now = time.time()
    started = time.perf_counter()
    chunk = {"chunk": options.prune_chunk} if options.prune_chunk else {}
    pruning = asyncio.create_task(
        store.prune(before=now - RETENTION, now=now, dedup_for=30 * DAY, **chunk)
    )
    during: list[float] = []
    while not pruning.done():
        during += await ingest(store, options.callers * 10, options.callers, ids)
    pruned = await pruning
    seconds = time.perf_counter() - started
    size_after = await store.size_bytes()
    print(f"\npruning pass (retention {RETENTION / DAY:.0f} days, half the final records older, "
          f"{options.prune_chunk or 'default'} records a transaction):")  # fmt: skip
    print(f"  {pruned:,} records pruned in {seconds:.1f} s ({pruned / seconds:,.0f}/s)")
    print(f"  size before {size_before / 2**20:,.0f} MiB, after {size_after / 2**20:,.0f} MiB")
    if during:
        print(f"  add_callback meanwhile: {len(during):,} calls, p50 {ms(pct(during, 50))}, "
              f"p99 {ms(pct(during, 99))}, max {ms(max(during))}")  # fmt: skip


# -- reporting --------------------------------------------------------------------------


def pct(values: Sequence[float], percent: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * percent / 100))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def report(empty: Figures, full: Figures) -> None:
    print(
        f"\n{'figure':<26}{'empty':>12}{'full':>12}{'full/empty':>12}  target <= {TARGET_RATIO:g}"
    )
    rows = [
        ("ingest p50", empty.ingest, full.ingest, 50),
        ("ingest p99", empty.ingest, full.ingest, 99),
        ("claim p50", empty.claim, full.claim, 50),
        ("claim p99", empty.claim, full.claim, 99),
        ("scrape p50", empty.scrape, full.scrape, 50),
        ("scrape p99", empty.scrape, full.scrape, 99),
    ]
    for name, base, loaded, percent in rows:
        a, b = pct(base, percent), pct(loaded, percent)
        ratio = b / a if a else float("inf")
        verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
        print(f"{name:<26}{ms(a):>12}{ms(b):>12}{ratio:>12.2f}  {verdict}")


async def timed(label: str, work: Awaitable[None]) -> None:
    started = time.perf_counter()
    await work
    print(f"{label}: {time.perf_counter() - started:.1f} s", file=sys.stderr)


async def run(options: Options, folder: Path) -> None:
    ids = Ids()
    now = time.time()
    empty_path, full_path = folder / "empty.db", folder / "full.db"
    for path in (empty_path, full_path):
        async with SQLiteStore.open(path):
            pass  # the schema, as the daemon creates it
    seconds = fill(full_path, options.records, options.pending, now, ids)
    rate = options.records / seconds
    print(f"filled {options.records:,} final + {options.pending:,} pending records in "
          f"{seconds:.0f} s ({rate:,.0f} records/s)", file=sys.stderr)  # fmt: skip
    fill(empty_path, 0, options.pending, now, ids)
    async with SQLiteStore.open(full_path) as store:
        print(f"full store: {await store.size_bytes() / 2**20:,.0f} MiB", file=sys.stderr)
    empty, full = Figures(), Figures()
    async with SQLiteStore.open(empty_path) as small, SQLiteStore.open(full_path) as large:
        # The first touch of the big file reads its pages from disk: not what is measured.
        await timed("warm-up", measure(large, Figures(), _warmup(options), ids))
        for number in range(options.rounds):
            await timed(f"round {number + 1} empty", measure(small, empty, options, ids))
            await timed(f"round {number + 1} full", measure(large, full, options, ids))
        report(empty, full)
        await prune_pass(large, options, ids)


def _warmup(options: Options) -> Options:
    return Options(0, 0, options.callers * 20, options.callers, 1, None)


def parse(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--records", type=positive_int, default=10_000_000)
    parser.add_argument("--pending", type=positive_int, default=10_000)
    parser.add_argument("--ingest", type=positive_int, default=30_000, help="callbacks a store")
    parser.add_argument("--callers", type=positive_int, default=32)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--dir", type=Path, help="where the stores go (a temporary folder)")
    parser.add_argument("--prune-chunk", type=positive_int, default=None,
                        help="records a pruning transaction (the store's default)")  # fmt: skip
    args = parser.parse_args(argv)
    return Options(args.records, args.pending, args.ingest, args.callers, args.rounds, args.dir,
                   args.prune_chunk)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    print(f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
          f"{os.cpu_count()} cores; {options.records:,} final records, {options.pending:,} "
          f"pending")  # fmt: skip
    with tempfile.TemporaryDirectory(dir=options.folder, prefix="bench-store-") as folder:
        asyncio.run(run(options, Path(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
