"""`recoveryd promote`: the shadow rules file made the live one, and a running daemon
told to reload it.

The new file is written beside the old one and renamed over it (atomic on one file
system: the daemon reads the old file or the new, never half of one); the old one is
kept as `<rules>.bak`, to go back to.
"""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import httpx

from daemon.foundation.files import replace_atomically
from daemon.settings import Settings


class PromoteError(Exception):
    """The promotion was refused or could not be finished; `str()` says why."""


def replace_rules(text: str, rules: Path) -> Path:
    """Write `text` (the shadow rules as they were checked) over `rules` atomically,
    keeping the old file as the path returned (`<rules>.bak`)."""
    backup = rules.with_name(rules.name + ".bak")
    if rules.exists():
        shutil.copy2(rules, backup)
    # The new file as readable as the old one was (mkstemp makes it 0600).
    mode = stat.S_IMODE(rules.stat().st_mode) if rules.exists() else 0o644
    replace_atomically(rules, text.encode(), mode)
    return backup


async def reload_daemon(settings: Settings) -> str | None:
    """Ask the daemon on RECOVERYD_ADMIN_LISTEN to reload: the digest it put in force,
    or None when no daemon listens there (it reads the file at its next start)."""
    from daemon.admin.client import DaemonError, ask_daemon, daemon_admin

    admin = daemon_admin(settings)
    if admin is None:
        return None
    try:
        answer = await ask_daemon(admin, "POST", "/-/reload")
    except httpx.ConnectError:
        return None
    except (httpx.TimeoutException, DaemonError) as exc:
        raise PromoteError(f"the daemon at {admin} did not reload: {exc}") from None
    digest = answer.get("sha256")
    return digest if isinstance(digest, str) else ""
