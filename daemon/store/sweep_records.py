"""What the store keeps about each run of a sweep, and each page of it.

A run is under way while its `result` is None; at most one run of a sweep is. Each page
is recorded as `sending` before its call goes out and settled after, so a crash leaves
either a page that surely never went out or one whose answer was lost (`unknown`):

    run:  under way -> success | failure | unknown | interrupted | dry-run
    page: sending   -> done (the runs the service made) | listed (a dry run's selection)
                     | refused (surely not carried out) | unknown (the answer was lost)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from daemon.foundation.words import counted
from daemon.store.records import Load

SweepResult = Literal["success", "failure", "unknown", "interrupted", "dry-run"]
SWEEP_RESULTS: tuple[SweepResult, ...] = (
    "success", "failure", "unknown", "interrupted", "dry-run"
)  # fmt: skip
PageOutcome = Literal["sending", "done", "listed", "refused", "unknown"]


@dataclass(frozen=True)
class RunStart:
    """A sweep's run as `Store.begin_sweep_run` records it: the filter with its dates
    resolved, what the run does, and its cap."""

    action: str
    dry_run: bool
    filter: dict[str, Any]
    overrides: dict[str, Any] | None
    max_per_run: int
    now: float


@dataclass(frozen=True)
class PageEnd:
    """What a page's call came to, as `Store.settle_sweep_page` takes it."""

    outcome: PageOutcome
    now: float
    items: Sequence[dict[str, Any]] = ()
    next_cursor: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class SweepPage:
    """One call of a run: a bulk call by filter, or for a dry run a page of the listing."""

    number: int  # 1, 2, ... within the run
    count: int  # the `count` asked for
    cursor: str | None  # the cursor sent; None for the first page
    sent_at: float
    answered_at: float | None
    outcome: PageOutcome
    next_cursor: str | None  # what the service answered; "" when nothing was left
    # The runs the service made ({workflowRunId, workflowCreatedAt}), or for a dry run
    # the entries listed ({dlqId, workflowRunId, url, createdAt}).
    items: tuple[dict[str, Any], ...]
    error: str | None

    def to_json(self) -> dict[str, Any]:
        key = "selected" if self.outcome == "listed" else "workflowRuns"
        return {
            "page": self.number,
            "count": self.count,
            "cursor": self.cursor,
            "sentAt": self.sent_at,
            "answeredAt": self.answered_at,
            "outcome": self.outcome,
            "nextCursor": self.next_cursor,
            key: list(self.items),
            "error": self.error,
        }


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep, with the filter it ran with (relative dates resolved)."""

    id: int
    sweep: str
    action: str
    dry_run: bool
    filter: dict[str, Any]
    overrides: dict[str, Any] | None
    max_per_run: int
    started_at: float
    finished_at: float | None
    result: SweepResult | None
    error: str | None
    pages: int  # calls made, whatever their outcome
    workflows: int  # runs recovered; for a dry run, entries selected
    cursor: str | None  # the cursor the last answered page reached
    page_records: tuple[SweepPage, ...] = ()

    @property
    def under_way(self) -> bool:
        return self.result is None

    def to_json(self, *, pages: bool = True) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "id": self.id,
            "sweep": self.sweep,
            "action": self.action,
            "dryRun": self.dry_run,
            "filter": self.filter,
            "overrides": self.overrides,
            "maxPerRun": self.max_per_run,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "result": self.result,
            "error": self.error,
            "pageCount": self.pages,
            "recovered": 0 if self.dry_run else self.workflows,
            "selected": self.workflows,
            "cursor": self.cursor,
        }
        if pages:
            answer["pages"] = [page.to_json() for page in self.page_records]
        return answer


# The values both stores (sqlite/sweeps.py, postgres/sweeps.py) answer, built from their
# rows: each function takes the columns named beside it, in that order. `load` decodes a
# JSON column (filter, overrides, items) as the store's driver returns it: SQLite's are
# text written with sorted keys (`json.loads`); PostgreSQL's jsonb come back decoded, and
# are put in that sorted-key form (postgres/sweeps.py `_canonical`).

# Only the latest KEEP_RUNS runs of each sweep are kept: older ones go when a run finishes.
KEEP_RUNS = 100

RUN_COLUMNS = (
    "id, sweep, action, dry_run, filter, overrides, max_per_run, started_at, finished_at, "
    "result, error, pages, workflows, cursor"
)
PAGE_COLUMNS = (
    "page, count, cursor, sent_at, answered_at, outcome, next_cursor, items, error"
)  # fmt: skip

# The error a page still `sending` is settled with when its run is closed as interrupted.
LOST_ANSWER = "no answer recorded: recoveryd stopped while the call was out"


def run_from(row: Sequence[Any], load: Load) -> SweepRun:
    """A run, without its pages, from RUN_COLUMNS."""
    (run_id, sweep, action, dry_run, filter, overrides, max_per_run, started_at, finished_at,
     result, error, pages, workflows, cursor) = row  # fmt: skip
    return SweepRun(
        id=run_id,
        sweep=sweep,
        action=action,
        dry_run=bool(dry_run),
        filter=load(filter),
        overrides=None if overrides is None else load(overrides),
        max_per_run=max_per_run,
        started_at=started_at,
        finished_at=finished_at,
        result=result,
        error=error,
        pages=pages,
        workflows=workflows,
        cursor=cursor,
    )


def page_from(row: Sequence[Any], load: Load) -> SweepPage:
    """A page of a run from PAGE_COLUMNS."""
    page, count, cursor, sent_at, answered_at, outcome, next_cursor, items, error = row
    return SweepPage(
        page, count, cursor, sent_at, answered_at, outcome, next_cursor, tuple(load(items)), error
    )


def interrupted_error(run: SweepRun, sending: Sequence[Any] | None) -> str:
    """Why `run` ended `interrupted`, given its page still `sending` (`page, count`), or
    None when it was cut short between two pages."""
    if sending is None:
        return "cut short between two pages (recoveryd stopped)"
    page, count = sending
    lost = "the listing's answer was lost" if run.dry_run else (
        f"the service may have recovered up to {counted(count, 'run')} that are not recorded "
        "here (they left the DLQ, so none is recovered twice)"
    )  # fmt: skip
    return f"cut short (recoveryd stopped) while page {page} was out: {lost}"
