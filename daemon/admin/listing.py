"""The admin routes of the console's listings (docs/api.md#get-apiv1dlq):
`GET /api/v1/dlq`, `/api/v1/batches` and `/api/v1/groups`, which `recoveryd ls` and the
console read. Parameters are read by hand, so that a bad one is a 400 naming it (not
FastAPI's 422); they are documented here for the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from daemon.admin.schema import BatchList, FailureGroups, RecordList
from daemon.foundation.durations import parse_duration
from daemon.http.errors import STORE_UNAVAILABLE, error
from daemon.store import BadQuery, RecordQuery, Store
from daemon.store.listing import MAX_LIMIT
from daemon.store.records import STATES

DEFAULT_LIMIT = 50
DEFAULT_GROUPS = 100


def _parameter(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}  # fmt: skip


_TEXT = {"type": "string"}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}
_CURSOR = _parameter("cursor", _TEXT, "The `next` of the page before; absent for the first.")
_RECORDS = [
    _parameter("state", {"type": "string", "enum": list(STATES)}, "In this state."),
    _parameter("rule", _TEXT, "Decided by this rule."),
    _parameter("action", _TEXT, "Of this action."),
    _parameter("since", _TEXT, "Received within this duration (`90s`, `15m`, `24h`, `7d`)."),
    _parameter("q", _TEXT, "Exactly a dlqId, a workflow run id, a URL or a URL Group."),
    _CURSOR,
    _parameter("limit", {**_LIMIT, "default": DEFAULT_LIMIT}, "At most this many a page."),
]
_BATCHES = [
    _parameter("state", {"type": "string", "enum": ["pending", "settled"]}, "In this state."),
    _CURSOR,
    _parameter("limit", {**_LIMIT, "default": DEFAULT_LIMIT}, "At most this many a page."),
]
_GROUPS = [
    _parameter("limit", {**_LIMIT, "default": DEFAULT_GROUPS}, "At most this many groups."),
]
_BAD = error("A parameter is not valid; `field` names it.")


class _Refused(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def listing_routes(store: Store, wall_clock: Callable[[], float]) -> APIRouter:
    router = APIRouter()

    @router.get(
        "/api/v1/dlq",
        responses={200: {"model": RecordList}, 400: _BAD, **STORE_UNAVAILABLE},
        openapi_extra={"parameters": _RECORDS},
    )
    async def list_records(request: Request) -> JSONResponse:
        """The records, newest received first, a page at a time, filtered by state, rule,
        action and age, or searched by dlqId, run id, URL or URL Group (`recoveryd ls`)."""
        try:
            given = _given(request, ("state", "rule", "action", "since", "q", "cursor"))
            since = given.pop("since", None)
            query = RecordQuery(
                **given,
                since=None if since is None else wall_clock() - _duration(since),
                limit=_limit(request, DEFAULT_LIMIT),
            )
            page = await store.list_records(query)
        except (_Refused, BadQuery) as exc:
            return _refusal(exc)
        return JSONResponse({"items": page.items, "next": page.next})

    @router.get(
        "/api/v1/batches",
        responses={200: {"model": BatchList}, 400: _BAD, **STORE_UNAVAILABLE},
        openapi_extra={"parameters": _BATCHES},
    )
    async def list_batches(request: Request) -> JSONResponse:
        """The batches, newest first, a page at a time; each with its dlqIds, the runs the
        service made and the calls."""
        try:
            given = _given(request, ("state", "cursor"))
            page = await store.list_batches(**given, limit=_limit(request, DEFAULT_LIMIT))
        except (_Refused, BadQuery) as exc:
            return _refusal(exc)
        return JSONResponse({"items": page.items, "next": page.next})

    @router.get(
        "/api/v1/groups",
        responses={200: {"model": FailureGroups}, 400: _BAD, **STORE_UNAVAILABLE},
        openapi_extra={"parameters": _GROUPS},
    )
    async def failure_groups(request: Request) -> JSONResponse:
        """The records grouped by URL Group and endpoint (or URL), status and rule, with
        counts by state, first and last seen; newest activity first."""
        try:
            groups = await store.failure_groups(_limit(request, DEFAULT_GROUPS))
        except (_Refused, BadQuery) as exc:
            return _refusal(exc)
        return JSONResponse({"groups": groups})

    return router


def _given(request: Request, names: tuple[str, ...]) -> dict[str, str]:
    given = {name: request.query_params[name] for name in names if name in request.query_params}
    for name, value in given.items():
        if "\x00" in value:  # no text column of PostgreSQL's can hold it
            raise _Refused(name, f"{name} holds a NUL character")
    return given


def _limit(request: Request, default: int) -> int:
    text = request.query_params.get("limit", str(default))
    # ASCII: isdigit() alone takes "²", which int() refuses.
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_LIMIT:
        raise _Refused("limit", f"limit must be a whole number from 1 to {MAX_LIMIT}; got {text!r}")
    return int(text)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise _Refused("since", f"since: {exc}") from None


def _refusal(exc: _Refused | BadQuery) -> JSONResponse:
    return JSONResponse({"error": str(exc), "field": exc.field}, 400)
