"""Descriptors against their limit, in `recoveryd serve` started under `prlimit`."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import httpx
import pytest

from tests.processes import Served, serving
from tests.support import LOOPBACK_TLS, wait_for

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")


def serving_limited(
    tmp_path: Path, soft: int, hard: int, **settings: str
) -> contextlib.AbstractContextManager[Served]:
    """`recoveryd serve` with its descriptors limited to `soft` (raisable to `hard`)."""
    return serving(tmp_path, prefix=("prlimit", f"--nofile={soft}:{hard}"), **settings)


def _metric(served: Served, name: str) -> float:
    text = httpx.get(f"{served.admin_url}/metrics", timeout=5, verify=LOOPBACK_TLS).text
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return float(line.split()[1])


def test_the_soft_limit_is_raised_to_the_hard_one_at_start(tmp_path: Path) -> None:
    """Started with 256 of a possible 2048, the daemon runs with 2048, and says so."""
    with serving_limited(tmp_path, 256, 2048) as served:
        assert _metric(served, "process_max_fds") == 2048
        assert _metric(served, "process_open_fds") < 256
    assert "descriptor limit raised to the hard limit" in served.logs()


def test_near_the_limit_a_warning_and_at_it_not_ready(tmp_path: Path) -> None:
    """Idle connections up to 80 % of the limit bring a warning; near the limit /readyz
    answers 503 naming descriptors; once they close, ready again."""
    limit = 200
    settings = {"HEADER_TIMEOUT": "2m", "MAX_CONNECTIONS": "1000", "LOG_FORMAT": "json"}
    with serving_limited(tmp_path, limit, limit, **settings) as served:
        host, port = served.url.removeprefix("http://").rsplit(":", 1)
        opened: list[socket.socket] = []
        try:
            used = _metric(served, "process_open_fds")
            while used + len(opened) < 0.85 * limit:
                opened.append(socket.create_connection((host, int(port))))
            wait_for(lambda: "open descriptors near their limit" in served.logs())
            assert httpx.get(f"{served.url}/readyz", verify=LOOPBACK_TLS).status_code == 200
            while used + len(opened) < limit - 8:
                opened.append(socket.create_connection((host, int(port))))
            wait_for(
                lambda: httpx.get(f"{served.url}/readyz", verify=LOOPBACK_TLS).status_code == 503
            )
            reasons = httpx.get(f"{served.url}/readyz", verify=LOOPBACK_TLS).json()["reasons"]
            assert any(reason.startswith("descriptors: ") for reason in reasons), reasons
            assert _metric(served, "recoveryd_ready") == 0
        finally:
            for sock in opened:
                sock.close()
        wait_for(lambda: httpx.get(f"{served.url}/readyz", verify=LOOPBACK_TLS).status_code == 200)
        wait_for(lambda: "open descriptors back under their limit" in served.logs())
