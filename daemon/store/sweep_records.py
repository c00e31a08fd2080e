"""What the store keeps about each run of a sweep, and each page of it.

A run is under way while its `result` is None; at most one run of a sweep is. Each page
is recorded as `sending` before its call goes out and settled after, so a crash leaves
either a page that surely never went out or one whose answer was lost (`unknown`):

    run:  under way -> success | failure | unknown | interrupted | dry-run
    page: sending   -> done (the runs the service made) | listed (a dry run's selection)
                     | refused (surely not carried out) | unknown (the answer was lost)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

SweepResult = Literal["success", "failure", "unknown", "interrupted", "dry-run"]
SWEEP_RESULTS: tuple[SweepResult, ...] = (
    "success", "failure", "unknown", "interrupted", "dry-run"
)  # fmt: skip
PageOutcome = Literal["sending", "done", "listed", "refused", "unknown"]


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
