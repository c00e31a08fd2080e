"""`recoveryd sweep NAME --dry-run` as users run it, a separate process against the
emulator: it lists exactly what the sweep's filter selects now and changes nothing."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from tests.processes import environ
from tests.support import LOOPBACK_TLS, PASSWORD, TOKEN, USERNAME, emulator_config
from tests.sweeps.support import interleaved, matching, not_matching, split, sweep_rules


@pytest.fixture
def service_url() -> Iterator[str]:
    with serve_in_thread(create_app(emulator_config(execute_runs=False))) as url:
        yield url


def seed(service_url: str, selected: int) -> tuple[list[str], list[str]]:
    messages = interleaved(matching(selected), not_matching())
    response = httpx.post(
        f"{service_url}/_emulator/dlq", json={"messages": messages}, verify=LOOPBACK_TLS
    )
    response.raise_for_status()
    return split(response.json()["dlqIds"], messages)


def sweep(
    tmp_path: Path, service_url: str, *args: str, **settings: str
) -> subprocess.CompletedProcess[str]:
    rules = str(tmp_path / "rules.yaml")
    return subprocess.run(
        [sys.executable, "-m", "daemon", "sweep", *args],
        env=environ(tmp_path, SERVICE_URL=service_url, RULES=rules, **settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def journal(service_url: str) -> list[dict[str, str]]:
    calls: list[dict[str, str]] = httpx.get(
        f"{service_url}/_emulator/journal", verify=LOOPBACK_TLS
    ).json()
    return calls


def in_dlq(service_url: str) -> list[str]:
    return [
        entry["dlqId"]
        for entry in httpx.get(f"{service_url}/_emulator/dlq", verify=LOOPBACK_TLS).json()
    ]


def test_dry_run_lists_exactly_what_the_filter_selects_and_changes_nothing(
    tmp_path: Path, service_url: str
) -> None:
    """Each selected entry once, with its run id, url and creation time, then the count;
    the emulator saw only listings (no bulk call) and its DLQ is as it was."""
    (tmp_path / "rules.yaml").write_text(sweep_rules("1h"))
    selected, others = seed(service_url, 130)
    result = sweep(tmp_path, service_url, "restart-billing", "--dry-run")
    assert result.returncode == 0, result.stderr
    header, *entries, summary = result.stdout.splitlines()
    assert header.startswith("sweep restart-billing: restart what this filter selects now")
    assert sorted(line.split()[0] for line in entries) == sorted(selected)
    assert all(len(line.split()) == 4 for line in entries)
    assert entries[0].split()[3] == "2025-11-20T00:53:20.000+00:00"  # fromDate, inclusive
    assert summary == "130 workflow runs would be restarted by sweep restart-billing"
    calls = journal(service_url)
    assert {(call["method"], call["path"]) for call in calls} == {("GET", "/v2/workflows/dlq")}
    assert sorted(in_dlq(service_url)) == sorted(selected + others)


def test_dry_run_stops_at_max_per_run_and_says_more_match(tmp_path: Path, service_url: str) -> None:
    """As a run would: at most maxPerRun entries, and a note that more match."""
    (tmp_path / "rules.yaml").write_text(sweep_rules("1h", maxPerRun=40))
    seed(service_url, 130)
    result = sweep(tmp_path, service_url, "restart-billing", "--dry-run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 + 40 + 1
    assert lines[-1] == (
        "40 workflow runs would be restarted by sweep restart-billing; "
        "more match beyond maxPerRun (40)"
    )


def test_one_run_selected_is_counted_in_the_singular(tmp_path: Path, service_url: str) -> None:
    """`1 workflow run would be`, not `1 workflow run(s)`."""
    (tmp_path / "rules.yaml").write_text(sweep_rules("1h"))
    seed(service_url, 1)
    result = sweep(tmp_path, service_url, "restart-billing", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "1 workflow run would be restarted by sweep restart-billing"
    )


def test_without_dry_run_it_refuses_and_calls_nothing(tmp_path: Path, service_url: str) -> None:
    """Running a sweep by hand is not offered: a usage error that says where sweeps run."""
    (tmp_path / "rules.yaml").write_text(sweep_rules("1h"))
    result = sweep(tmp_path, service_url, "restart-billing")
    assert result.returncode == 2
    assert "runs on its schedule in `recoveryd serve`" in result.stderr
    assert "--dry-run" in result.stderr
    assert journal(service_url) == []


def test_an_unknown_sweep_is_named_with_the_known_ones(tmp_path: Path, service_url: str) -> None:
    """A name the rules file has no sweep for: exit 1, naming the sweeps it has."""
    (tmp_path / "rules.yaml").write_text(sweep_rules("1h"))
    result = sweep(tmp_path, service_url, "nightly", "--dry-run")
    assert result.returncode == 1
    assert "no sweep named 'nightly' (sweeps: restart-billing)" in result.stderr
    assert journal(service_url) == []


def test_a_mistyped_sweep_is_named_with_the_nearest_one(tmp_path: Path, service_url: str) -> None:
    """A name close to one of the sweeps gets "did you mean" that sweep."""
    (tmp_path / "rules.yaml").write_text(sweep_rules("1h"))
    result = sweep(tmp_path, service_url, "restart-biling", "--dry-run")
    assert result.returncode == 1
    assert (
        "no sweep named 'restart-biling' (sweeps: restart-billing); did you mean 'restart-billing'?"
    ) in result.stderr


def test_dry_run_calls_with_the_token_a_rotation_sealed_into_the_store(
    tmp_path: Path, service_url: str, postgres_url: str
) -> None:
    """With PostgreSQL, rotations keep the token in the store: RECOVERYD_TOKEN is stale
    after the first one, and the command uses the store's, as `serve` does."""
    (tmp_path / "rules.yaml").write_text(sweep_rules("1h"))
    selected, _ = seed(service_url, 3)
    shared = {"STORE": postgres_url, "CREDENTIALS_KEY": Fernet.generate_key().decode()}
    rotated = subprocess.run(
        [sys.executable, "-m", "daemon", "rotate-token", "--timeout", "20s"],
        env=environ(
            tmp_path,
            SERVICE_URL=service_url,
            ACCOUNT_USERNAME=USERNAME,
            ACCOUNT_PASSWORD=PASSWORD,
            **shared,
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rotated.returncode == 0, rotated.stderr
    stale = httpx.get(
        f"{service_url}/v2/dlq/x", headers={"Authorization": f"Bearer {TOKEN}"}, verify=LOOPBACK_TLS
    )
    assert stale.status_code == 401

    result = sweep(tmp_path, service_url, "restart-billing", "--dry-run", **shared)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "3 workflow runs would be restarted by sweep restart-billing"
    )
    assert {line.split()[0] for line in result.stdout.splitlines()[1:-1]} == set(selected)
