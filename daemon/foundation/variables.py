"""Environment variables that look like settings but are none: misspelt names, found and
named with the nearest setting (recoveryd's RECOVERYD_*, the emulator's EMULATOR_*)."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from daemon.foundation.words import nearest

# Kubernetes injects <SERVICE>_SERVICE_HOST, <SERVICE>_PORT_8080_TCP_ADDR... for every
# Service, "recoveryd" and "recoveryd-metrics" among them: not settings, and not typos.
_SERVICE_LINK = re.compile(
    r"_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)(_\w+)?)?)$"
)


def misspelt(names: Iterable[str], prefix: str, known: Collection[str], what: str) -> list[str]:
    """A line for each of `names` that starts with `prefix` but is none of the settings
    `known` (named without the prefix), with the nearest one: a misspelt optional setting
    would otherwise silently be ignored. `what` says what it is not ("a recoveryd
    setting")."""
    lines = []
    for name in sorted(names):
        setting = name.removeprefix(prefix)
        if not name.startswith(prefix) or setting in known or _SERVICE_LINK.search(name):
            continue
        # Compared without the shared prefix, which would make every name look close.
        near = nearest(setting, known)
        hint = f"; did you mean {prefix}{near}?" if near is not None else ""
        lines.append(f"{name}: not {what}{hint}")
    return lines
