"""Parse a failure callback's body (docs/api.md#post-callbacks): pure, no I/O."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field, ValidationError

from daemon.upstream.models import MAX_DLQ_ID_LENGTH, _Received, usable_in_path


class CallbackError(ValueError):
    """The body is not a failure callback; `field` names the part that is wrong, if one is."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _dlq_id(value: str) -> str:
    # The id goes into `GET /v2/dlq/{dlqId}` later: refuse now what could never be fetched.
    if not usable_in_path(value) or len(value) > MAX_DLQ_ID_LENGTH:
        raise ValueError(
            f"must be a DLQ id: 1 to {MAX_DLQ_ID_LENGTH} characters, no control characters"
        )
    return value


# A header value may come as one string instead of a list (QStash's documented form).
# Checked here without normalising: that would cost a Python call per map on the hot path,
# and the exact bytes are stored anyway.
RawHeaderMap = dict[str, list[str] | str]


class FailureCallback(_Received):
    """A failure callback as the service sends it, checked field by field. Unknown fields
    are kept; timestamps arrive as ints or numeric strings and become ints."""

    # Wire names only: `{"dlq_id": ...}` is not a failure callback.
    model_config = ConfigDict(hide_input_in_errors=True, populate_by_name=False)

    dlq_id: Annotated[str, AfterValidator(_dlq_id)]
    status: int | None = None
    header: RawHeaderMap | None = None
    body: str | None = None
    retried: int | None = None
    max_retries: int | None = None
    source_message_id: str | None = None
    topic_name: str | None = None
    endpoint_name: str | None = None
    url: str | None = None
    method: str | None = None
    source_header: RawHeaderMap | None = None
    source_body: str | None = None
    not_before: int | None = None
    created_at: int | None = None
    schedule_id: str | None = None
    caller_ip: str | None = Field(default=None, alias="callerIP")
    workflow_run_id: str | None = None
    workflow_created_at: int | None = None


def parse_callback(body: bytes) -> FailureCallback:
    """The callback in `body`, or CallbackError naming the first field that is wrong."""
    try:
        return FailureCallback.model_validate_json(body)
    except ValidationError as exc:
        raise _explain(exc) from None


def _explain(exc: ValidationError) -> CallbackError:
    error = exc.errors(include_url=False, include_input=False)[0]
    if error["type"] == "json_invalid":
        return CallbackError("the body is not valid JSON")
    if not error["loc"]:
        return CallbackError("the body must be a JSON object")
    loc = error["loc"]
    message = error["msg"].removeprefix("Value error, ").replace("Input should be", "must be", 1)
    if loc[0] in ("header", "sourceHeader") and len(loc) > 2:
        # (map, header name, union member, index): the member is pydantic's, not the user's.
        loc = (*loc[:2], *loc[3:])
        if len(loc) == 2:
            message = "must be a string or a list of strings"
    field = ".".join(str(part) for part in loc)
    if error["type"] == "missing":
        return CallbackError(f"{field} is required", field)
    return CallbackError(f"{field} {message}", field)
