"""The shape of `rules.yaml` (docs/rules.md) as frozen pydantic models.

These check types, ranges and formats. What depends on more than one key (which
parameters an action takes, unique names) and the `match` conditions are checked by
`ruleset.py`, over the same document, so that one pass reports every mistake.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from daemon.foundation.durations import parse_duration
from daemon.foundation.schedule import parse_schedule
from daemon.foundation.urls import http_url
from daemon.rules.yamlfile import shown
from daemon.upstream.models import FailureFunctionState, Overrides

Action = Literal["resume", "restart", "remove-endpoint", "notify", "ignore"]
RECOVERIES: tuple[Action, ...] = ("resume", "restart")
MAX_BATCH = 50  # the service takes at most 50 dlqIds per bulk call (docs/rules.md#batches)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")


class Spec(BaseModel):
    """Strict: an unknown key is an error, not a setting silently ignored."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
    )


def _seconds(value: Any) -> float:
    if not isinstance(value, str):
        raise ValueError(
            f"a duration is a number followed by ms, s, m, h or d, e.g. 30s; got {shown(value)}"
        )
    return parse_duration(value)


def _positive(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("must be longer than 0s")
    return seconds


def _name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(
            "must be 1-100 letters, digits, '-', '_' or '.', starting with a letter or digit "
            f"(names appear in metrics and logs); got {value!r}"
        )
    return value


def _one_or_more(value: Any) -> Any:
    # A tuple, not a list: validation is strict, and a strict tuple takes only tuples.
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


def _schedule(value: str) -> str:
    parse_schedule(value)
    return value


Seconds = Annotated[float, BeforeValidator(_seconds)]
Window = Annotated[float, BeforeValidator(_seconds), AfterValidator(_positive)]
Name = Annotated[str, AfterValidator(_name)]


class Batch(Spec):
    """When a batch is flushed; keys left out come from `defaults.batch`."""

    max_size: int | None = None
    max_wait: Seconds | None = None

    @field_validator("max_size")
    @classmethod
    def _at_most_the_service_limit(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= MAX_BATCH:
            raise ValueError(
                f"must be between 1 and {MAX_BATCH} (the service takes at most {MAX_BATCH} "
                f"dlqIds per call); got {value}"
            )
        return value


class Budget(Spec):
    """At most `max_recoveries` of one workflow run within the window."""

    max_recoveries: int = Field(ge=1)
    within: Window


class Threshold(Spec):
    """Remove an endpoint after this many failures within the window."""

    failures: int = Field(ge=1)
    within: Window


class Notify(Spec):
    url: Annotated[str, AfterValidator(http_url)]


class RuleSpec(Spec):
    name: Name
    match: Any  # compiled by ruleset.py into a predicate
    action: Action
    overrides: Overrides | None = None
    batch: Batch | None = None
    budget: Budget | None = None
    threshold: Threshold | None = None
    keep_last_endpoint: bool = True
    notify: Notify | None = None
    dry_run: bool = False
    continue_: bool = Field(default=False, alias="continue")


# Which keys each action takes beyond the common ones, and which it needs.
ACTION_KEYS: dict[str, frozenset[str]] = {
    "resume": frozenset({"overrides", "batch", "budget"}),
    "restart": frozenset({"overrides", "batch", "budget"}),
    "remove-endpoint": frozenset({"threshold", "keepLastEndpoint"}),
    "notify": frozenset({"notify"}),
    "ignore": frozenset(),
}
ACTION_NEEDS: dict[str, frozenset[str]] = {
    "remove-endpoint": frozenset({"threshold"}),
    "notify": frozenset({"notify"}),
}


def _instant(value: Any) -> Any:
    """An absolute time in ms, or `-<duration>` before the sweep runs."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.startswith("-"):
        try:
            parse_duration(value[1:])
        except ValueError:
            pass
        else:
            return value
    raise ValueError(
        "must be a Unix time in milliseconds or a time before the run like -24h; "
        f"got {shown(value)}"
    )


Instant = Annotated[int | str, BeforeValidator(_instant)]


class SweepFilter(Spec):
    """Which workflows a sweep selects (spec 4.7). `label` is one label or a list."""

    label: Annotated[tuple[str, ...], BeforeValidator(_one_or_more)] = ()
    failure_function_state: FailureFunctionState | None = None
    from_date: Instant | None = None
    to_date: Instant | None = None
    workflow_url: str | None = None
    workflow_run_id: str | None = None
    workflow_created_at: int | None = None
    caller_ip: str | None = None
    flow_control_key: str | None = None

    def criteria(self) -> Iterator[str]:
        return (name for name, value in self if value not in (None, ()))


class SweepSpec(Spec):
    name: Name
    schedule: Annotated[str, AfterValidator(_schedule)]
    action: Literal["resume", "restart"]
    filter: SweepFilter
    overrides: Overrides | None = None
    max_per_run: int = Field(default=500, ge=1)
    dry_run: bool = False

    @field_validator("filter")
    @classmethod
    def _selects_something(cls, value: SweepFilter) -> SweepFilter:
        if next(value.criteria(), None) is None:
            raise ValueError(
                "an empty filter selects every workflow in the DLQ; give at least one of "
                "label, failureFunctionState, fromDate, toDate, workflowUrl, workflowRunId, "
                "workflowCreatedAt, callerIp or flowControlKey"
            )
        return value


class Defaults(Spec):
    batch: Batch | None = None
    dry_run: bool = False


class RulesFile(Spec):
    version: Literal[1]
    defaults: Defaults = Defaults()
    rules: tuple[RuleSpec, ...]
    sweeps: tuple[SweepSpec, ...] = ()
