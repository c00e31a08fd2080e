"""`python -m bench.ingest`, briefly: recoveryd on SQLite and on PostgreSQL side by side,
with the naive FastAPI peer, every answer and every store checked by the bench itself
(the figures are for a reader, not checked here)."""

from __future__ import annotations

import re

import pytest

from tests.bench.support import run_bench


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ingest_prints_postgresql_next_to_sqlite(postgres_server: str) -> None:
    """`postgres_server`: only where the tests can start PostgreSQL (the bench starts its
    own, durable, from the same binaries)."""
    done = run_bench("ingest", "--requests", "500", "--rounds", "1", "--warmup", "100")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fsync=on, synchronous_commit=on" in done.stdout
    assert re.search(r"^naive FastAPI +[\d,]+ ", done.stdout, re.MULTILINE), done.stdout
    stored = '600 rows, 600 distinct dlqIds; 600 dlqIds were answered "accepted": OK'
    assert f"naive FastAPI store: {stored}" in done.stdout
    # The ceiling: recoveryd's receiver with a store that keeps nothing, every answer
    # checked "accepted" by the bench.
    assert re.search(r"^receiver, no store +[\d,]+ ", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^ratio receiver, no store / bare uvicorn: \d+\.\d\d ", done.stdout,
                     re.MULTILINE)  # fmt: skip
    for name in ("recoveryd serve", "recoveryd serve pg"):
        assert re.search(rf"^{name} +[\d,]+ ", done.stdout, re.MULTILINE), done.stdout
        assert re.search(rf"^ratio {name} / bare uvicorn: ", done.stdout, re.MULTILINE)
        assert re.search(rf"^ratio {name} / naive FastAPI: ", done.stdout, re.MULTILINE)
        assert f"{name} store: {stored}" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ingest_measures_this_tree_against_a_revision_in_the_same_rounds() -> None:
    """`--against HEAD`: recoveryd as committed runs beside this tree, its answers and
    store checked as this one's; a revision git does not know fails the bench at once."""
    done = run_bench(
        "ingest", "--store", "sqlite", "--requests", "500", "--rounds", "1", "--warmup", "100",
        "--against", "HEAD",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^recoveryd @HEAD +[\d,]+ ", done.stdout, re.MULTILINE), done.stdout
    assert re.search(
        r"^ratio recoveryd serve / recoveryd @HEAD: \d+\.\d\d   this tree against HEAD",
        done.stdout,
        re.MULTILINE,
    ), done.stdout
    stored = '600 rows, 600 distinct dlqIds; 600 dlqIds were answered "accepted": OK'
    assert f"recoveryd @HEAD store: {stored}" in done.stdout
    unknown = run_bench("ingest", "--store", "sqlite", "--against", "no-such-revision")
    assert unknown.returncode == 1
    assert "cannot check out 'no-such-revision'" in unknown.stderr
