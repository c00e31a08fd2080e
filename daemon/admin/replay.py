"""Replay: a candidate rules file decided again on the store's records (`recoveryd replay`,
`POST /api/v1/replay`, the console's Rules page).

The store hands the records over a page at a time, in received order (an index walk,
`Store.replay_rows`), and the pure engine (rules/replay.py) keeps only counts, a few
examples per group and one budget window of recoveries: a replay of ten million records
holds what one of a thousand does. The command asks a running daemon first, as `ls`
does, and reads the store itself only when no daemon answers.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from daemon.admin.schema import ReplayRefused, ReplayReport
from daemon.foundation.durations import parse_duration
from daemon.foundation.words import counted
from daemon.http.errors import STORE_UNAVAILABLE, error
from daemon.rules import FileError, Ruleset, parse_rules
from daemon.rules.replay import Replay
from daemon.settings import Settings
from daemon.store import Store, StoreUnavailable
from daemon.store.records import ReplayRow

DEFAULT_SINCE = "7d"
PAGE = 5000  # records read a query at a time: the engine holds none of them after it


class ReplayError(Exception):
    """The replay did not happen; `str()` is the line to print."""


class Invalid(Exception):
    """The candidate has problems: `error` says how many, `problems` are the lines
    `recoveryd check` prints."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class ReplayRequest(BaseModel):
    """`POST /api/v1/replay`'s body: the candidate's text, the records' age, and the rule
    to report on (records it decided, or would decide). `file` names the candidate in
    its problems and the report."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: str
    since: str | None = DEFAULT_SINCE
    rule: str | None = None
    file: str = "candidate.yaml"

    def seconds(self) -> float | None:
        """`since` in seconds; ValueError for a duration that is no duration."""
        if self.since is None:
            return None
        seconds = parse_duration(self.since)
        if not math.isfinite(seconds):
            raise ValueError(f"{self.since!r} is longer than any store's history")
        return seconds

    def candidate(self) -> Ruleset:
        """The candidate compiled; Invalid when it has problems."""
        try:
            return parse_rules(self.rules, self.file)
        except FileError as exc:
            problems = [str(problem) for problem in exc.problems]
            raise Invalid(
                f"{counted(len(problems), 'problem')} in the candidate", problems
            ) from None


def request_of(body: Any) -> ReplayRequest:
    """The request in a decoded JSON body; ValueError saying what is wrong with it."""
    try:
        request = ReplayRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise ValueError(f"{where}: {first['msg']}") from None
    try:
        request.seconds()
    except ValueError as exc:
        raise ValueError(f"since: {exc}") from None
    return request


async def replayed(
    store: Store, candidate: Ruleset, since: float | None, rule: str | None, now: float
) -> dict[str, Any]:
    """The report of `candidate` on the records received within `since` seconds of
    `now` (all of them: None). The budget windows reaching back before that are read
    too, so that a budget counts the recoveries made just before the report's start."""
    start = None if since is None else now - since
    warm = None if start is None else start - candidate.longest_budget_window()
    replaying = Replay(candidate, rule=rule, since=start)
    after: tuple[float, str] | None = None
    while True:
        rows = await store.replay_rows(warm, after, PAGE)
        # Deciding a page is some 50 ms of CPU: on a thread, so that the daemon's event
        # loop (callbacks coming in, the pipeline) is not held up while a replay runs.
        await asyncio.to_thread(_add_all, replaying, rows)
        if len(rows) < PAGE:
            return replaying.report()
        after = (rows[-1].received_at, rows[-1].dlq_id)


def _add_all(replaying: Replay, rows: list[ReplayRow]) -> None:
    for row in rows:
        replaying.add(row)


async def replay_now(
    settings: Settings, candidate: Ruleset, since: str | None, rule: str | None
) -> dict[str, Any]:
    """The report of `candidate`, from a running daemon (on RECOVERYD_ADMIN_LISTEN), which
    compiles its text again, or, with none running, from the store (RECOVERYD_STORE)."""
    from daemon.admin.client import DaemonError, ask_daemon, daemon_admin
    from daemon.store import open_store

    admin = daemon_admin(settings)
    if admin is not None:
        body = {"rules": candidate.text, "since": since, "rule": rule, "file": candidate.source}
        try:
            return await ask_daemon(admin, "POST", "/api/v1/replay", json=body, wait=600.0)
        except httpx.ConnectError:
            pass  # no daemon: read the store here
        except (httpx.TimeoutException, DaemonError) as exc:
            raise ReplayError(str(exc) or f"no answer from the daemon at {admin}") from None
    seconds = None if since is None else parse_duration(since)
    try:
        async with open_store(settings.STORE, release_leases=False, create=False) as store:
            return await replayed(store, candidate, seconds, rule, time.time())
    except StoreUnavailable as exc:
        raise ReplayError(f"RECOVERYD_STORE: {exc}") from None


_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ReplayRequest.model_json_schema()}},
    }
}
_REFUSED = error(
    "The body is not a replay's, or the candidate has problems (`problems`, as "
    "`recoveryd check` prints them).",
    ReplayRefused,
)


def replay_routes(store: Store, wall_clock: Callable[[], float]) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/api/v1/replay",
        responses={200: {"model": ReplayReport}, 400: _REFUSED, **STORE_UNAVAILABLE},
        openapi_extra=_BODY,
    )
    async def replay_rules(request: Request) -> JSONResponse:
        """What a candidate rules file would change, decided again on the records' kept
        facts (`recoveryd replay`); the body as JSON: {"rules": "<the file's text>",
        "since": "7d", "rule": null}."""
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError):  # nested deeper than json's recursion allows
            return JSONResponse({"error": "the body is not JSON"}, 400)
        try:
            replay = request_of(body)
            candidate = replay.candidate()
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        except Invalid as exc:
            return JSONResponse({"error": str(exc), "problems": exc.problems}, 400)
        since, now = replay.seconds(), wall_clock()
        return JSONResponse(await replayed(store, candidate, since, replay.rule, now))

    return router
