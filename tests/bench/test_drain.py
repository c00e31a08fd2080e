"""`python -m bench.drain` with three replicas on PostgreSQL, briefly: it drains, its own
checks pass (every dlqId resumed once, counted from the emulator's journal) and it
prints its figures and verdicts (the figures are for a reader, not checked here)."""

from __future__ import annotations

import re

import pytest

from tests.bench.support import run_bench


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_three_replicas_drain_a_backlog_and_report_it(postgres_server: str) -> None:
    """`postgres_server`: only where the tests can start PostgreSQL (the bench starts its
    own, durable, from the same binaries)."""
    done = run_bench(
        "drain", "--skip-naive", "--replicas", "3", "--entries", "600", "--rate", "100"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 recoveryd on one PostgreSQL" in done.stdout
    assert re.search(r"^recoveryd +600 +600 ", done.stdout, re.MULTILINE), done.stdout
    for replica in range(3):
        assert f"recoveryd serve #{replica}: exit status 0" in done.stdout
    verdicts = re.findall(r"^(PASS|MISS) ", done.stdout, re.MULTILINE)
    assert len(verdicts) == 3, done.stdout
