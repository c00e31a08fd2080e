"""The admin listener's own answers (daemon/admin/routes.py), on a running daemon."""

from __future__ import annotations

from pathlib import Path

from tests.support import running_recoveryd


async def test_a_reload_refused_for_one_problem_says_one_problem(tmp_path: Path) -> None:
    """`1 problem in the rules file`, not `1 problem(s)`."""
    rules = tmp_path / "rules.yaml"
    valid = "version: 1\nrules:\n  - name: first\n    match: {workflow: true}\n"
    rules.write_text(valid + "    action: resume\n")
    async with running_recoveryd(tmp_path, RULES=str(rules)) as recoveryd:
        rules.write_text(valid + "    action: resume\n    batch: {maxSize: 0}\n")
        response = await recoveryd.admin.post("/-/reload")
    assert response.status_code == 400
    assert len(response.json()["problems"]) == 1, response.json()
    assert response.json()["error"] == "1 problem in the rules file; the running rules stay"
