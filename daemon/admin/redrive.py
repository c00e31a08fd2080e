"""Redrive: put final dlqIds back into the pipeline (`recoveryd redrive`, `POST /api/v1/redrive`).

A dlqId ends `failed` only when the service said something final about it
(docs/pipeline.md#states); once the cause is fixed (a rule, the workflow's code), the
operator sends it through again. The filter is the same for the command and the admin
API. The command asks a running daemon first, so that its fetch workers pick the dlqIds
up at once, and works on the store itself only when no daemon answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from daemon.foundation.durations import parse_duration
from daemon.foundation.words import unknown_key, with_guess
from daemon.metrics import Metrics
from daemon.settings import Settings
from daemon.store import Store, StoreUnavailable
from daemon.store.records import FINAL, State

log = structlog.get_logger(__name__)

# Answers list at most this many dlqIds; the count is always whole.
LISTED = 1000


class RedriveError(Exception):
    """The redrive did not happen; `str()` is the one line to print."""


class RedriveFilter(BaseModel):
    """Which final dlqIds to redrive: in one of `states`, decided by `rule` (when given),
    whose final state was reached within `since` (a duration such as `24h`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    states: tuple[State, ...] = Field(default=("failed",), min_length=1)
    rule: str | None = None
    # These dlqIds only (the console's selection), when given.
    dlqIds: tuple[str, ...] | None = Field(default=None, min_length=1, max_length=LISTED)
    since: str | None = None
    dryRun: bool = False  # the admin API spells it so; the command's default without --yes

    @field_validator("states", mode="before")
    @classmethod
    def _final(cls, states: Any) -> Any:
        for state in states if isinstance(states, list | tuple) else ():
            if state not in FINAL:
                listed = ", ".join(sorted(FINAL))
                raise ValueError(
                    with_guess(f"{state!r} is not a final state ({listed})", state, FINAL)
                )
        return states

    @field_validator("since")
    @classmethod
    def _duration(cls, since: str | None) -> str | None:
        if since is not None:
            parse_duration(since)
        return since

    @classmethod
    def from_json(cls, data: Any) -> RedriveFilter:
        """The filter in an admin request; RedriveError naming the field otherwise."""
        if not isinstance(data, dict):
            raise RedriveError('the body must be a JSON object, e.g. {"states": ["failed"]}')
        if "state" in data and "states" not in data:  # the command's --state, one or more
            data = {key: value for key, value in data.items() if key != "state"} | {
                "states": [data["state"]] if isinstance(data["state"], str) else data["state"]
            }
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            error = exc.errors(include_url=False, include_input=False)[0]
            field = ".".join(str(part) for part in error["loc"])
            cause = error.get("ctx", {}).get("error")
            if error["type"] == "extra_forbidden":
                cause = unknown_key(field, cls.model_fields)
            raise RedriveFieldError(str(cause or error["msg"]), field) from None


class RedriveFieldError(RedriveError):
    def __init__(self, message: str, field: str) -> None:
        super().__init__(f"{field}: {message}")
        self.message = message
        self.field = field


async def redrive(store: Store, selection: RedriveFilter, now: float) -> dict[str, Any]:
    """Redrive (or, with `dryRun`, only list) the dlqIds `selection` picks."""
    since = now - parse_duration(selection.since) if selection.since else None
    dlq_ids = await store.redrive(
        states=selection.states,
        rule=selection.rule,
        since=since,
        dlq_ids=selection.dlqIds,
        now=now,
        apply=not selection.dryRun,
    )
    return {
        "status": "dry-run" if selection.dryRun else "redriven",
        "count": len(dlq_ids),
        "dlqIds": dlq_ids[:LISTED],
    }


async def redrive_told(
    store: Store,
    selection: RedriveFilter,
    now: float,
    metrics: Metrics,
    on_redriven: Callable[[], None],
    via: str | None = None,
) -> dict[str, Any]:
    """`redrive` for a running daemon (the admin API, the console): what it redrove is
    counted, logged (the audit; `via` says who asked) and the pipeline woken."""
    answer = await redrive(store, selection, now)
    if not selection.dryRun and answer["count"]:
        metrics.redriven.inc(answer["count"])
        log.info("redriven", dlq_ids=answer["count"], states=list(selection.states),
                 rule=selection.rule, since=selection.since,
                 **({"via": via} if via else {}))  # fmt: skip
        on_redriven()
    return answer


async def redrive_now(settings: Settings, selection: RedriveFilter, now: float) -> dict[str, Any]:
    """Ask the daemon on RECOVERYD_ADMIN_LISTEN; with none there, redrive in the store."""
    from daemon.admin.client import DaemonError, ask_daemon, daemon_admin
    from daemon.store import open_store

    admin = daemon_admin(settings)
    if admin is not None:
        try:
            return await ask_daemon(admin, "POST", "/api/v1/redrive", json=selection.model_dump())
        except httpx.ConnectError:
            pass  # no daemon: work on the store here
        except (httpx.TimeoutException, DaemonError) as exc:
            raise RedriveError(str(exc) or f"no answer from the daemon at {admin}") from None
    try:
        async with open_store(settings.STORE, release_leases=False, create=False) as store:
            return await redrive(store, selection, now)
    except StoreUnavailable as exc:
        raise RedriveError(f"RECOVERYD_STORE: {exc}") from None
