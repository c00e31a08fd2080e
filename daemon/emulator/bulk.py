"""Which DLQ entries a bulk resume/restart processes (spec 4.7): pure query, filter, batch.

Rules (the spec leaves how filters combine "not shown"; these are QStash's):

* only entries of a workflow run are candidates;
* `dlqIds` selects those ids and every other filter is ignored (ids not in the DLQ, or not
  of a workflow run, are skipped silently);
* `label` values are OR-ed; all other filters are AND-ed; `fromDate`/`toDate` are inclusive
  and compare with the entry's `createdAt` (ms);
* entries go in DLQ order, at most 50 a call, at most `count` when given.

Arrays come repeated (`dlqIds=a&dlqIds=b`) or comma-separated (`dlqIds=a,b`). An empty value
counts as not given. An unknown parameter is a 400: silently ignoring a misspelt filter
would turn a narrow bulk call into one over the whole DLQ.

The cursor encodes the sequence of the last entry processed and the newest entry that
existed when the first page was asked for. Later pages continue after the first, so they
are not upset by entries removed in between, and stop at the second, so runs that fail
again and re-enter the DLQ during a walk are not picked up by that same walk.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from daemon.emulator.errors import BadRequest
from daemon.emulator.state import FAILURE_FUNCTION_STATES, DlqEntry, WorkflowRef

MAX_RUNS_PER_CALL = 50

_LIST_PARAMS = ("dlqIds", "label")
_INT_PARAMS = ("count", "fromDate", "toDate", "workflowCreatedAt")
_TEXT_PARAMS = (
    "cursor",
    "workflowUrl",
    "workflowRunId",
    "failureFunctionState",
    "callerIp",
    "flowControlKey",
)
_INTEGER = re.compile(r"^-?[0-9]+$")
_CURSOR = re.compile(r"^v1:([0-9]+):([0-9]+)$")


@dataclass(frozen=True)
class Cursor:
    after_seq: int  # the last entry processed
    upto_seq: int  # the newest entry when the walk began

    def encode(self) -> str:
        text = f"v1:{self.after_seq}:{self.upto_seq}".encode("ascii")
        return base64.urlsafe_b64encode(text).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, value: str) -> Cursor:
        try:
            text = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode("ascii")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            text = ""
        match = _CURSOR.match(text)
        if match is None:
            raise BadRequest("invalid cursor")
        return cls(int(match[1]), int(match[2]))


@dataclass(frozen=True)
class BulkQuery:
    dlq_ids: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    cursor: Cursor | None = None
    count: int | None = None
    from_date: int | None = None
    to_date: int | None = None
    workflow_url: str | None = None
    workflow_run_id: str | None = None
    workflow_created_at: int | None = None
    failure_function_state: str | None = None
    caller_ip: str | None = None
    flow_control_key: str | None = None


def parse_bulk_query(items: Iterable[tuple[str, str]]) -> BulkQuery:
    """The query parameters of a bulk call; 400 for unknown, repeated or malformed ones."""
    lists: dict[str, list[str]] = {name: [] for name in _LIST_PARAMS}
    single: dict[str, str] = {}
    for name, value in items:
        if name in lists:
            lists[name].extend(part.strip() for part in value.split(",") if part.strip())
        elif name in _INT_PARAMS or name in _TEXT_PARAMS:
            if name in single:
                raise BadRequest(f"query parameter {name} must be given once")
            if value.strip():
                single[name] = value.strip()
        else:
            raise BadRequest(f"unknown query parameter {name}")
    ints = {name: _integer(name, single[name]) for name in _INT_PARAMS if name in single}
    if ints.get("count", 1) < 1:
        raise BadRequest("count must be a positive integer")
    state = single.get("failureFunctionState")
    if state is not None and state not in FAILURE_FUNCTION_STATES:
        allowed = ", ".join(sorted(FAILURE_FUNCTION_STATES))
        raise BadRequest(f"failureFunctionState must be one of {allowed}")
    return BulkQuery(
        dlq_ids=tuple(dict.fromkeys(lists["dlqIds"])),
        labels=tuple(lists["label"]),
        cursor=Cursor.decode(single["cursor"]) if "cursor" in single else None,
        count=ints.get("count"),
        from_date=ints.get("fromDate"),
        to_date=ints.get("toDate"),
        workflow_url=single.get("workflowUrl"),
        workflow_run_id=single.get("workflowRunId"),
        workflow_created_at=ints.get("workflowCreatedAt"),
        failure_function_state=state,
        caller_ip=single.get("callerIp"),
        flow_control_key=single.get("flowControlKey"),
    )


def _integer(name: str, value: str) -> int:
    if not _INTEGER.match(value):
        raise BadRequest(f"{name} must be an integer")
    return int(value)


def matches(entry: DlqEntry, query: BulkQuery) -> bool:
    """Whether a bulk call with `query` selects `entry`, cursor and batch size aside."""
    if entry.workflow is None:
        return False
    if query.dlq_ids:
        return entry.dlq_id in query.dlq_ids
    if query.labels and not set(query.labels) & set(entry.labels):
        return False
    return all(_filters_hold(entry, entry.workflow, query))


def _filters_hold(entry: DlqEntry, workflow: WorkflowRef, query: BulkQuery) -> Iterator[bool]:
    yield query.from_date is None or entry.created_at >= query.from_date
    yield query.to_date is None or entry.created_at <= query.to_date
    yield query.workflow_url in (None, workflow.url)
    yield query.workflow_run_id in (None, workflow.run_id)
    yield query.workflow_created_at in (None, workflow.created_at)
    yield query.failure_function_state in (None, workflow.failure_function_state)
    yield query.caller_ip in (None, entry.caller_ip)
    yield query.flow_control_key in (None, entry.flow_control_key)


@dataclass(frozen=True)
class Batch:
    entries: tuple[DlqEntry, ...]
    cursor: str  # "" when nothing that matches is left for this walk


def select_batch(
    entries: Iterable[DlqEntry],
    query: BulkQuery,
    *,
    newest_seq: int,
    page_size: int = MAX_RUNS_PER_CALL,
) -> Batch:
    """The entries one bulk call processes, in DLQ order, and the cursor for the next call.

    `newest_seq` is the sequence of the newest DLQ entry now; it bounds a walk that starts
    with this call. `page_size` is the most a call takes, and what it takes without `count`
    (the listing of failed workflow runs pages by 100, `listing.py`).
    """
    walk = query.cursor or Cursor(after_seq=-1, upto_seq=newest_seq)
    limit = min(query.count or page_size, page_size)
    candidates = [
        entry
        for entry in entries
        if walk.after_seq < entry.seq <= walk.upto_seq and matches(entry, query)
    ]
    chosen = tuple(candidates[:limit])
    if len(candidates) <= limit:
        return Batch(chosen, "")
    return Batch(chosen, Cursor(chosen[-1].seq, walk.upto_seq).encode())
