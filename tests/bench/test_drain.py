"""`python -m bench.drain`, briefly: with three replicas on PostgreSQL, and deciding from
the callbacks beside reading every message. It drains, its own checks pass (every dlqId
resumed once, counted from the emulator's journal) and it prints its figures and
verdicts (the figures are for a reader, not checked here)."""

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
    assert re.search(r"^always +600 +600 ", done.stdout, re.MULTILINE), done.stdout
    for replica in range(3):
        assert f"recoveryd serve #{replica}: exit status 0" in done.stdout
    verdicts = re.findall(r"^(PASS|MISS) ", done.stdout, re.MULTILINE)
    assert len(verdicts) == 3, done.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_deciding_from_callbacks_drains_with_bulk_calls_alone_beside_always() -> None:
    """`--fetch needed`: recoveryd reads no DLQ message, and `always` is measured in the
    same run (its own daemon, the emulator reset) and printed beside it."""
    done = run_bench(
        "drain", "--fetch", "needed", "--skip-naive", "--entries", "500",
        "--naive-entries", "100", "--rate", "50",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^needed +500 +0 +10 ", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^always +100 +100 ", done.stdout, re.MULTILINE), done.stdout
    assert "as fast as always" in done.stdout
    verdicts = re.findall(r"^(PASS|MISS) ", done.stdout, re.MULTILINE)
    assert len(verdicts) == 3, done.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_drain_after_an_outage_is_timed_from_the_services_return() -> None:
    """`--outage`: the callbacks arrive while the service is down; the calls that met the
    outage are left out of the table, and the drain is judged against issue 35's bound."""
    done = run_bench("drain", "--outage", "5s", "--skip-naive", "--entries", "300", "--rate", "100")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^always +300 ", done.stdout, re.MULTILINE), done.stdout
    assert "after a 5 s outage (" in done.stdout
    verdicts = re.findall(r"^(PASS|MISS) ", done.stdout, re.MULTILINE)
    assert len(verdicts) == 2, done.stdout


def test_a_service_telling_its_limit_on_429s_only_is_drained_and_its_429s_grouped() -> None:
    """`--service silent`: the emulator tells its limit only on a 429 and counts a sliding
    second; the drain ends, and the 429s are reported as episodes."""
    done = run_bench(
        "drain", "--service", "silent", "--skip-naive", "--entries", "300", "--rate", "50"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(silent service)" in done.stdout
    assert re.search(r"^always +300 ", done.stdout, re.MULTILINE), done.stdout  # 429s are calls too
    assert re.search(r"^(PASS|MISS) +429s in one discovery episode", done.stdout, re.MULTILINE)
    verdicts = re.findall(r"^(PASS|MISS) ", done.stdout, re.MULTILINE)
    assert len(verdicts) == 3, done.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_against_a_revision_drains_the_same_backlog_with_both_and_prints_the_ratio() -> None:
    """`--against HEAD`: that revision's recoveryd (a worktree) drains the same backlog
    in the same run, rounds alternating, and this tree's rate over it is printed."""
    done = run_bench(
        "drain", "--against", "HEAD", "--entries", "200", "--rate", "100", "--skip-naive"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rounds = re.findall(r"^round (\d)  (this tree|recoveryd @HEAD) ", done.stdout, re.MULTILINE)
    assert rounds == [
        ("1", "this tree"), ("1", "recoveryd @HEAD"), ("2", "recoveryd @HEAD"), ("2", "this tree")
    ], done.stdout  # fmt: skip
    assert re.search(r"^always +200 +200 ", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^@HEAD +200 +200 ", done.stdout, re.MULTILINE), done.stdout
    assert "recoveryd @HEAD #0: exit status 0" in done.stdout
    assert re.search(r"^ratio this tree / HEAD: \d+\.\d{3} ", done.stdout, re.MULTILINE)
