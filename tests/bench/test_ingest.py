"""`python -m bench.ingest`, briefly: recoveryd on SQLite and on PostgreSQL side by side,
every answer and both stores checked by the bench itself (the figures are for a reader,
not checked here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ingest_prints_postgresql_next_to_sqlite(postgres_server: str) -> None:
    """`postgres_server`: only where the tests can start PostgreSQL (the bench starts its
    own, durable, from the same binaries)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERYD_")}
    command = [sys.executable, "-m", "bench.ingest", "--requests", "500", "--rounds", "1",
               "--warmup", "100"]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=220
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fsync=on, synchronous_commit=on" in done.stdout
    for name in ("recoveryd serve", "recoveryd serve pg"):
        assert re.search(rf"^{name} +[\d,]+ ", done.stdout, re.MULTILINE), done.stdout
        assert re.search(rf"^ratio {name} / bare uvicorn: ", done.stdout, re.MULTILINE)
        assert (
            f'{name} store: 600 rows, 600 distinct dlqIds; 600 dlqIds were answered "accepted": OK'
            in done.stdout
        )
