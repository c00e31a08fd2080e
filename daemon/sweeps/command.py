"""`recoveryd sweep NAME --dry-run`: what a sweep would select now, without acting.

It lists the failed workflow runs the sweep's filter selects (relative dates resolved
now) with QStash's listing, which takes the bulk calls' filters and changes nothing,
at most `maxPerRun` of them, as one run would. It calls the service itself, with the
daemon's settings and credentials, the saved ones first as `serve` reads them (the
credentials file, or the store's with RECOVERYD_CREDENTIALS_KEY: where rotations and
`recoveryd set-token` leave them); the few reads it makes count against the account's
rate limit like any other call.

Running a sweep by hand is not offered: a sweep runs on its schedule in `recoveryd
serve`, one run at a time, recorded; a second runner beside it could overlap it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from daemon.foundation.words import counted, with_guess
from daemon.rules import FileError, Unreadable, load_rules
from daemon.settings import Settings
from daemon.store import StoreUnavailable
from daemon.sweeps.plan import Plan, plan
from daemon.sweeps.run import listed_pages
from daemon.upstream import (
    CredentialsHolder,
    FailedWorkflowRun,
    RateLimiter,
    ServiceClient,
    ServiceError,
    service_http,
)

NOT_BY_HAND = (
    "a sweep runs on its schedule in `recoveryd serve` (one run at a time, each recorded: "
    "GET /api/v1/sweeps); running one by hand is not supported. "
    "`recoveryd sweep {name} --dry-run` shows what it would select now"
)


class SweepCommandError(Exception):
    """The command cannot answer; `str()` is the one line to print."""


async def dry_run(settings: Settings, rules: Path, name: str, echo: Callable[[str], None]) -> None:
    """Print each entry sweep `name` would recover now, then how many; SweepCommandError
    when the rules, the sweep or the service cannot tell."""
    from daemon.account.assembly import credentials_in_use

    try:
        ruleset = load_rules(rules)
    except (FileError, Unreadable) as exc:
        raise SweepCommandError(str(exc)) from None
    spec = next((sweep for sweep in ruleset.sweeps if sweep.name == name), None)
    if spec is None:
        names = [sweep.name for sweep in ruleset.sweeps]
        listed = ", ".join(names) or "none"
        raise SweepCommandError(
            with_guess(f"{rules}: no sweep named {name!r} (sweeps: {listed})", name, names)
        )
    run = plan(spec, now=time.time(), dry_run=True)
    try:
        credentials = await credentials_in_use(settings)
    except StoreUnavailable as exc:
        raise SweepCommandError(f"RECOVERYD_STORE: {exc}") from None
    async with service_http(30.0) as http:
        client = ServiceClient(
            http,
            base_url=settings.service_url,
            credentials=CredentialsHolder(credentials),
            header_prefix=settings.HEADER_PREFIX,
            limiter=RateLimiter(settings.MAX_RPS, pinned=settings.MAX_RPS is not None),
        )
        echo(f"sweep {name}: {spec.action} what this filter selects now: {run.filter_json()}")
        try:
            selected = await would_select(client, run)
        except ServiceError as exc:
            raise SweepCommandError(f"the service did not list the DLQ: {exc}") from None
        for message in selected.messages:
            echo(_line(message))
    count, more = len(selected.messages), selected.more
    limit = f"; more match beyond maxPerRun ({spec.max_per_run})" if more else ""
    done = {"resume": "resumed", "restart": "restarted"}[spec.action]
    echo(f"{counted(count, 'workflow run')} would be {done} by sweep {name}{limit}")


@dataclass(frozen=True)
class Selection:
    """What a sweep's run would recover now: the entries, and whether more match beyond
    its maxPerRun."""

    messages: list[FailedWorkflowRun]
    more: bool


async def would_select(client: ServiceClient, run: Plan) -> Selection:
    """The entries the dry run `run` selects, listed page by page as a run would (the
    command's and the console's dry run); ServiceError when the service cannot tell."""
    messages: list[FailedWorkflowRun] = []
    more = False
    async for page in listed_pages(client, run):
        messages.extend(page.messages)
        more = page.next_cursor != ""
    return Selection(messages, more)


def _line(message: FailedWorkflowRun) -> str:
    created = "-"
    if message.created_at is not None:
        created = datetime.fromtimestamp(message.created_at / 1000, UTC).isoformat(
            timespec="milliseconds"
        )
    fields = (message.dlq_id, message.workflow_run_id or "-", message.url or "-", created)
    return "  ".join(fields)
