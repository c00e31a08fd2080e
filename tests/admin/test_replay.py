"""`recoveryd replay` and `POST /api/v1/replay` refusing what they cannot replay: an
invalid candidate as `recoveryd check` reports it, a body that is not a replay's. (The
reports themselves, after a pipeline run: tests/pipeline/test_replay.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.processes import recoveryd
from tests.support import running_recoveryd

INVALID = """\
version: 1
rules:
  - name: resume-all
    mach: {workflow: true}
    action: resum
"""


async def test_an_invalid_candidate_exits_2_with_the_errors_of_check(tmp_path: Path) -> None:
    """Exactly check's lines on stderr, with a daemon running and without; check exits 1,
    replay 2 (1 says something would change)."""
    path = tmp_path / "candidate.yaml"
    path.write_text(INVALID)
    (tmp_path / "daemon").mkdir()
    checked = await recoveryd(tmp_path, "check", str(path))
    alone = await recoveryd(tmp_path, "replay", str(path), ADMIN_LISTEN="127.0.0.1:0")
    async with running_recoveryd(tmp_path / "daemon") as daemon:
        url = daemon.admin.base_url
        asked = await recoveryd(
            tmp_path, "replay", str(path), ADMIN_LISTEN=f"{url.host}:{url.port}"
        )
    assert checked.returncode == 1
    assert len(checked.stderr.splitlines()) == 3
    for replayed in (alone, asked):
        assert (replayed.returncode, replayed.stdout) == (2, "")
        assert replayed.stderr == checked.stderr


async def test_the_api_refuses_an_invalid_candidate_with_the_problems_check_prints(
    tmp_path: Path,
) -> None:
    """400 with the problems, each as `recoveryd check` prints it for a file so named."""
    path = tmp_path / "candidate.yaml"
    path.write_text(INVALID)
    (tmp_path / "daemon").mkdir()
    checked = await recoveryd(tmp_path, "check", str(path))
    async with running_recoveryd(tmp_path / "daemon") as daemon:
        answer = await daemon.admin.post(
            "/api/v1/replay", json={"rules": INVALID, "file": str(path)}
        )
    assert answer.status_code == 400
    assert answer.json() == {
        "error": "3 problems in the candidate",
        "problems": checked.stderr.splitlines(),
    }


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{", "the body is not JSON"),
        (b"[]", "body: Input should be a valid dictionary"),
        (b'{"since": "7d"}', "rules: Field required"),
        (b'{"rules": "version: 1", "since": "a week"}', "since: a duration is"),
        (b'{"rules": "version: 1", "since": "' + b"9" * 400 + b'd"}', "since: '999"),
        (b'{"rules": "version: 1", "rulez": "x"}', "rulez: Extra inputs are not permitted"),
    ],
    ids=["not-json", "not-an-object", "no-rules", "bad-since", "endless-since", "unknown-key"],
)
async def test_a_body_that_is_not_a_replays_is_a_400_saying_why(
    tmp_path: Path, body: bytes, error: str
) -> None:
    async with running_recoveryd(tmp_path) as daemon:
        answer = await daemon.admin.post("/api/v1/replay", content=body)
    assert answer.status_code == 400
    assert answer.json()["error"].startswith(error), answer.json()
