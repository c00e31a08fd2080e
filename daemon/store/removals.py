"""What the store keeps about endpoints that keep failing and their removal from URL Groups.

A dlqId decided by a remove-endpoint rule is one failure of its endpoint. When the
failures of one (URL Group, endpoint) reach the rule's threshold within its window, a
removal is recorded, with the failures as its evidence, and then carried out:

    pending  -> removing -> removed                      (the DELETE went through)
             -> gone | kept_last | capped | read_failed  (nothing removed, and why)
    removing -> failed                                   (the service refused the DELETE)

`pending`: the group is still to be read. `removing`: the removal is intended, counted
against the hourly cap, and its DELETE is about to go out or may have gone out; it is
committed before the DELETE, so a crash leaves a record that the next start resolves by
reading the group again. A removed endpoint can be restored from its record.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from daemon.foundation.urls import without_credentials
from daemon.foundation.words import counted, plural
from daemon.store.records import State

RemovalState = Literal[
    "pending", "removing", "removed", "gone", "kept_last", "capped", "read_failed", "failed"
]
# How a removal ended: the label values of recoveryd_endpoint_removals_total{result}.
RemovalResult = Literal["removed", "gone", "kept_last", "capped", "read_failed", "failed"]
OPEN: tuple[RemovalState, ...] = ("pending", "removing")
# Removals that count against RECOVERYD_MAX_REMOVALS_PER_HOUR: made, or about to be.
COUNTED: tuple[RemovalState, ...] = ("removing", "removed")
HOUR = 3600.0
# What a removal's outcome makes of the dlqId whose failure reached the threshold: done
# when the endpoint is out of the group, skipped when it was held back, failed when the
# service refused the removal.
DLQ_STATE: dict[RemovalResult, State] = {
    "removed": "done",
    "gone": "done",
    "kept_last": "skipped",
    "capped": "skipped",
    "read_failed": "skipped",
    "failed": "failed",
}
# SQL both stores' endpoint_removals queries share (sqlite/endpoints.py and
# postgres/endpoints.py): the states as literals, so the partial index on the open ones
# is used, and the columns `removal` reads and those `listed` reads, in their order.
OPEN_SQL = ", ".join(f"'{state}'" for state in OPEN)
COUNTED_SQL = ", ".join(f"'{state}'" for state in COUNTED)
COLUMNS = (
    "id, url_group, endpoint, endpoint_name, endpoint_url, rule, keep_last, state, reason, "
    "tries, dlq_id"
)
LISTED_COLUMNS = (
    "id, url_group, endpoint_name, endpoint_url, rule, threshold_failures, "
    "threshold_within, keep_last, dlq_id, state, reason, evidence, tries, calls, "
    "created_at, intended_at, finished_at, restore_state, restore_reason, restored_at, "
    "updated_at"
)


@dataclass(frozen=True)
class Evidence:
    """A failure that led to a removal."""

    dlq_id: str
    response_status: int | None
    at: float  # when its failure callback arrived (Unix time)

    def to_json(self) -> dict[str, object]:
        return {"dlqId": self.dlq_id, "responseStatus": self.response_status, "at": self.at}


@dataclass(frozen=True)
class Removal:
    """A threshold reached for one endpoint, and what became of it. `name` and `url` are
    the endpoint's as the message told them, then as read from the group once intended."""

    id: int
    url_group: str
    endpoint: str
    name: str | None
    url: str | None
    rule: str
    keep_last: bool
    state: RemovalState
    reason: str | None
    tries: int  # reads or DELETEs tried and deferred
    dlq_id: str  # the failure that reached the threshold

    @property
    def shown(self) -> str:
        """The endpoint as a person names it: its name, else its url (without the user
        info a url may carry, since this goes to logs and reasons)."""
        return shown(self.name, self.url or self.endpoint)


def shown(name: str | None, url: str | None) -> str:
    """An endpoint as reasons and logs show it: its name, else its url (without the user
    info a url may carry)."""
    return name or without_credentials(url or "?")


class RestoreRefused(Exception):
    """There is nothing to restore: no removal of that endpoint is recorded (`unknown`),
    or the last one has been restored already (`restored`). `str()` says which."""

    def __init__(self, message: str, kind: Literal["unknown", "restored"]) -> None:
        super().__init__(message)
        self.kind = kind


def removal(row: Sequence[Any]) -> Removal:
    """The removal a row of COLUMNS tells (`keep_last` is an integer column in both
    stores)."""
    (removal_id, group, endpoint, name, url, rule, keep_last, state, reason, tries,
     dlq_id) = row  # fmt: skip
    return Removal(
        removal_id, group, endpoint, name, url, rule, bool(keep_last), state, reason, tries,
        dlq_id,
    )  # fmt: skip


def window(rows: Sequence[Sequence[Any]], within: float) -> list[Evidence]:
    """Of an endpoint's failures not used up yet, as rows of (dlq_id, response_status,
    failed_at) in the order of their time, those within `within` of the latest."""
    if not rows:
        return []
    latest = rows[-1][2]
    return [Evidence(*row) for row in rows if row[2] >= latest - within]


def later_evidence(rows: Sequence[Sequence[Any]]) -> list[dict[str, object]]:
    """The failures (dlq_id, response_status, failed_at) counted while a removal was
    under way, in the order of their time, as its evidence lists them."""
    return [Evidence(*row).to_json() for row in sorted(rows, key=lambda row: (row[2], row[0]))]


def capped_reason(
    made: int, max_per_hour: int, group: str, name: str | None, url: str | None
) -> str:
    """Why a removal ends `capped`: `made` removals in the last hour reached the cap."""
    if max_per_hour == 0:
        why = "removals are off (RECOVERYD_MAX_REMOVALS_PER_HOUR is 0)"
    else:
        why = (
            f"{counted(made, 'endpoint')} {plural(made, 'was', 'were')} removed in the last "
            "hour, the cap "
            f"(RECOVERYD_MAX_REMOVALS_PER_HOUR)"
        )
    where = f"endpoint {shown(name, url)} of URL Group {group}"
    return f"held back: {why}; {where} stays"


def restorable(row: Sequence[Any] | None, group: str, name: str) -> Removal:
    """The removal to restore, from the row of COLUMNS, restore_state and restored_at
    read of the last removal of endpoint `name` from `group` (None: there is none);
    RestoreRefused when there is none or it was restored already."""
    if row is None:
        raise RestoreRefused(
            f"no removal of endpoint {name!r} from URL Group {group!r} is recorded "
            "(`recoveryd removals` lists them; an endpoint without a name goes by its url)",
            "unknown",
        )
    found = removal(row[:11])
    if row[11] == "restored":
        raise RestoreRefused(
            f"endpoint {name!r} of URL Group {group!r} was restored already "
            f"(removal {found.id}, restored at {_iso(row[12])})",
            "restored",
        )
    return found


def listed(row: Sequence[Any], load: Callable[[Any], Any]) -> dict[str, Any]:
    """A removal as `/api/v1/removals` lists it, from a row of LISTED_COLUMNS. `load`
    makes Python values of its JSON columns (evidence, calls): json.loads of SQLite's
    text; PostgreSQL's jsonb comes back decoded, to pass through."""
    (removal_id, url_group, name, url, rule, failures, within, keep_last, dlq_id, state,
     reason, evidence, tries, calls, created, intended, finished, restore_state,
     restore_reason, restored_at, updated) = row  # fmt: skip
    return {
        "id": removal_id,
        "urlGroup": url_group,
        "endpoint": {"name": name, "url": url},
        "rule": rule,
        "threshold": {"failures": failures, "withinSeconds": within},
        "keepLastEndpoint": bool(keep_last),
        "state": state,
        "reason": reason,
        "dlqId": dlq_id,
        "evidence": load(evidence),
        "tries": tries,
        "createdAt": created,
        "intendedAt": intended,
        "finishedAt": finished,
        "restore": {
            "state": restore_state,
            "reason": restore_reason,
            "restoredAt": restored_at,
        },
        "calls": load(calls),
        "updatedAt": updated,
    }


def _iso(at: float | None) -> str:
    """A time as a refusal tells it (UTC, to the second); `?` when not known."""
    if at is None:
        return "?"
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
