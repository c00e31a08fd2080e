"""Settings of the service emulator, with usable defaults and an environment reader."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast, get_args

from daemon.emulator.overrides import is_http_url
from daemon.emulator.ratelimit import Announce, Counting
from daemon.foundation.variables import misspelt
from daemon.foundation.words import either, with_guess

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
    # Where a copy of every workflow run's failure callback goes besides the run's own
    # failure URL (the app's failure function): recoveryd's `/callbacks` for `dev --app`.
    failure_callback_copy: str | None = None
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
        if self.failure_callback_copy is not None and not is_http_url(self.failure_callback_copy):
            raise ValueError("failure_callback_copy must be an absolute http(s) URL")
        if self.callback_retries < 0:
            raise ValueError("callback_retries must not be negative")
        for name, allowed in (("rate_limit_headers", Announce), ("rate_limit_window", Counting)):
            value, choices = getattr(self, name), get_args(allowed)
            if value not in choices:
                raise ValueError(f"{name} {_not_one_of(value, choices)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EmulatorConfig:
        """Read the `EMULATOR_*` variables; unset or empty ones keep their default.
        EmulatorSettingsError names every problem at once, a line each naming its
        variable, as recoveryd's own settings do."""
        env = os.environ if environ is None else environ
        problems = misspelt(env, "EMULATOR_", _VARIABLES, "an emulator setting")

        def text(variable: str, default: str = "") -> str:
            return env.get(variable, "").strip() or default

        def checked(variable: str, default: str, ok: Callable[[str], bool], must: str) -> str:
            value = text(variable, default)
            if ok(value):
                return value
            problems.append(f"{variable}: must be {must}; got {value!r}")
            return default

        def limit(variable: str) -> int | None:
            value = checked(variable, "", _positive, "a positive integer")
            return int(value) if value else None

        def one_of(variable: str, choices: tuple[str, ...]) -> str:
            value = text(variable, choices[0])
            if value in choices:
                return value
            problems.append(f"{variable}: {_not_one_of(value, choices)}")
            return choices[0]

        prefix = checked(
            "EMULATOR_HEADER_PREFIX", DEFAULT_HEADER_PREFIX,
            lambda value: _PREFIX_WORD.match(value) is not None,
            "one word of letters and digits, e.g. Service",
        )  # fmt: skip
        per_second = limit("EMULATOR_MAX_RPS")
        per_day = limit("EMULATOR_MAX_REQUESTS_PER_DAY")
        refuse_gone = checked(
            "EMULATOR_REFUSE_GONE_DLQ_IDS", "false", lambda value: value.lower() in _SWITCH,
            "true or false",
        ).lower() == "true"  # fmt: skip
        copy = checked(
            "EMULATOR_FAILURE_CALLBACK_COPY", "", lambda value: not value or is_http_url(value),
            "an absolute http(s) URL",
        )  # fmt: skip
        announce = one_of("EMULATOR_RATE_LIMIT_HEADERS", get_args(Announce))
        window = one_of("EMULATOR_RATE_LIMIT_WINDOW", get_args(Counting))
        if problems:
            raise EmulatorSettingsError("\n".join(problems))
        return cls(
            token=text("EMULATOR_TOKEN"),
            username=text("EMULATOR_USERNAME", DEFAULT_USERNAME),
            password=text("EMULATOR_PASSWORD"),
            signing_key_current=text("EMULATOR_SIGNING_KEY_CURRENT"),
            signing_key_next=text("EMULATOR_SIGNING_KEY_NEXT"),
            header_prefix=prefix,
            max_requests_per_second=per_second,
            max_requests_per_day=per_day,
            refuse_gone_dlq_ids=refuse_gone,
            failure_callback_copy=copy or None,
            rate_limit_headers=cast(Announce, announce),
            rate_limit_window=cast(Counting, window),
        )


class EmulatorSettingsError(ValueError):
    """EMULATOR_* variables with problems; `str()` is what to print, a line a problem."""


# The EMULATOR_* variables `from_env` reads, without the prefix (docs/emulator.md).
_VARIABLES = (
    "TOKEN", "USERNAME", "PASSWORD", "SIGNING_KEY_CURRENT", "SIGNING_KEY_NEXT", "HEADER_PREFIX",
    "MAX_RPS", "MAX_REQUESTS_PER_DAY", "REFUSE_GONE_DLQ_IDS", "RATE_LIMIT_HEADERS",
    "RATE_LIMIT_WINDOW", "FAILURE_CALLBACK_COPY",
)  # fmt: skip
_SWITCH = ("false", "true")


def _positive(value: str) -> bool:
    return not value or (re.fullmatch("[0-9]+", value) is not None and int(value) >= 1)


def _not_one_of(value: object, choices: tuple[str, ...]) -> str:
    """What is wrong with `value`, which is none of `choices`, said the same of a setting
    and of a keyword argument."""
    return with_guess(f"must be {either(choices)}; got {value!r}", value, choices)
