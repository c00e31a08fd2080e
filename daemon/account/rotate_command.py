"""`recoveryd rotate-token`: ask the running daemon to rotate, or rotate here when none runs.

The daemon holds the token its calls use; rotating behind its back would leave it with a
refused token. So the command asks the daemon's admin listener first, and rotates in its
own process only when nothing listens there (the store's record of the rotation still
keeps two rotations from overlapping).
"""

from __future__ import annotations

import asyncio

import httpx

from daemon.account.rotation import RotationRefused
from daemon.admin.client import DaemonError, ask_daemon, daemon_admin
from daemon.settings import Settings, SettingsError
from daemon.store import StoreUnavailable
from daemon.store.records import Rotation


class RotateError(Exception):
    """The token was not rotated; `str()` is the one line to print."""


async def rotate_now(settings: Settings, wait: float) -> str:
    """Rotate within `wait` seconds; the line to print on success, RotateError otherwise."""
    admin = daemon_admin(settings)
    if admin is not None:
        try:
            await ask_daemon(admin, "POST", "/-/rotate-token", wait=wait)
        except httpx.ConnectError:
            pass  # no daemon: rotate here
        except httpx.TimeoutException:
            raise RotateError(
                f"no answer from the daemon at {admin} within {wait:g}s; "
                "GET /api/v1/status there shows the rotation"
            ) from None
        except DaemonError as exc:
            raise RotateError(str(exc)) from None
        else:
            return f"token rotated by the daemon at {admin}"
    return await _rotate_here(settings, wait)


async def _rotate_here(settings: Settings, wait: float) -> str:
    from daemon.account.assembly import rotating_alone

    try:
        async with asyncio.timeout(wait), rotating_alone(settings) as rotator:
            # No recover(): a rotation recorded as under way may be another live
            # process's; the refusal says so, and the daemon's next start resolves it.
            rotation = await rotator.rotate()
    except TimeoutError:
        raise RotateError(
            f"the rotation did not end within {wait:g}s; the next start of recoveryd "
            "finds out how it ended"
        ) from None
    except (RotationRefused, SettingsError) as exc:
        raise RotateError(f"token not rotated: {exc}") from None
    except StoreUnavailable as exc:
        raise RotateError(f"RECOVERYD_STORE: {exc}") from None
    return _described(rotation, settings)


def _described(rotation: Rotation, settings: Settings) -> str:
    if rotation.result != "success":
        raise RotateError(f"token rotation ended in {rotation.result}: {rotation.reason}")
    saved_to = (
        "the store, sealed with RECOVERYD_CREDENTIALS_KEY"
        if settings.CREDENTIALS_KEY is not None
        else settings.CREDENTIALS_FILE
    )
    return f"token rotated (rotation {rotation.id}); credentials saved to {saved_to}"
