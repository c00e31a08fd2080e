"""`recoveryd promote`: the shadow rules written over the rules file (the old one kept
as .bak), and the running daemon reloading them; an invalid shadow file changes nothing."""

from __future__ import annotations

from pathlib import Path

from tests.processes import recoveryd
from tests.support import running_recoveryd

LIVE = "version: 1\nrules:\n  - {name: quiet, match: {}, action: ignore}\n"
CANDIDATE = "version: 1\nrules:\n  - {name: loud, match: {workflow: true}, action: restart}\n"


async def test_promote_replaces_the_rules_and_the_daemon_reloads_them(tmp_path: Path) -> None:
    """The daemon's rules in force become the shadow's, the file as readable as it was;
    without --yes nothing changes."""
    rules, shadow = tmp_path / "rules.yaml", tmp_path / "candidate.yaml"
    rules.write_text(LIVE)
    rules.chmod(0o644)  # read by a daemon of another user, say: the new file is too
    shadow.write_text(CANDIDATE)
    paths = {"RULES": str(rules), "SHADOW_RULES": str(shadow)}
    async with running_recoveryd(tmp_path, **paths) as daemon:
        url = daemon.admin.base_url
        listen = {"ADMIN_LISTEN": f"{url.host}:{url.port}", **paths}
        asked = await recoveryd(tmp_path, "promote", **listen)
        unchanged = rules.read_text()
        done = await recoveryd(tmp_path, "promote", "--yes", **listen)
        in_force = daemon.daemon.rules.current
    assert asked.returncode == 0, asked.stderr
    assert "would write" in asked.stdout
    assert "replayed on 0 records" in asked.stdout  # the daemon's store: nothing decided yet
    assert unchanged == LIVE
    assert done.returncode == 0, done.stderr
    assert "the running daemon reloaded them" in done.stdout
    assert rules.read_text() == CANDIDATE
    assert rules.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "rules.yaml.bak").read_text() == LIVE
    assert [rule.name for rule in in_force.rules] == ["loud"]


async def test_an_invalid_shadow_file_is_not_promoted(tmp_path: Path) -> None:
    """Exit 2 with check's errors; the rules file untouched."""
    rules, shadow = tmp_path / "rules.yaml", tmp_path / "candidate.yaml"
    rules.write_text(LIVE)
    shadow.write_text(CANDIDATE.replace("restart", "explode"))
    done = await recoveryd(tmp_path, "promote", "--yes", RULES=str(rules),
                           SHADOW_RULES=str(shadow), ADMIN_LISTEN="127.0.0.1:0")  # fmt: skip
    checked = await recoveryd(tmp_path, "check", str(shadow))
    assert done.returncode == 2
    assert done.stderr == checked.stderr
    assert rules.read_text() == LIVE
    assert not (tmp_path / "rules.yaml.bak").exists()
