"""The daemon's settings, read once from `RECOVERYD_*` environment variables (docs/settings.md).

A bad setting stops the start with one line naming the variable. Secrets are `SecretStr`
and never echoed back, not even in an error about their own value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from cryptography.fernet import Fernet
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from daemon.foundation.durations import parse_duration
from daemon.foundation.schedule import parse_schedule
from daemon.foundation.urls import credentials_hidden, http_url, without_credentials
from daemon.foundation.variables import misspelt
from daemon.store import is_postgres

PREFIX = "RECOVERYD_"
_PREFIX_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


_SECRETS = frozenset(
    {
        "TOKEN",
        "ACCOUNT_PASSWORD",
        "SIGNING_KEY_CURRENT",
        "SIGNING_KEY_NEXT",
        "ADMIN_TOKEN",
        "CREDENTIALS_KEY",
    }
)


class SettingsError(ValueError):
    """Settings that stop the start; `str()` is what to print, a line a problem."""


@dataclass(frozen=True)
class ListenerLimits:
    """What one connection may take; the settings of the same names (docs/settings.md),
    enforced by the listeners (daemon/http/listener.py)."""

    max_header_bytes: int = 16 * 1024
    header_timeout: float = 10.0
    keepalive_timeout: float = 120.0
    body_timeout: float = 30.0
    max_connections: int = 1024
    max_requests_per_connection: int = 1000


# Whether a setting is set (by name without the prefix), and whether the store is
# PostgreSQL: all that the checks across settings, and a command's needs, look at.
Present = Callable[[str], bool]
# What a command needs that others may leave out: its line (without the prefix), if lacking.
Need = Callable[[Present, bool], str | None]


def needs(*names: str, why: str = "", unless: Collection[str] = ()) -> Need:
    """A need of one of the settings `names`, unless one of `unless` is set; its line
    names the first, the others as alternatives, then `why`."""

    def lacking(present: Present, postgres: bool) -> str | None:
        if any(map(present, (*names, *unless))):
            return None
        line = f"{names[0]}: required"
        if names[1:]:
            line += ", or " + " or ".join(PREFIX + name for name in names[1:])
        return f"{line}: {why}" if why else line

    return lacking


def postgres_store(why: str) -> Need:
    """A need of a PostgreSQL store (RECOVERYD_STORE=postgresql://...)."""

    def lacking(present: Present, postgres: bool) -> str | None:
        return None if postgres else f"STORE: must be a PostgreSQL store (postgresql://...): {why}"

    return lacking


# Where the service's token comes from: what serve needs, and the commands that call it.
TOKEN_SOURCE = needs("TOKEN", "TOKEN_FILE", "CREDENTIALS_FILE")
# Where a token rotated or given by hand is kept (rotate-token, set-token).
CREDENTIALS_KEPT = needs(
    "CREDENTIALS_FILE",
    "CREDENTIALS_KEY",
    why="where the new token is kept (the key seals it into a PostgreSQL store)",
)
# The token reset's basic credentials (rotate-token), which saved ones may hold instead.
RESET_CREDENTIALS = tuple(
    needs(
        name,
        why="the token reset's basic credentials (a credentials file may hold them instead)",
        unless=("CREDENTIALS_FILE", "CREDENTIALS_KEY"),
    )
    for name in ("ACCOUNT_USERNAME", "ACCOUNT_PASSWORD")
)


def fernet_keys(value: str) -> list[str]:
    """RECOVERYD_CREDENTIALS_KEY's keys, in order: the first seals, every one opens (so a
    new key goes first, and the old one stays after it until `recoveryd reseal` has run).
    Whitespace around each is ignored, as a file's trailing newline."""
    return [key.strip() for key in value.split(",") if key.strip()]


def _base_url(value: str) -> str:
    # User info in the URL would make httpx send basic auth instead of the bearer token
    # (the service refuses it), and print the password wherever the URL is logged. Any
    # `@`: a password holding `/`, `?` or `#` ends the URL's netloc before its `@`.
    if "@" in value:
        raise ValueError(
            "must not carry a user or password (the token goes in RECOVERYD_TOKEN); "
            f"got {without_credentials(value)!r}"
        )
    # Paths are appended to it: `https://host/` and `https://host` are the same base.
    return http_url(value).rstrip("/")


def _duration(value: Any) -> Any:
    return parse_duration(value) if isinstance(value, str) else value


def _listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT, e.g. 0.0.0.0:8080 or [::]:8080; got {value!r}")
    return value


def header_prefix(value: str) -> str:
    """`value` as the service's header prefix (`Service-Retries`...); `ValueError` if it is
    not one word. Shared with the commands that take the prefix as a flag."""
    if not _PREFIX_WORD.fullmatch(value):
        raise ValueError(f"must be one word of letters, e.g. Service or Upstash; got {value!r}")
    return value


def _schedule(value: str) -> str:
    if value.strip():
        parse_schedule(value)
    return value


HttpUrl = Annotated[str, AfterValidator(http_url)]
Duration = Annotated[float, BeforeValidator(_duration), Field(gt=0)]
BaseUrl = Annotated[str, AfterValidator(_base_url)]
Listen = Annotated[str, AfterValidator(_listen)]
HeaderPrefix = Annotated[str, AfterValidator(header_prefix)]


def _split_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def _postgres_url(value: str) -> str:
    """`value` if libpq would take it (psycopg parses it as libpq does)."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    shown = without_credentials(value)
    try:
        parts = conninfo_to_dict(value)
    except ProgrammingError as exc:
        said = credentials_hidden(str(exc), value).splitlines()[0]
        raise ValueError(f"not a PostgreSQL URL ({said}); got {shown!r}") from None
    for port in str(parts.get("port", "")).split(","):
        if port and not port.isdigit():
            raise ValueError(f"the port must be a number; got {shown!r}")
    return value


class Settings(BaseModel):
    """Everything `recoveryd serve` is configured with; see docs/settings.md."""

    # Field names are the variables' names without the prefix, so errors map back exactly.
    model_config = ConfigDict(frozen=True, extra="forbid")

    SERVICE_URL: BaseUrl | None = None
    ACCOUNT_URL: BaseUrl | None = None
    TOKEN: SecretStr | None = None
    TOKEN_FILE: Path | None = None
    ACCOUNT_USERNAME: str | None = None
    ACCOUNT_PASSWORD: SecretStr | None = None
    CREDENTIALS_FILE: Path | None = None
    CREDENTIALS_KEY: SecretStr | None = None
    ROTATE_SCHEDULE: Annotated[str, AfterValidator(_schedule)] = ""
    SIGNING_KEY_CURRENT: SecretStr | None = None
    SIGNING_KEY_NEXT: SecretStr | None = None
    ALLOW_UNSIGNED: bool = False
    PUBLIC_URL: HttpUrl | None = None
    RULES: Path = Path("rules.yaml")
    # A candidate rules file deciding beside RULES, recorded and never acted on.
    SHADOW_RULES: Path | None = None
    STORE: str = "sqlite:///recoveryd.db"
    LISTEN: Listen = "0.0.0.0:8080"
    ADMIN_LISTEN: Listen = "127.0.0.1:9090"
    ADMIN_TOKEN: SecretStr | None = None
    HEADER_PREFIX: HeaderPrefix = "Service"
    MAX_RPS: float | None = Field(default=None, gt=0)
    MAX_BODY_BYTES: int = Field(default=1024 * 1024, gt=0)
    # What one connection to a listener may take (daemon/http/listener.py, docs/settings.md).
    MAX_HEADER_BYTES: int = Field(default=16 * 1024, ge=1024)
    HEADER_TIMEOUT: Duration = 10.0
    KEEPALIVE_TIMEOUT: Duration = 120.0
    BODY_TIMEOUT: Duration = 30.0
    MAX_CONNECTIONS: int = Field(default=1024, gt=0)
    MAX_REQUESTS_PER_CONNECTION: int = Field(default=1000, gt=0)
    MAX_REMOVALS_PER_HOUR: int = Field(default=10, ge=0)
    DRY_RUN: bool = False
    # `needed`: decide from a signed callback when it carries what the rules read.
    FETCH: Literal["always", "needed"] = "always"
    LOG_FORMAT: Literal["json", "console"] = "json"
    RETENTION: Duration = 7 * 86400.0
    # How long a replica's work outlives its last heartbeat (daemon/runtime/replicas.py).
    REPLICA_LEASE: Annotated[Duration, Field(ge=3)] = 30.0

    @field_validator("STORE")
    @classmethod
    def _store_url(cls, value: str) -> str:
        if value.startswith("sqlite:///") and len(value) > len("sqlite:///"):
            return value
        if is_postgres(value):
            return _postgres_url(value)
        shown = without_credentials(value)
        raise ValueError(f"must be sqlite:///PATH or postgresql://...; got {shown!r}")

    @field_validator("CREDENTIALS_KEY")
    @classmethod
    def _fernet_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        keys = fernet_keys(value.get_secret_value())
        if not keys:
            raise ValueError("is set but holds no key")
        for number, key in enumerate(keys, start=1):
            try:
                Fernet(key)
            except ValueError:
                which = f"key {number} of {len(keys)}" if len(keys) > 1 else "it"
                raise ValueError(
                    f"must be a Fernet key, or several comma-separated; {which} is not one "
                    "(32 bytes in URL-safe base64, as `python -c 'from cryptography.fernet "
                    "import Fernet; print(Fernet.generate_key().decode())'` prints)"
                ) from None
        return SecretStr(",".join(keys))

    @field_validator(*_SECRETS)
    @classmethod
    def _not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError("is set but empty")
        return value

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Settings:
        problems = _across(
            lambda name: getattr(self, name) is not None,
            postgres=is_postgres(self.STORE),
            rotating=bool(self.ROTATE_SCHEDULE.strip()),
            allow_unsigned=self.ALLOW_UNSIGNED,
            daemon=_for_daemon(info),
            store_said=bool((info.context or {}).get("store_said")),
        )
        if problems:
            raise _NamedErrors(problems)
        return self

    # Derived values, so callers never re-parse strings.

    @property
    def service_url(self) -> str:
        if self.SERVICE_URL is None:
            raise SettingsError(f"{PREFIX}SERVICE_URL: required")
        return self.SERVICE_URL

    @property
    def account_url(self) -> str:
        return self.ACCOUNT_URL or self.service_url

    @property
    def listen(self) -> tuple[str, int]:
        return _split_listen(self.LISTEN)

    @property
    def admin_listen(self) -> tuple[str, int]:
        return _split_listen(self.ADMIN_LISTEN)

    @property
    def listener_limits(self) -> ListenerLimits:
        return ListenerLimits(
            max_header_bytes=self.MAX_HEADER_BYTES,
            header_timeout=self.HEADER_TIMEOUT,
            keepalive_timeout=self.KEEPALIVE_TIMEOUT,
            body_timeout=self.BODY_TIMEOUT,
            max_connections=self.MAX_CONNECTIONS,
            max_requests_per_connection=self.MAX_REQUESTS_PER_CONNECTION,
        )

    @property
    def signing_keys(self) -> tuple[bytes, ...]:
        keys = (self.SIGNING_KEY_CURRENT, self.SIGNING_KEY_NEXT)
        return tuple(key.get_secret_value().encode() for key in keys if key is not None)

    def token(self) -> str | None:
        """The bearer token from RECOVERYD_TOKEN or the file RECOVERYD_TOKEN_FILE names."""
        if self.TOKEN is not None:
            return self.TOKEN.get_secret_value()
        if self.TOKEN_FILE is None:
            return None
        try:
            token = self.TOKEN_FILE.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SettingsError(f"{PREFIX}TOKEN_FILE: cannot read it: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise SettingsError(f"{PREFIX}TOKEN_FILE: {self.TOKEN_FILE} is not UTF-8") from None
        if not token:
            raise SettingsError(f"{PREFIX}TOKEN_FILE: {self.TOKEN_FILE} is empty")
        return token


def _for_daemon(info: ValidationInfo) -> bool:
    return bool((info.context or {}).get("daemon", True))


def _across(
    present: Present,
    *,
    postgres: bool,
    rotating: bool,
    allow_unsigned: bool,
    daemon: bool,
    store_said: bool,
) -> list[str]:
    """The checks across settings, one line each naming its variable. Only presence
    matters to them, so they run on the raw values too when some value is bad: every
    problem is reported at once. A one-shot command (`daemon` false) needs no token to
    serve with and checks no callback signature."""
    problems = []
    if present("TOKEN") and present("TOKEN_FILE"):
        problems.append("TOKEN_FILE: set RECOVERYD_TOKEN or RECOVERYD_TOKEN_FILE, not both")
    if daemon and (lacking := TOKEN_SOURCE(present, postgres)):
        problems.append(lacking)
    if present("CREDENTIALS_KEY") and not postgres:
        if not store_said:  # the command's own need of PostgreSQL said it of the store
            problems.append(
                "CREDENTIALS_KEY: only with a PostgreSQL store (RECOVERYD_STORE=postgresql://...); "
                "with SQLite the rotated token is kept in RECOVERYD_CREDENTIALS_FILE"
            )
    elif present("CREDENTIALS_KEY") and present("CREDENTIALS_FILE"):
        problems.append(
            "CREDENTIALS_FILE: set RECOVERYD_CREDENTIALS_FILE or RECOVERYD_CREDENTIALS_KEY, "
            "not both"
        )
    elif rotating and postgres and not present("CREDENTIALS_KEY"):
        problems.append(
            "CREDENTIALS_KEY: required when RECOVERYD_ROTATE_SCHEDULE is set with a "
            "PostgreSQL store: the rotated token is kept in the store, sealed with it, for "
            "every replica"
        )
    elif rotating and not postgres and not present("CREDENTIALS_FILE"):
        problems.append(
            "CREDENTIALS_FILE: required when RECOVERYD_ROTATE_SCHEDULE is set: the rotated "
            "token is kept there, or a restart would lose it"
        )
    if present("SIGNING_KEY_NEXT") and not present("SIGNING_KEY_CURRENT"):
        problems.append("SIGNING_KEY_CURRENT: required when RECOVERYD_SIGNING_KEY_NEXT is set")
    elif daemon and not present("SIGNING_KEY_CURRENT") and not allow_unsigned:
        problems.append(
            "SIGNING_KEY_CURRENT: required: without a signing key anyone could forge "
            "callbacks (set RECOVERYD_ALLOW_UNSIGNED=true to accept unsigned callbacks)"
        )
    return [PREFIX + problem for problem in problems]


class _NamedErrors(ValueError):
    """The checks across settings that failed, each line naming its variable."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def load_settings(
    environ: Mapping[str, str],
    *,
    require: Collection[str | Need] = (),
    daemon: bool = True,
    only: Collection[str] | None = None,
    **overrides: Any,
) -> Settings:
    """Settings from `environ` (RECOVERYD_* only) and `overrides` (e.g. from the command
    line); `require` names settings the command needs that others may leave out (or
    `needs` of one of several), and `daemon` false spares a one-shot command the daemon's
    own needs (a token to call with, a signing key to check callbacks with). With `only`,
    just those settings are read, for a command that runs away from the daemon's
    environment (`check`): the others keep their defaults, unchecked.

    A variable set to the empty string counts as unset, as a Helm chart renders an
    optional value left out. Raises `SettingsError` listing every problem at once, a line
    each naming its variable (a first start should not take one run a mistake); a
    RECOVERYD_* variable that is no setting is one too, since a misspelt
    RECOVERYD_PUBLIC_URL would silently turn a check off.
    """
    problems = misspelt(environ, PREFIX, Settings.model_fields, "a recoveryd setting")
    values = {
        setting: value
        for name, value in environ.items()
        if (setting := name.removeprefix(PREFIX)) in Settings.model_fields
        and name.startswith(PREFIX)
        and value != ""
        and (only is None or setting in only)
    }
    values.update(overrides)
    postgres = is_postgres(values.get("STORE"))

    def present(name: str) -> bool:
        return values.get(name) is not None

    checks = [needs(need) if isinstance(need, str) else need for need in require]
    lacking = [line for check in checks if (line := check(present, postgres))]
    problems += [PREFIX + line for line in lacking]
    # A command that needs a PostgreSQL store has said what is wrong with a SQLite one.
    store_said = any(line.startswith("STORE:") for line in lacking)
    context = {"daemon": daemon, "store_said": store_said}
    try:
        settings = Settings.model_validate(values, context=context)
    except ValidationError as exc:
        problems += _lines(exc, values, daemon, store_said)
    if problems:
        raise SettingsError("\n".join(problems))
    return settings


def _lines(
    exc: ValidationError, values: Mapping[str, Any], daemon: bool, store_said: bool
) -> list[str]:
    """A line for each bad setting (its first error), then the checks across settings,
    which pydantic skips while any value is bad."""
    lines: dict[str, str] = {}
    for error in exc.errors(include_url=False, include_input=False):
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, _NamedErrors):
            return cause.lines  # the values were all good: these are the only problems
        field = str(error["loc"][0]) if error["loc"] else "?"
        if field in lines:
            continue
        if cause is not None:
            lines[field] = f"{PREFIX}{field}: {cause}"
            continue
        message = error["msg"].replace("Input should be", "must be", 1)
        if field not in _SECRETS:
            message += f"; got {values[field]!r}"
        lines[field] = f"{PREFIX}{field}: {message}"
    rotating = bool(str(values.get("ROTATE_SCHEDULE") or "").strip())
    postgres = is_postgres(values.get("STORE"))
    across = _across(lambda name: values.get(name) is not None, postgres=postgres,
                     rotating=rotating, allow_unsigned=_true(values.get("ALLOW_UNSIGNED")),
                     daemon=daemon, store_said=store_said)  # fmt: skip
    return [*lines.values(), *across]


def _true(value: Any) -> bool:
    try:
        return bool(TypeAdapter(bool).validate_python(value))
    except ValidationError:
        return False
