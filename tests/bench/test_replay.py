"""`python -m bench.replay`, briefly: each engine's passes and the report's figures are
printed (the figures are for a reader, not checked here)."""

from __future__ import annotations

import re

from tests.bench.support import run_bench

LINES = (
    r"  read alone +[\d.]+ s wall, +[\d.]+ s CPU +[\d,]+ records/s",
    r"  replay +[\d.]+ s wall, +[\d.]+ s CPU +[\d,]+ records/s",
    r"  replay/read +[\d.]+ wall, [\d.]+ CPU; the engine -?[\d.]+ us CPU a record",
    r"  RSS +[\d.]+ MiB after 10%, [\d.]+ MiB at the end \(x[\d.]+\); peak [\d.]+ MiB",
    r"  report +examined 5,000, changed [1-9][\d,]* in [1-9]\d* groups, budget stopped [\d,]+",
    r"  target +< 20 s a million records on one core: (met|missed) in CPU time \([\d.]+ s\), "
    r"(met|missed) in wall time \([\d.]+ s\)",
)


def _printed(stdout: str, engine: str) -> None:
    part = stdout.split(f"\n{engine}: 5,000 records", 1)[1]
    for line in LINES:
        assert re.search(f"^{line}$", part, re.MULTILINE), f"no {line!r} in:\n{part}"


def test_replay_bench_prints_both_passes_on_sqlite() -> None:
    done = run_bench("replay", "--store", "sqlite", "--records", "5000")
    assert done.returncode == 0, done.stdout + done.stderr
    _printed(done.stdout, "sqlite")


def test_replay_bench_prints_both_passes_on_postgresql(postgres_server: str) -> None:
    """`postgres_server`: only where the tests can start PostgreSQL."""
    done = run_bench("replay", "--store", "postgres", "--records", "5000")
    assert done.returncode == 0, done.stdout + done.stderr
    _printed(done.stdout, "postgres")
