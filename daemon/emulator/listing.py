"""Listing the DLQ: QStash's `GET /v2/workflows/dlq` (failed workflow runs) and
`GET /v2/dlq` (every message, or a workflow run's with `source=workflow`).

Not among the spec's operations; recoveryd uses the first to show what a sweep would
select (`recoveryd sweep NAME --dry-run`) without acting, and the SDKs call both. As
QStash documents them:

* the filters are those of the bulk resume and restart (spec 4.7, `bulk.py`), and they
  combine the same way; `GET /v2/dlq` also takes the message filters (`messageId`, `url`,
  `topicName`, `scheduleId`, `queueName`, `responseStatus`), `source`, and `dlqIds` (the
  JavaScript SDK's `listMessages({dlqIds})`). `dlqIds` is not a filter of the workflow
  listing (an unknown parameter, 400), so it selects exactly what a bulk call with the
  same filters would process;
* `count` is at most 100 (more is a 400) and defaults to 100;
* the answer is `{"messages": [...], "cursor": "..."}` and the cursor is left out once
  nothing is left ("if no cursor is returned, you have reached the end");
* each message is the DLQ message (`state.DlqEntry.to_wire`) plus, when known,
  `failureFunctionState`.

Not documented, chosen here: the cursor is the bulk calls' (it walks up to the newest
entry that existed when the first page was asked for), and a listing changes nothing.
QStash's `order=latestFirst` is not emulated (an unknown parameter, 400).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from daemon.emulator.bulk import BULK_PARAMS, BulkQuery, parse_bulk_query, select_batch
from daemon.emulator.errors import BadRequest
from daemon.emulator.state import DlqEntry

MAX_LISTED = 100


WORKFLOW_LIST_PARAMS = BULK_PARAMS - {"dlqIds"}


def parse_list_query(
    items: Iterable[tuple[str, str]], accepted: frozenset[str] = WORKFLOW_LIST_PARAMS
) -> BulkQuery:
    """The query parameters of a listing; 400 for unknown, repeated or malformed ones."""
    query = parse_bulk_query(items, accepted)
    if query.count is not None and query.count > MAX_LISTED:
        raise BadRequest(f"count must be at most {MAX_LISTED}")
    return query


def list_page(entries: Iterable[DlqEntry], query: BulkQuery, *, newest_seq: int) -> dict[str, Any]:
    """One page of the listing, as the service answers it."""
    page = select_batch(entries, query, newest_seq=newest_seq, page_size=MAX_LISTED)
    answer: dict[str, Any] = {"messages": [entry.to_listed() for entry in page.entries]}
    if page.cursor:
        answer["cursor"] = page.cursor
    return answer
