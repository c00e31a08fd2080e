"""The console's routes (docs/console.md): each page, the fragments its live parts poll,
login and logout, and the actions, each behind a confirmation page.

The actions reuse what the admin API does (admin/redrive.py, endpoints/restore.py,
sweeps/command.py, LiveRules.reload) and log its event with via="console": the audit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from daemon.admin.console import security, views
from daemon.admin.redrive import RedriveFilter, redrive, redrive_told
from daemon.admin.replay import DEFAULT_SINCE, replayed
from daemon.admin.shadow import shadow_status
from daemon.endpoints.restore import RestoreFailed, restore_told
from daemon.foundation.durations import parse_duration
from daemon.metrics import Metrics
from daemon.rules import FileError, Unreadable, facts, load_rules
from daemon.rules.callback import message_of
from daemon.rules.explain import explain
from daemon.rules.live import LiveRules
from daemon.rules.replay_text import verdict
from daemon.rules.shadow import ShadowRules
from daemon.rules.testing import results_beside
from daemon.store import BadQuery, RecordQuery, Store, StoreUnavailable
from daemon.store.records import FINAL, STATES
from daemon.store.removals import RestoreRefused
from daemon.sweeps.command import would_select
from daemon.sweeps.plan import plan
from daemon.sweeps.scheduler import Sweeper
from daemon.upstream import ServiceClient, ServiceError

log = structlog.get_logger(__name__)

ACTIONS = ("resume", "restart", "notify", "remove-endpoint", "ignore")
PAGE_SIZE = 50
SWEEP_RUNS = 5


@dataclass(frozen=True)
class Parts:
    """What the console reads and acts on: the admin listener's parts."""

    store: Store
    metrics: Metrics
    rules: LiveRules
    client: ServiceClient
    status: Callable[[], Awaitable[dict[str, Any]]]  # /api/v1/status's answer
    dlq_retention: Callable[[], float | None]  # the account's, once read
    sweeper: Sweeper | None
    on_redriven: Callable[[], None]
    wall_clock: Callable[[], float]
    header_prefix: str
    token: str | None
    shadow: ShadowRules | None = None  # RECOVERYD_SHADOW_RULES, when set


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("daemon.admin.console", "templates"),
        autoescape=True,  # every value from a callback or the service is untrusted text
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=views.when, age=views.age)
    return env


class Console:
    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.env = _environment()
        self.key = security.session_key(parts.token) if parts.token is not None else None
        self._replaying = asyncio.Lock()
        # The last replay of the rules file: (its digest, the live one's), when, the answer.
        self._reload_would: tuple[tuple[str, str], float, dict[str, Any]] | None = None

    # -- rendering -------------------------------------------------------------------

    def render(self, request: Request, template: str, code: int = 200, **context: Any) -> Response:
        """The page, with the CSRF token its forms carry (a new one set as a cookie)."""
        known = request.cookies.get(security.CSRF_COOKIE)
        csrf = known or security.new_csrf()
        html = self.env.get_template(template).render(
            csrf=csrf, token_set=self.key is not None, here=request.url.path, **context
        )
        response = HTMLResponse(html, code)
        if known is None:
            response.set_cookie(
                security.CSRF_COOKIE, csrf, httponly=True, samesite="strict", path="/ui"
            )
        return response

    async def posted(self, request: Request) -> dict[str, list[str]] | None:
        """The form of a POST, or None when its CSRF token does not hold."""
        form = parse_qs((await request.body()).decode(errors="replace"), keep_blank_values=True)
        field = form.get("csrf", [None])[0]
        if not security.csrf_holds(request.cookies.get(security.CSRF_COOKIE), field):
            return None
        return form

    def refused(self, request: Request) -> Response:
        return self.render(request, "refused.html", 403)

    def now(self) -> float:
        return self.parts.wall_clock()

    # -- login -----------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        if self.key is None:
            return RedirectResponse("/ui/", 303)
        return self.render(request, "login.html")

    async def login(self, request: Request) -> Response:
        form = await self.posted(request)
        if form is None:
            return self.refused(request)
        token = self.parts.token
        if self.key is None or token is None:
            return RedirectResponse("/ui/", 303)
        if not security.same_token(form.get("token", [""])[0], token):
            log.warning("console login refused")
            return self.render(request, "login.html", 401, wrong=True)
        response = RedirectResponse("/ui/", 303)
        response.set_cookie(
            security.SESSION_COOKIE,
            security.new_session(self.key, time.time()),
            max_age=security.SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            path="/ui",
        )
        log.info("console login")
        return response

    async def logout(self, request: Request) -> Response:
        if await self.posted(request) is None:
            return self.refused(request)
        response = RedirectResponse("/ui/login", 303)
        response.delete_cookie(
            security.SESSION_COOKIE, path="/ui", httponly=True, samesite="strict"
        )
        return response

    # -- pages -----------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", **await self._overview())

    async def overview_fragment(self, request: Request) -> Response:
        return self.render(request, "overview_live.html", **await self._overview())

    async def _overview(self) -> dict[str, Any]:
        parts, now = self.parts, self.now()
        status = await parts.status()
        activity = await parts.store.activity(now)
        limiter = parts.client.limiter
        return {
            "status": status,
            "states": STATES,
            "activity": {name: (counts, views.sparkline(counts))
                         for name, counts in activity.items()},
            "limiter": {"pace": limiter.pace, "rate": limiter.rate, "source": limiter.source,
                        "phase": limiter.phase},
            "ruleset": parts.rules.current,
            "last_reload": parts.rules.last_reload,
            "dlq_retention": parts.dlq_retention(),
            "next_rotation": views.next_fire(status["token"]["rotateSchedule"], now),
            "token_age": now - rotated if (rotated := status["token"]["lastRotationSuccessAt"])
                         else None,
            "spark": (views.SPARK_WIDTH, views.SPARK_HEIGHT),
        }  # fmt: skip

    async def failures(self, request: Request) -> Response:
        query, error = self._query(request.query_params)
        page = await self.parts.store.list_records(query) if error is None else None
        return self.render(
            request, "failures.html", 400 if error else 200, **self._listing(request, page, error)
        )

    async def failures_fragment(self, request: Request) -> Response:
        query, error = self._query(request.query_params)
        page = await self.parts.store.list_records(query) if error is None else None
        return self.render(request, "failures_rows.html", **self._listing(request, page, error))

    def _listing(self, request: Request, page: Any, error: str | None) -> dict[str, Any]:
        params = {key: value for key, value in request.query_params.items() if key != "cursor"}
        following = None
        if page is not None and page.next:
            following = "/ui/failures?" + urlencode({**params, "cursor": page.next})
        return {
            "page": page,
            "error": error,
            "filters": params,
            "states": STATES,
            "actions": ACTIONS,
            "rule_names": [rule.name for rule in self.parts.rules.current.rules],
            "following": following,
            # A later page stays as it is: the newest rows are the first page's.
            "live": None if _later(request) else "/ui/fragments/failures?" + urlencode(params),
            "final": FINAL,
        }

    def _query(self, params: Mapping[str, str]) -> tuple[RecordQuery, str | None]:
        """The filters of the failures list as the store's query; a bad one's message."""

        given = {key: params.get(key) or None for key in ("state", "rule", "action", "q", "cursor")}
        if given["state"] is not None and given["state"] not in STATES:
            return RecordQuery(), f"state: {given['state']!r} is not a state ({', '.join(STATES)})"
        since = None
        if params.get("since"):
            try:
                since = self.now() - parse_duration(params["since"])
            except ValueError as exc:
                return RecordQuery(), f"since: {exc}"
        return RecordQuery(**given, since=since, limit=PAGE_SIZE), None

    async def failure(self, request: Request) -> Response:
        dlq_id = request.path_params["dlq_id"]
        record = await self.parts.store.record(dlq_id)
        if record is None:
            return self.render(request, "missing.html", 404, dlq_id=dlq_id)
        callback = await self.parts.store.get_callback(dlq_id)
        shown = _callback(callback.body) if callback is not None else None
        reasoning = None
        if shown is not None:
            ruleset, prefix = self.parts.rules.current, self.parts.header_prefix
            message = message_of(shown)
            decision = ruleset.interpret(facts(message, prefix))
            reasoning = explain(ruleset, message, decision, prefix)
        return self.render(
            request,
            "failure.html",
            record=record,
            steps=views.timeline(record),
            callback=shown,
            headers=views.masked(shown.get("sourceHeader")) if shown else [],
            response_headers=views.masked(shown.get("header")) if shown else [],
            body=views.body_text(shown.get("sourceBody")) if shown else ("", False),
            response_body=views.body_text(shown.get("body")) if shown else ("", False),
            reasoning=reasoning,
            lineage=await self.parts.store.lineage(dlq_id),
            final=record["state"] in FINAL,
        )

    async def groups(self, request: Request) -> Response:
        groups = await self.parts.store.failure_groups()
        return self.render(request, "groups.html", groups=groups)

    async def batches(self, request: Request) -> Response:
        state = request.query_params.get("state") or None
        cursor = request.query_params.get("cursor") or None
        page = await self.parts.store.list_batches(state, cursor, PAGE_SIZE)
        following = None
        if page.next:
            following = "/ui/batches?" + urlencode({"state": state or "", "cursor": page.next})
        return self.render(request, "batches.html", page=page, following=following, state=state)

    async def removals(self, request: Request) -> Response:
        return self.render(request, "removals.html", removals=await self.parts.store.removals())

    async def sweeps(self, request: Request) -> Response:
        sweeper = self.parts.sweeper
        sweeps = await sweeper.describe(SWEEP_RUNS) if sweeper is not None else []
        return self.render(request, "sweeps.html", sweeps=sweeps)

    async def rules(self, request: Request) -> Response:
        ruleset = self.parts.rules.current
        try:
            text = self.parts.rules.path.read_text()
        except OSError as exc:
            text = f"(the rules file cannot be read now: {exc})"
        return self.render(
            request,
            "rules.html",
            ruleset=ruleset,
            outcomes=await self.parts.store.rule_outcomes(),
            tests=await asyncio.to_thread(
                results_beside, self.parts.rules.path, ruleset, self.parts.header_prefix
            ),
            text=text,
            last_reload=self.parts.rules.last_reload,
            states=STATES,
            reload_would=await self.reload_would(),
            shadow=await shadow_status(self.parts.shadow, self.parts.store),
        )

    async def reload_would(self) -> dict[str, Any]:
        """What reloading the rules file would change: the file on disk replayed on the
        records of the last DEFAULT_SINCE (only when it differs from the rules in force)."""
        try:
            candidate = await asyncio.to_thread(load_rules, self.parts.rules.path)
        except FileError as exc:
            return {"problems": [str(problem) for problem in exc.problems]}
        except Unreadable as exc:
            return {"problems": [str(exc)]}
        live = self.parts.rules.current.digest
        if candidate.digest == live:
            return {"same": True}
        # A replay reads every record of the window, seconds' work on millions: one at a
        # time, and shown again while neither file changed and it is under a minute old.
        async with self._replaying:
            cached = self._reload_would
            if cached and cached[0] == (candidate.digest, live) and self.now() - cached[1] < 60:
                return cached[2]
            since = parse_duration(DEFAULT_SINCE)
            report = await replayed(self.parts.store, candidate, since, None, self.now())
            answer = {"report": report, "verdict": verdict(report), "since": DEFAULT_SINCE}
            self._reload_would = ((candidate.digest, live), self.now(), answer)
            return answer

    # -- actions ---------------------------------------------------------------------

    async def redrive_confirm(self, request: Request) -> Response:
        """What a redrive of the dlqIds asked would do: those of them in a final state."""
        dlq_ids = tuple(request.query_params.getlist("dlqId"))
        if not dlq_ids:
            return RedirectResponse("/ui/failures", 303)
        selection = _selection(dlq_ids, dry_run=True)
        answer = await redrive(self.parts.store, selection, self.now())
        return self.render(request, "redrive.html", asked=dlq_ids, answer=answer, done=False)

    async def redrive(self, request: Request) -> Response:
        form = await self.posted(request)
        if form is None:
            return self.refused(request)
        dlq_ids = tuple(form.get("dlqId", []))
        if not dlq_ids:
            return RedirectResponse("/ui/failures", 303)
        parts = self.parts
        answer = await redrive_told(
            parts.store, _selection(dlq_ids, dry_run=False), self.now(), parts.metrics,
            parts.on_redriven, via="console",
        )  # fmt: skip
        return self.render(request, "redrive.html", asked=dlq_ids, answer=answer, done=True)

    async def restore_confirm(self, request: Request) -> Response:
        group = request.query_params.get("group", "")
        name = request.query_params.get("name", "")
        # Newest first: the first of the endpoint's is the one a restore undoes.
        removals = await self.parts.store.removals(group)
        removal = next(
            (found for found in removals
             if name in (found["endpoint"].get("name"), found["endpoint"].get("url"))),
            None,
        )  # fmt: skip
        return self.render(request, "restore.html", group=group, name=name, removal=removal)

    async def restore(self, request: Request) -> Response:
        form = await self.posted(request)
        if form is None:
            return self.refused(request)
        group, name = form.get("group", [""])[0], form.get("name", [""])[0]
        parts = self.parts
        try:
            answer = await restore_told(
                parts.store, parts.client, parts.metrics, group, name, parts.wall_clock,
                via="console",
            )  # fmt: skip
        except (RestoreRefused, RestoreFailed) as exc:
            return self.render(
                request, "restored.html", 409, group=group, name=name, error=str(exc)
            )
        return self.render(request, "restored.html", group=group, name=name, answer=answer)

    async def sweep_dry_run(self, request: Request) -> Response:
        form = await self.posted(request)
        if form is None:
            return self.refused(request)
        name = form.get("sweep", [""])[0]
        spec = next((s for s in self.parts.rules.current.sweeps if s.name == name), None)
        if spec is None:
            return self.render(request, "dry_run.html", 404, name=name, error="no such sweep")
        run = plan(spec, now=self.now(), dry_run=True)
        log.info("sweep dry run", sweep=name, via="console")
        try:
            selected = await would_select(self.parts.client, run)
        except ServiceError as exc:
            error = f"the service did not list the DLQ: {exc}"
            return self.render(request, "dry_run.html", 502, name=name, error=error)
        return self.render(
            request, "dry_run.html", name=name, spec=spec, run=run, selected=selected
        )

    async def reload_confirm(self, request: Request) -> Response:
        ruleset = self.parts.rules.current
        return self.render(request, "reload.html", ruleset=ruleset, path=self.parts.rules.path)

    async def reload(self, request: Request) -> Response:
        if await self.posted(request) is None:
            return self.refused(request)
        # A refusal is kept (last_reload), and the page shows it.
        with contextlib.suppress(FileError, Unreadable):
            await self.parts.rules.reload(via="console")
        return self.render(
            request, "reloaded.html", result=self.parts.rules.last_reload,
            ruleset=self.parts.rules.current,
        )  # fmt: skip


def _later(request: Request) -> bool:
    return bool(request.query_params.get("cursor"))


def _selection(dlq_ids: tuple[str, ...], *, dry_run: bool) -> RedriveFilter:
    return RedriveFilter(states=tuple(sorted(FINAL)), dlqIds=dlq_ids, dryRun=dry_run)


def _callback(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # it was checked on the way in; never a 500 here
        return None
    return data if isinstance(data, dict) else None


def console_app(parts: Parts) -> Starlette:
    """The console, for the admin app to mount at /ui."""
    console = Console(parts)

    async def unavailable(request: Request, exc: Exception) -> Response:
        return console.render(request, "unavailable.html", 503, error=str(exc))

    async def bad_query(request: Request, exc: Exception) -> Response:
        field = exc.field if isinstance(exc, BadQuery) else "?"
        return console.render(request, "bad_query.html", 400, error=f"{field}: {exc}")

    return Starlette(
        routes=[
            Route("/", console.overview),
            Route("/fragments/overview", console.overview_fragment),
            Route("/fragments/failures", console.failures_fragment),
            Route("/failures", console.failures),
            Route("/failures/{dlq_id:path}", console.failure),
            Route("/groups", console.groups),
            Route("/batches", console.batches),
            Route("/removals", console.removals),
            Route("/sweeps", console.sweeps),
            Route("/rules", console.rules),
            Route("/login", console.login_form, methods=["GET"]),
            Route("/login", console.login, methods=["POST"]),
            Route("/logout", console.logout, methods=["POST"]),
            Route("/redrive", console.redrive_confirm, methods=["GET"]),
            Route("/redrive", console.redrive, methods=["POST"]),
            Route("/restore", console.restore_confirm, methods=["GET"]),
            Route("/restore", console.restore, methods=["POST"]),
            Route("/sweeps/dry-run", console.sweep_dry_run, methods=["POST"]),
            Route("/reload", console.reload_confirm, methods=["GET"]),
            Route("/reload", console.reload, methods=["POST"]),
            Mount(
                "/static",
                StaticFiles(packages=[("daemon.admin.console", "static")]),
                name="static",
            ),
        ],
        exception_handlers={StoreUnavailable: unavailable, BadQuery: bad_query},
    )
