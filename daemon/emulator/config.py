"""Settings of the service emulator, with usable defaults and an environment reader."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast, get_args

from daemon.emulator.ratelimit import Announce, Counting
from daemon.words import did_you_mean, either

# The fields whose value is a credential: generated when left empty, never shown in a repr.
SECRET_FIELDS = ("token", "password", "signing_key_current", "signing_key_next")
_SECRET_PREFIXES = {
    "token": "tok_",
    "password": "pw_",
    "signing_key_current": "sig_",
    "signing_key_next": "sig_",
}
_PREFIX_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")

DEFAULT_USERNAME = "ops@example.com"
DEFAULT_HEADER_PREFIX = "Service"


@dataclass(frozen=True)
class EmulatorConfig:
    """How the emulator starts. Credentials left empty are generated with `secrets`.

    The credentials here are the *initial* ones: a token reset replaces them in the running
    emulator (`Emulator.account`), not here. `generated` names the fields that were generated,
    so a developer tool can show them once.
    """

    token: str = field(default="", repr=False)
    username: str = DEFAULT_USERNAME
    password: str = field(default="", repr=False)
    signing_key_current: str = field(default="", repr=False)
    signing_key_next: str = field(default="", repr=False)
    header_prefix: str = DEFAULT_HEADER_PREFIX
    max_requests_per_second: int | None = None
    # Which answers announce that limit (`Burst-RateLimit-*`): every one, or 429s only;
    # and whether it is counted in fixed one-second windows or in a sliding second.
    rate_limit_headers: Announce = "always"
    rate_limit_window: Counting = "fixed"
    # The account's daily budget of calls; None: not enforced, and no `RateLimit-*` header.
    max_requests_per_day: int | None = None
    delivery_retry_delay: float = 0.05
    delivery_timeout: float = 5.0
    # Delays of resumed/restarted runs are honoured but capped, so a `1h` override stays testable.
    max_delay_seconds: float = 1.0
    callback_retries: int = 3
    # Resumed/restarted runs are delivered to their workflow URL; off = only recorded.
    execute_runs: bool = True
    # A bulk call naming a dlqId not in the DLQ is refused with 400 (a stricter service);
    # off, such dlqIds are skipped silently (QStash).
    refuse_gone_dlq_ids: bool = False
    generated: frozenset[str] = field(default=frozenset(), init=False, compare=False)

    def __post_init__(self) -> None:
        generated = set()
        for name in SECRET_FIELDS:
            if not getattr(self, name):
                object.__setattr__(self, name, _SECRET_PREFIXES[name] + secrets.token_urlsafe(24))
                generated.add(name)
        object.__setattr__(self, "generated", frozenset(generated))
        self._validate()

    def _validate(self) -> None:
        if not _PREFIX_WORD.match(self.header_prefix):
            raise ValueError("header_prefix must be one word of letters and digits, e.g. Service")
        for name in ("max_requests_per_second", "max_requests_per_day"):
            limit = getattr(self, name)
            if limit is not None and limit < 1:
                raise ValueError(f"{name} must be a positive integer or None")
        for name in ("delivery_retry_delay", "delivery_timeout", "max_delay_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.callback_retries < 0:
            raise ValueError("callback_retries must not be negative")
        for name, allowed in (("rate_limit_headers", Announce), ("rate_limit_window", Counting)):
            value, choices = getattr(self, name), get_args(allowed)
            if value not in choices:
                hint = did_you_mean(value, choices)
                raise ValueError(
                    f"{name} must be one of {either([repr(c) for c in choices])}; got {value!r}"
                    + (f"; {hint}" if hint else "")
                )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EmulatorConfig:
        """Read the `EMULATOR_*` variables; unset or empty ones keep their default."""
        env = os.environ if environ is None else environ

        def text(variable: str, default: str = "") -> str:
            return env.get(variable, "").strip() or default

        def limit(variable: str) -> int | None:
            value = text(variable)
            if value and (not re.fullmatch("[0-9]+", value) or int(value) < 1):
                raise ValueError(f"{variable} must be a positive integer, got {value!r}")
            return int(value) if value else None

        def switch(variable: str) -> bool:
            value = text(variable, "false").lower()
            if value not in ("true", "false"):
                raise ValueError(f"{variable} must be true or false, got {value!r}")
            return value == "true"

        return cls(
            token=text("EMULATOR_TOKEN"),
            username=text("EMULATOR_USERNAME", DEFAULT_USERNAME),
            password=text("EMULATOR_PASSWORD"),
            signing_key_current=text("EMULATOR_SIGNING_KEY_CURRENT"),
            signing_key_next=text("EMULATOR_SIGNING_KEY_NEXT"),
            header_prefix=text("EMULATOR_HEADER_PREFIX", DEFAULT_HEADER_PREFIX),
            max_requests_per_second=limit("EMULATOR_MAX_RPS"),
            max_requests_per_day=limit("EMULATOR_MAX_REQUESTS_PER_DAY"),
            refuse_gone_dlq_ids=switch("EMULATOR_REFUSE_GONE_DLQ_IDS"),
            # Checked by _validate: a value not among the Literal's is refused there.
            rate_limit_headers=cast(Announce, text("EMULATOR_RATE_LIMIT_HEADERS", "always")),
            rate_limit_window=cast(Counting, text("EMULATOR_RATE_LIMIT_WINDOW", "fixed")),
        )
