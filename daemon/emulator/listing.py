"""Listing the failed workflow runs in the DLQ: QStash's `GET /v2/workflows/dlq`.

Not one of the spec's operations; recoveryd uses it to show what a sweep would select
(`recoveryd sweep NAME --dry-run`) without acting. As QStash documents it:

* the filters are those of the bulk resume and restart (spec 4.7, `bulk.py`), and they
  combine the same way: `label` values OR-ed, every other filter AND-ed, `fromDate` and
  `toDate` inclusive, only entries of a workflow run; so a listing selects exactly what a
  bulk call with the same filters would process. `dlqIds` is not a filter of the listing
  (an unknown parameter, 400);
* `count` is at most 100 (more is a 400) and defaults to 100;
* the answer is `{"messages": [...], "cursor": "..."}` and the cursor is left out once
  nothing is left ("if no cursor is returned, you have reached the end");
* each message is the DLQ message plus `workflowRunId`, `workflowUrl`,
  `workflowCreatedAt` and, when known, `failureFunctionState`.

Not documented, chosen here: the cursor is the bulk calls' (it walks up to the newest
entry that existed when the first page was asked for), and a listing changes nothing.
QStash's `order=latestFirst` is not emulated (an unknown parameter, 400).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from daemon.emulator.bulk import BulkQuery, parse_bulk_query, select_batch
from daemon.emulator.errors import BadRequest
from daemon.emulator.state import DlqEntry

MAX_LISTED = 100


def parse_list_query(items: Iterable[tuple[str, str]]) -> BulkQuery:
    """The query parameters of a listing; 400 for unknown, repeated or malformed ones."""
    items = list(items)
    if any(name == "dlqIds" for name, _ in items):
        raise BadRequest("unknown query parameter dlqIds")
    query = parse_bulk_query(items)
    if query.count is not None and query.count > MAX_LISTED:
        raise BadRequest(f"count must be at most {MAX_LISTED}")
    return query


def list_page(entries: Iterable[DlqEntry], query: BulkQuery, *, newest_seq: int) -> dict[str, Any]:
    """One page of the listing, as the service answers it."""
    page = select_batch(entries, query, newest_seq=newest_seq, page_size=MAX_LISTED)
    answer: dict[str, Any] = {"messages": [listed(entry) for entry in page.entries]}
    if page.cursor:
        answer["cursor"] = page.cursor
    return answer


def listed(entry: DlqEntry) -> dict[str, Any]:
    """A failed workflow run as the listing shows it."""
    assert entry.workflow is not None  # select_batch only selects workflow entries
    message = entry.to_wire()
    message.update(
        workflowRunId=entry.workflow.run_id,
        workflowUrl=entry.workflow.url,
        workflowCreatedAt=entry.workflow.created_at,
    )
    if entry.workflow.failure_function_state is not None:
        message["failureFunctionState"] = entry.workflow.failure_function_state
    return message
