"""`python -m bench.console`, briefly: every page gets its row on each engine, the groups
checked against the records by the bench itself (the figures are for a reader, not
checked here)."""

from __future__ import annotations

import re

from tests.bench.support import run_bench

ROWS = (
    "/ui/", "/ui/failures", "/ui/failures state=failed", "/ui/failures rule=",
    "/ui/failures action=", "/ui/failures since=1h", "/ui/failures q=dlqId",
    "/ui/failures q=run id", "/ui/failures q=URL", "/ui/failures q=URL Group",
    "/ui/failures page 40", "/ui/failures state=received rule=", "/ui/failures/{dlqId}",
    "/ui/groups", "/ui/batches", "/ui/removals", "/ui/sweeps", "/ui/rules", "/api/v1/dlq",
    "/api/v1/dlq state=failed", "/api/v1/dlq page 40", "/api/v1/batches", "/api/v1/groups",
)  # fmt: skip
# A row: the page, p50, p95, the empty store's p95, their ratio, the verdict.
FIGURES = r" +[\d.]+ ms +[\d.]+ ms +[\d.]+ ms +[\d.]+  (met|MISSED)$"


def _printed_every_row(stdout: str, engine: str) -> None:
    table = stdout.split(f"\n{engine}: 2,000 records;", 1)[1].split("\n\n", 1)[0]
    assert "groups: 400 groups holding 2,000 of 2,000 records, as the records say: OK" in table
    for row in ROWS:
        found = re.search(rf"^{re.escape(row)}\S*( \(none\))?{FIGURES}", table, re.MULTILINE)
        assert found, f"no row {row!r} in:\n{table}"


def test_console_bench_prints_every_page_on_sqlite() -> None:
    """SQLite alone: 40 pages of failures, so page 40 is the last the cursors reach."""
    done = run_bench("console", "--store", "sqlite", "--records", "2000", "--requests", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    _printed_every_row(done.stdout, "sqlite")


def test_console_bench_prints_every_page_on_postgresql(postgres_server: str) -> None:
    """`postgres_server`: only where the tests can start PostgreSQL (the bench starts its
    own, durable, from the same binaries)."""
    done = run_bench("console", "--store", "postgres", "--records", "2000", "--requests", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    _printed_every_row(done.stdout, "postgres")
