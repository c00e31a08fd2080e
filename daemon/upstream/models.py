"""Typed values for what the service sends and receives (spec sections 2, 4.6, 4.7, 8).

Models of what the service sends keep unknown fields (`extra="allow"`): the service
may add fields, and recoveryd must not drop data it does not understand yet. Models
of what recoveryd sends forbid unknown fields, so a typo is an error, not a no-op.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from daemon.foundation.urls import http_url
from daemon.foundation.words import did_you_mean

BulkAction = Literal["resume", "restart"]
FailureFunctionState = Literal[
    "CALLBACK_INPROGRESS", "CALLBACK_SUCCESS", "CALLBACK_FAIL", "CALLBACK_CANCELED"
]

# What the service accepts in override headers (QStash's formats).
DURATION = re.compile(r"^[0-9]+[smhd]$")  # a whole number and a unit: 30s, 5m, 2h, 1d
LABEL = re.compile(r"^[A-Za-z0-9_.\-]+$")
HEADER_WORD = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces: safe as a header value
# Retry delay: arithmetic over `retried` with a few functions, e.g. pow(2, retried) * 1000.
RETRY_DELAY = re.compile(r"^[0-9a-z_+\-*/(),. ]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 controls, DEL, C1 controls
RETRY_DELAY_NAMES = frozenset(
    {"retried", "pow", "sqrt", "abs", "exp", "floor", "ceil", "round", "min", "max"}
)


# The longest DLQ id taken in a callback: the public listener refuses a longer one
# (ingest/callback.py) and its OpenAPI document says so (http/public_api.py).
MAX_DLQ_ID_LENGTH = 1024


def usable_in_path(value: str) -> bool:
    """Whether an id or name can be a URL path segment: quoting leaves `.` and `..` alone,
    and URL normalisation would then walk up the path (`/v2/topics/..` is `/v2`)."""
    return value not in ("", ".", "..") and not _CONTROL.search(value)


def _header_lists(value: Any) -> Any:
    """Header maps carry lists of values; a single string is taken as a list of one."""
    if isinstance(value, Mapping):
        return {k: [v] if isinstance(v, str) else v for k, v in value.items()}
    return value


HeaderMap = Annotated[dict[str, tuple[str, ...]], BeforeValidator(_header_lists)]


class _Received(BaseModel):
    model_config = ConfigDict(
        extra="allow", frozen=True, populate_by_name=True, alias_generator=to_camel
    )


class DLQMessage(_Received):
    """A dead-lettered message (spec 2.1), plus the fields the real service adds."""

    message_id: str
    topic_name: str | None = None
    endpoint_name: str | None = None
    url: str
    method: str | None = None
    header: HeaderMap = Field(default_factory=dict)
    body: str | None = None
    body_base64: str | None = None
    max_retries: int | None = None
    not_before: int | None = None
    created_at: int
    callback: str | None = None
    failure_callback: str | None = None
    schedule_id: str | None = None
    caller_ip: str = Field(alias="callerIP")
    dlq_id: str
    queue_name: str | None = None
    response_status: int | None = None
    response_header: HeaderMap = Field(default_factory=dict)
    response_body: str | None = None
    response_body_base64: str | None = None
    # Not in the spec's table, but sent by the real service when they apply.
    labels: tuple[str, ...] | None = None
    label: str | None = None
    flow_control_key: str | None = None

    def header_values(self, name: str) -> tuple[str, ...]:
        """All values of request header `name`, matched case-insensitively."""
        wanted = name.lower()
        return tuple(v for k, vs in self.header.items() if k.lower() == wanted for v in vs)


class AccountRecord(BaseModel):
    """The token reset's answer (spec 2.2) with every limit of section 8.

    The wire names are already snake_case. The secrets are SecretStr so that no
    repr, log line or error message can show them.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    customer_id: str | None = None
    id: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None
    active: bool | None = None
    state: str | None = None  # active, passive: not a Literal, see `lenient`
    last_plan_upgrade_time: int | None = None
    type: str | None = None  # free, paid
    reserved_type: str | None = None
    reserved_price: float | None = None
    prod_pack_enabled: bool | None = None
    created_by: str | None = None
    creation_time: int | None = None
    max_message_size: int | None = None
    max_requests_per_day: int | None = None
    max_requests_per_day_hard: int | None = None
    max_endpoints_per_topic: int | None = None
    max_requests_per_second: int | None = None
    max_dlq_size: int | None = None
    max_retries: int | None = None
    max_topics: int | None = None
    max_schedules: int | None = None
    max_events_size: int | None = None
    max_dlq_retention_time_milis: int | None = None
    max_delay: int | None = None
    max_parallelism: int | None = None
    max_global_parallelism: int | None = None
    max_queues: int | None = None
    timeout: int | None = None

    @classmethod
    def lenient(cls, data: Any) -> AccountRecord:
        """Parse the reset's answer, dropping any field that does not fit its type.

        The reset has already replaced the credentials when this runs: refusing the
        whole record over, say, a new plan type would lose the only copy of the new
        token. A field that does not parse is dropped; the rest is kept.
        """
        if not isinstance(data, dict):
            raise ValueError("the account record is not a JSON object")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            bad = {error["loc"][0] for error in exc.errors() if error["loc"]}
            return cls.model_validate({k: v for k, v in data.items() if k not in bad})


class EndpointRef(BaseModel):
    """An endpoint of a URL Group, by name or by url (spec 2.3)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    url: str | None = None

    @model_validator(mode="after")
    def _name_or_url(self) -> EndpointRef:
        if not self.name and not self.url:
            raise ValueError("an endpoint reference needs a name or a url")
        return self

    def wire(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)


class URLGroup(_Received):
    """A URL Group as QStash's get-URL-Group returns it."""

    name: str
    created_at: int | None = None
    updated_at: int | None = None
    endpoints: tuple[EndpointRef, ...] = ()


class WorkflowRun(_Received):
    """A workflow run created by a bulk resume or restart (spec 2.4)."""

    workflow_run_id: str
    workflow_created_at: int


class BulkResult(_Received):
    """One page of a bulk resume or restart (spec 4.4, 4.5)."""

    workflow_runs: tuple[WorkflowRun, ...] = ()
    cursor: str = ""

    @field_validator("workflow_runs", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return () if value is None else value

    @property
    def done(self) -> bool:
        """True when every matching workflow has been processed."""
        return self.cursor == ""


class FailedWorkflowRun(_Received):
    """A failed workflow run as QStash's DLQ listing shows it (not in the spec): the DLQ
    message's fields plus the run's. Only `dlqId` is required: the documented sample of
    the answer leaves out fields a DLQ message always has (`messageId`)."""

    dlq_id: str
    workflow_run_id: str | None = None
    workflow_url: str | None = None
    workflow_created_at: int | None = None
    url: str | None = None
    created_at: int | None = None
    failure_function_state: str | None = None
    response_status: int | None = None


class FailedWorkflowRuns(_Received):
    """One page of QStash's listing of failed workflow runs: no cursor (or "") at the end."""

    messages: tuple[FailedWorkflowRun, ...] = ()
    cursor: str = ""

    @field_validator("messages", "cursor", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return () if info.field_name == "messages" else ""
        return value

    @property
    def done(self) -> bool:
        return self.cursor == ""


class _Sent(BaseModel):
    # camelCase as in rules.yaml and on the wire; snake_case in Python.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=True,
    )


def _duration(value: str | None) -> str | None:
    if value is not None and not DURATION.fullmatch(value):
        raise ValueError(f"must be a number followed by s, m, h or d, e.g. 30s; got {value!r}")
    return value


def _header_word(value: str) -> str:
    if not HEADER_WORD.fullmatch(value):
        raise ValueError(f"must be printable ASCII without spaces (a header value); got {value!r}")
    return value


class FlowControl(_Sent):
    """Flow control for the runs (spec 4.6): a key and at least one of its limits."""

    key: Annotated[str, AfterValidator(_header_word)]
    parallelism: int | None = Field(default=None, ge=1)
    rate: int | None = Field(default=None, ge=1)
    period: Annotated[str | None, AfterValidator(_duration)] = None

    @model_validator(mode="after")
    def _has_a_limit(self) -> FlowControl:
        if self.parallelism is None and self.rate is None:
            raise ValueError("flow control needs parallelism or rate")
        return self

    def value(self) -> str:
        """The header value, e.g. `parallelism=5, rate=10, period=1m`."""
        parts = {"parallelism": self.parallelism, "rate": self.rate, "period": self.period}
        return ", ".join(f"{k}={v}" for k, v in parts.items() if v is not None)


class Overrides(_Sent):
    """Override values for resumed or restarted runs, sent as headers (spec 4.6)."""

    retries: int | None = Field(default=None, ge=0)
    delay: Annotated[str | None, AfterValidator(_duration)] = None
    retry_delay: str | None = None
    flow_control: FlowControl | None = None
    labels: tuple[str, ...] = ()
    failure_callback: str | None = None

    @field_validator("labels")
    @classmethod
    def _labels_are_words(cls, labels: tuple[str, ...]) -> tuple[str, ...]:
        for label in labels:
            if not LABEL.fullmatch(label):
                raise ValueError(f"a label is letters, digits, '-', '_' or '.'; got {label!r}")
        return labels

    @field_validator("retry_delay")
    @classmethod
    def _retry_delay_is_arithmetic(cls, expression: str | None) -> str | None:
        if expression is not None and not (
            RETRY_DELAY.fullmatch(expression) and expression.strip()
        ):
            raise ValueError(
                "must be arithmetic over `retried`, e.g. pow(2, retried) * 1000; "
                f"got {expression!r}"
            )
        depth = 0
        for char in expression or "":
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth < 0:
                break
        if depth != 0:
            raise ValueError(f"unbalanced parentheses in retry delay {expression!r}")
        unknown = sorted(set(re.findall(r"[a-z_]+", expression or "")) - RETRY_DELAY_NAMES)
        if unknown:
            names = ", ".join(sorted(RETRY_DELAY_NAMES))
            hint = did_you_mean(unknown[0], RETRY_DELAY_NAMES)
            raise ValueError(
                f"unknown name {unknown[0]!r} in retry delay; {hint + ' ' if hint else ''}"
                f"known: {names}"
            )
        return expression

    @field_validator("failure_callback")
    @classmethod
    def _absolute_http_url(cls, url: str | None) -> str | None:
        if url is not None:
            _header_word(http_url(url))
        return url

    def headers(self, prefix: str = "Service") -> dict[str, str]:
        """The `<prefix>-*` headers, only for the values that are set."""
        values: dict[str, str | None] = {
            "Retries": None if self.retries is None else str(self.retries),
            "Delay": self.delay,
            "Retry-Delay": self.retry_delay,
            "Flow-Control-Key": self.flow_control.key if self.flow_control else None,
            "Flow-Control-Value": self.flow_control.value() if self.flow_control else None,
            "Label": ",".join(self.labels) or None,
            "Failure-Callback": self.failure_callback,
        }
        return {f"{prefix}-{name}": v for name, v in values.items() if v is not None}


class BulkFilter(_Sent):
    """Which DLQ workflows a bulk call selects (spec 4.7), other than by dlqIds."""

    label: tuple[str, ...] = ()  # OR-ed by the service
    from_date: int | None = None  # ms, inclusive
    to_date: int | None = None  # ms, inclusive
    workflow_url: str | None = None
    workflow_run_id: str | None = None
    workflow_created_at: int | None = None
    failure_function_state: FailureFunctionState | None = None
    caller_ip: str | None = None
    flow_control_key: str | None = None

    def query(self) -> list[tuple[str, str]]:
        """Query parameters; arrays repeated (`label=a&label=b`)."""
        params = [("label", label) for label in self.label]
        for field, value in self.model_dump(exclude={"label"}, exclude_none=True).items():
            params.append((to_camel(field), str(value)))
        return params
