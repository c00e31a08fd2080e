"""A benchmark run as CI runs it: `python -m bench.NAME ARGS` from the repository, with no
RECOVERYD_* variable of the test run leaking in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Its exit status and output; within 220 s (the tests' own timeouts are longer)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERYD_")}
    return subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=220,
    )  # fmt: skip
