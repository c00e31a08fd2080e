"""`python -m bench.soak`, as CI runs it: a short soak runs to its end and reports a line
per window and a verdict per target (its figures are for a reader, not checked here)."""

from __future__ import annotations

import re

import pytest

from tests.bench.support import run_bench


@pytest.mark.slow
@pytest.mark.timeout(240)  # about 25 s alone; startup and settling stretch on a busy machine
def test_a_short_soak_reports_each_window_and_every_target() -> None:
    """Four windows of 5 s: three faults (one every window but the last: an outage of a
    second, 503s, dropped connections), the admin reads and the scrapes, as in an hour's."""
    done = run_bench("soak", "--duration", "20s", "--window", "5s")
    assert done.returncode == 0, done.stdout + done.stderr
    windows = re.findall(r"^ +(\d+) +0:(\d\d) ", done.stdout, re.MULTILINE)
    assert windows == [("1", "05"), ("2", "10"), ("3", "15"), ("4", "20")], done.stdout
    verdicts = re.findall(r"^(met|missed|not judged) +(\w+)", done.stdout, re.MULTILINE)
    assert [name for _, name in verdicts] == ["every", "RSS", "descriptors", "store"], done.stdout
