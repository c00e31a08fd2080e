"""The account: its credentials, their reset, and the account record the reset returns."""

from __future__ import annotations

import base64
import binascii
import secrets
import uuid
from collections.abc import Mapping
from typing import Any

# The limits of section 8, with the values of a paid account (samples/account-record.json).
DEFAULT_LIMITS: dict[str, int] = {
    "max_message_size": 1_048_576,
    "max_requests_per_day": 1_000_000,
    "max_requests_per_day_hard": 1_500_000,
    "max_endpoints_per_topic": 100,
    "max_requests_per_second": 100,
    "max_dlq_size": 100_000,
    "max_retries": 5,
    "max_topics": 1000,
    "max_schedules": 1000,
    "max_events_size": 10_000,
    "max_dlq_retention_time_milis": 604_800_000,
    "max_delay": 604_800,
    "max_parallelism": 100,
    "max_global_parallelism": 1000,
    "max_queues": 1000,
    "timeout": 7200,
}


def parse_basic(authorization: str) -> tuple[str, str] | None:
    """(username, password) of a `Basic` Authorization value, or None when it is not one."""
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    username, colon, password = decoded.partition(":")
    return (username, password) if colon else None


def parse_bearer(authorization: str) -> str | None:
    """The token of a `Bearer` Authorization value, or None when it is not one."""
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class Account:
    """One account. Its token and password change on a reset; the old ones stop working."""

    def __init__(self, *, username: str, token: str, password: str, created_at: float) -> None:
        self.id = str(uuid.uuid4())
        self.username = username
        self._token = token
        self._password = password
        self.created_at = int(created_at)
        self.rotations = 0

    def token_is(self, token: str) -> bool:
        return secrets.compare_digest(token.encode(), self._token.encode())

    def credentials_are(self, username: str, password: str) -> bool:
        # Both compared in full, so the answer takes as long whichever one is wrong.
        user_ok = secrets.compare_digest(username.encode(), self.username.encode())
        password_ok = secrets.compare_digest(password.encode(), self._password.encode())
        return user_ok and password_ok

    def rotate(self) -> None:
        self._token = "tok_" + secrets.token_urlsafe(24)
        self._password = "pw_" + secrets.token_urlsafe(18)
        self.rotations += 1

    @property
    def token(self) -> str:
        """The token in force (for in-process tests; never served by the control API)."""
        return self._token

    @property
    def password(self) -> str:
        """The password in force (for in-process tests; never served by the control API)."""
        return self._password

    def record(self, enforced: Mapping[str, int | None]) -> dict[str, Any]:
        """The account record of spec 2.2 and section 8, with the credentials in force and
        the `enforced` limits (None: not enforced, so the plan's default is shown).

        Timestamps are unix seconds, as QStash's are (the spec does not show the unit).
        """
        limits = DEFAULT_LIMITS | {k: v for k, v in enforced.items() if v is not None}
        return {
            "customer_id": self.username,
            "id": self.id,
            "password": self._password,
            "token": self._token,
            "active": True,
            "state": "active",
            "last_plan_upgrade_time": self.created_at,
            "type": "paid",
            "reserved_type": "",
            "reserved_price": 0,
            "prod_pack_enabled": False,
            "created_by": self.username,
            "creation_time": self.created_at,
            **limits,
        }
