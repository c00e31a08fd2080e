"""RECOVERYD_CREDENTIALS_FILE: the one copy of rotated credentials that outlives the process.

A token reset invalidates the old token at once, so the new one must be on disk before
anything uses it, and a crash must leave either the old file or the new one, never half
of one. The file is written to a temporary file in the same folder, flushed, renamed
over the old one and the folder flushed too (so the rename itself survives a power
loss), with mode 0600 from its creation on.

The file is JSON, so an operator can also write one by hand (`{"token": "..."}`):

    {"token": "...", "password": "...", "username": "...",
     "rotation": 12, "rotatedAt": 1795000000.0, "limits": {"max_requests_per_second": 100}}

`rotation` is the id of the rotation that wrote it: a restart that finds that rotation
still recorded as under way knows it got as far as saving its answer.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon.foundation.files import replace_atomically
from daemon.upstream import Credentials


class CredentialsFileError(Exception):
    """The file cannot be read or written; the message never shows its contents."""


@dataclass(frozen=True)
class Saved:
    """What the file holds: credentials, the rotation that wrote them, the account's limits."""

    credentials: Credentials
    rotation: int | None = None
    rotated_at: float | None = None
    limits: dict[str, int] = field(default_factory=dict)


def read(path: Path) -> Saved | None:
    """The saved credentials, or None when there is no file yet (before the first rotation)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CredentialsFileError(f"cannot read {path}: {exc.strerror}") from None
    return loads(raw, str(path))


def loads(raw: bytes, where: str) -> Saved:
    """Saved credentials from their JSON; the errors name `where` they came from."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise CredentialsFileError(
            f'{where} is not JSON; it must hold at least {{"token": "..."}}'
        ) from None
    if not isinstance(data, dict):
        raise CredentialsFileError(f"{where} must hold a JSON object with a token")
    return Saved(
        credentials=Credentials(
            token=_text(data, "token", where, required=True) or "",
            username=_text(data, "username", where),
            password=_text(data, "password", where),
        ),
        rotation=_whole(_number(data, "rotation", where)),
        rotated_at=_number(data, "rotatedAt", where),
        limits=_limits(data.get("limits"), where),
    )


def dumps(saved: Saved) -> bytes:
    """The JSON that `loads` reads back."""
    credentials = saved.credentials
    data: dict[str, Any] = {"token": credentials.token}
    if credentials.password is not None:
        data["password"] = credentials.password
    if credentials.username is not None:
        data["username"] = credentials.username
    if saved.rotation is not None:
        data["rotation"] = saved.rotation
    if saved.rotated_at is not None:
        data["rotatedAt"] = saved.rotated_at
    data["limits"] = saved.limits
    return json.dumps(data, indent=2).encode() + b"\n"


def readable_by_others(path: Path) -> bool:
    """Whether the group or anyone else may read the file (recoveryd writes it 0600)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IRWXG | stat.S_IRWXO))


def write(path: Path, saved: Saved) -> None:
    """Replace the file atomically with `saved`, durable on disk when this returns."""
    try:
        replace_atomically(path, dumps(saved))
    except OSError as exc:
        raise CredentialsFileError(f"cannot write {path}: {exc.strerror}") from None


def check_writable(path: Path) -> None:
    """CredentialsFileError unless a file can be created, flushed and renamed beside `path`:
    checked before a reset, whose new token could otherwise end up with nowhere to go."""
    try:
        handle, temporary = tempfile.mkstemp(
            prefix=f".{path.name}.", suffix=".check", dir=path.parent
        )
        try:
            os.fsync(handle)
        finally:
            os.close(handle)
            os.unlink(temporary)
    except OSError as exc:
        raise CredentialsFileError(f"cannot write beside {path}: {exc.strerror}") from None


def merged(found: Credentials, fallback: Credentials) -> Credentials:
    """The file's credentials, with what the file leaves out taken from `fallback`."""
    return Credentials(
        found.token, found.username or fallback.username, found.password or fallback.password
    )


def _text(data: dict[str, Any], key: str, where: str, *, required: bool = False) -> str | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise CredentialsFileError(f"{where}: {key!r} must be a non-empty string")
    return value.strip()


def _number(data: dict[str, Any], key: str, where: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CredentialsFileError(f"{where}: {key!r} must be a number")
    return float(value)


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def _limits(value: Any, where: str) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(number, int) and not isinstance(number, bool) for number in value.values()
    ):
        raise CredentialsFileError(f"{where}: 'limits' must map names to whole numbers")
    return {str(name): number for name, number in value.items()}
