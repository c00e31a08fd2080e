"""What both engines' listings share (the console's, `/api/v1/dlq` and `recoveryd ls`):
the fields a record is listed by, taken from its callback at insert; the opaque cursor
of keyset paging; the items, from rows.

A listing pages by keyset, newest first: a page ends at some (received_at, dlqId) and
the next starts strictly below it, so records that arrive meanwhile (newer) never shift
a page, and none is listed twice or skipped.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Any

from daemon.store.interface import BadQuery, Page, RecordQuery
from daemon.store.records import STATES

MAX_LIMIT = 500
# The listed texts (url, URL Group, endpoint) are kept to this many characters: an index
# entry of PostgreSQL's holds at most 2,704 bytes, and a callback whose URL made one
# larger would fail its whole commit. A search (`q`) compares as many.
MAX_LISTED = 500
MAX_MINUTES = 24 * 60
# A record's columns as a listing selects them, in this order.
RECORD_COLUMNS = (
    "dlq_id, state, reason, rule, action, workflow_run_id, url, url_group, endpoint, status, "
    "received_at, decided_at, updated_at"
)
BATCH_COLUMNS = (
    "id, action, state, overrides, dlq_ids, runs, calls, reason, created_at, sent_at, settled_at"
)
# The group key's empty parts, in the SQLite aggregate (whose key cannot hold NULL).
NO_TEXT, NO_STATUS = "", 0
# The indexes the listings walk, alike on both engines (each engine's migration runs
# them): one led by each filter's column and followed by the page's order, partial where
# the column is empty at insert (rule, action, run id, decision: ingest pays nothing for
# them); callbacks_by_state gains dlq_id, for the keyset's order.
INDEXES = """
    DROP INDEX callbacks_by_state;
    CREATE INDEX callbacks_by_state ON callbacks (state, received_at, dlq_id);
    CREATE INDEX callbacks_by_received ON callbacks (received_at, dlq_id);
    CREATE INDEX callbacks_by_rule ON callbacks (rule, received_at, dlq_id)
        WHERE rule IS NOT NULL;
    CREATE INDEX callbacks_by_action ON callbacks (action, received_at, dlq_id)
        WHERE action IS NOT NULL;
    CREATE INDEX callbacks_by_run_id ON callbacks (workflow_run_id, received_at)
        WHERE workflow_run_id IS NOT NULL;
    CREATE INDEX callbacks_by_url ON callbacks (url, received_at)
        WHERE url IS NOT NULL;
    CREATE INDEX callbacks_by_url_group ON callbacks (url_group, received_at)
        WHERE url_group IS NOT NULL;
    CREATE INDEX callbacks_by_decision ON callbacks (decided_at)
        WHERE decided_at IS NOT NULL;
"""
# A record's url, URL Group, endpoint and failed delivery's status (listed_fields).
Listed = tuple[str | None, str | None, str | None, int | None]


def listed_fields(body: bytes) -> Listed:
    """The url, URL Group (`topicName`), endpoint (`endpointName`) and the failed
    delivery's `status` of a callback's body, each None when missing or not of its type
    (the body need not be JSON: an unsigned callback is stored as sent)."""
    try:
        found = json.loads(body)
    except (ValueError, RecursionError):
        return None, None, None, None
    if not isinstance(found, dict):
        return None, None, None, None
    url, group, endpoint = (found.get(key) for key in ("url", "topicName", "endpointName"))
    return listed(url, group, endpoint, found.get("status"))


def listed(url: Any, group: Any, endpoint: Any, status: Any) -> Listed:
    """What a record is listed by, of a callback's fields: each None when not of its
    type, the text cut to MAX_LISTED (an index entry has a size limit)."""
    return (
        url[:MAX_LISTED] if isinstance(url, str) else None,
        group[:MAX_LISTED] if isinstance(group, str) else None,
        endpoint[:MAX_LISTED] if isinstance(endpoint, str) else None,
        status if _http_status(status) else None,
    )


def _http_status(value: Any) -> bool:
    # Three digits, as an HTTP status is (and as the migrations' backfill takes them).
    return isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 999


def checked(query: RecordQuery) -> RecordQuery:
    """`query`, or BadQuery naming the field that is wrong."""
    check_state(query.state)
    check_limit(query.limit)
    return query


def check_state(state: str | None) -> None:
    if state is not None and state not in STATES:
        raise BadQuery("state", f"{state!r} is not a state ({', '.join(STATES)})")


def check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIMIT:
        raise BadQuery("limit", f"limit must be from 1 to {MAX_LIMIT}, not {limit}")


BATCH_STATES = ("pending", "settled")
# What `q` matches exactly, each column with an index of its own led by it.
Q_COLUMNS = ("dlq_id", "workflow_run_id", "url", "url_group")
_Q_PARAMETER = {"dlq_id": "q", "workflow_run_id": "q", "url": "q_listed", "url_group": "q_listed"}
NEWEST_FIRST = "ORDER BY received_at DESC, dlq_id DESC"
Mark = Callable[[str], str]  # a parameter's placeholder by name: ":x" or "%(x)s"


def records_sql(query: RecordQuery, mark: Mark) -> tuple[str, dict[str, Any]]:
    """The statement of `list_records` and its parameters (one row more than the page,
    which says whether there is a next). Each filter has an index led by its column and
    followed by (received_at, dlq_id), so a page is a walk of one index from the
    cursor down, in order, that stops after the page: never a sort of what matched.
    `q` is four such walks, each of the page at most, merged."""
    checked(query)
    params: dict[str, Any] = {"limit": query.limit + 1}
    where: list[str] = []
    for column in ("state", "rule", "action"):
        if (value := getattr(query, column)) is not None:
            where.append(f"{column} = {mark(column)}")
            params[column] = value
    if query.since is not None:
        where.append(f"received_at >= {mark('since')}")
        params["since"] = query.since
    if query.cursor is not None:
        params["at"], params["after"] = decode_cursor(query.cursor, float, str)
        where.append(f"(received_at, dlq_id) < ({mark('at')}, {mark('after')})")
    page = f"{NEWEST_FIRST} LIMIT {mark('limit')}"
    if query.q is None:
        condition = f"WHERE {' AND '.join(where)}" if where else ""
        return f"SELECT {RECORD_COLUMNS} FROM callbacks {condition} {page}", params
    params["q"], params["q_listed"] = query.q, query.q[:MAX_LISTED]
    walks = " UNION ".join(
        f"SELECT * FROM (SELECT {RECORD_COLUMNS} FROM callbacks "
        f"WHERE {' AND '.join([f'{column} = {mark(_Q_PARAMETER[column])}', *where])} "
        f"{page}) AS by_{column}"
        for column in Q_COLUMNS
    )
    return f"SELECT * FROM ({walks}) AS found {page}", params


# A workflow's line of failures (store/sqlite/lineage.py: the run ids recovery creates
# keep the key of the line's first failure): walked on callbacks_by_workflow.
LINEAGE_LIMIT = 50


def lineage_sql(mark: Mark) -> str:
    """The statement of `lineage`: the decided records of `dlq_id`'s line, newest first."""
    return (
        f"SELECT {RECORD_COLUMNS} FROM callbacks WHERE workflow_key = "
        f"(SELECT workflow_key FROM callbacks WHERE dlq_id = {mark('dlq_id')}) "
        f"AND decided_at IS NOT NULL ORDER BY decided_at DESC, dlq_id DESC "
        f"LIMIT {LINEAGE_LIMIT}"
    )


def batches_sql(
    state: str | None, cursor: str | None, limit: int, mark: Mark
) -> tuple[str, dict[str, Any]]:
    """The statement of `list_batches`: newest (highest id) first, keyset on the id."""
    if state is not None and state not in BATCH_STATES:
        raise BadQuery("state", f"{state!r} is not a batch state ({', '.join(BATCH_STATES)})")
    check_limit(limit)
    params: dict[str, Any] = {"limit": limit + 1}
    where = []
    if state is not None:
        where.append(f"state = {mark('state')}")
        params["state"] = state
    if cursor is not None:
        (params["before"],) = decode_cursor(cursor, int)
        where.append(f"id < {mark('before')}")
    condition = f"WHERE {' AND '.join(where)}" if where else ""
    return (
        f"SELECT {BATCH_COLUMNS} FROM batches {condition} ORDER BY id DESC LIMIT {mark('limit')}",
        params,
    )


def check_minutes(minutes: int) -> None:
    if not 1 <= minutes <= MAX_MINUTES:
        raise BadQuery("minutes", f"minutes must be from 1 to {MAX_MINUTES}, not {minutes}")


def check_group_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIMIT:
        raise BadQuery("limit", f"limit must be from 1 to {MAX_LIMIT}, not {limit}")


def encode_cursor(*key: Any) -> str:
    """The cursor of the page after the row whose key is `key`."""
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, *types: type) -> tuple[Any, ...]:
    """The key a cursor holds, each part of its type in `types`; BadQuery otherwise."""
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        key = None
    if not (
        isinstance(key, list)
        and len(key) == len(types)
        and all(_of(part, kind) for part, kind in zip(key, types, strict=True))
    ):
        raise BadQuery("cursor", "the cursor is not one a listing gave: start from the first page")
    return tuple(
        float(part) if kind is float else part for part, kind in zip(key, types, strict=True)
    )


def _of(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def record_page(rows: Sequence[Sequence[Any]], limit: int) -> Page:
    """The page of `rows` (up to `limit` + 1 selected: one more says there is a next)."""
    items = [record_item(row) for row in rows[:limit]]
    last = rows[limit - 1] if len(rows) > limit else None
    return Page(items, None if last is None else encode_cursor(last[10], last[0]))


def record_item(row: Sequence[Any]) -> dict[str, Any]:
    (dlq_id, state, reason, rule, action, run, url, group, endpoint, status, received,
     decided, updated) = row  # fmt: skip
    return {
        "dlqId": dlq_id,
        "state": state,
        "reason": reason,
        "rule": rule,
        "action": action,
        "workflowRunId": run,
        "url": url,
        "urlGroup": group,
        "endpoint": endpoint,
        "status": status,
        "receivedAt": received,
        "decidedAt": decided,
        "updatedAt": updated,
    }


def batch_page(rows: Sequence[Sequence[Any]], limit: int, load: Callable[[Any], Any]) -> Page:
    items = [batch_item(row, load) for row in rows[:limit]]
    last = rows[limit - 1] if len(rows) > limit else None
    return Page(items, None if last is None else encode_cursor(last[0]))


def batch_item(row: Sequence[Any], load: Callable[[Any], Any]) -> dict[str, Any]:
    number, action, state, overrides, dlq_ids, runs, calls, reason, created, sent, settled = row
    return {
        "id": number,
        "action": action,
        "state": state,
        "overrides": load(overrides),
        "dlqIds": load(dlq_ids),
        "runs": load(runs),
        "calls": load(calls),
        "reason": reason,
        "createdAt": created,
        "sentAt": sent,
        "settledAt": settled,
    }


def groups(rows: Sequence[Sequence[Any]], limit: int) -> list[dict[str, Any]]:
    """The failure groups from the aggregate's rows, one a group and state with a count
    not 0: (url_group, endpoint, url, status, rule, state, n, first_seen, last_seen),
    empty parts as None or as NO_TEXT / NO_STATUS. Newest activity first."""
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for group, endpoint, url, status, rule, state, n, first, last in rows:
        key = (group, endpoint, url, status, rule)
        entry = found.setdefault(key, {
            "urlGroup": _text(group), "endpoint": _text(endpoint), "url": _text(url),
            "status": None if status in (None, NO_STATUS) else int(status),
            "rule": _text(rule), "count": 0, "states": {}, "firstSeen": first, "lastSeen": last,
        })  # fmt: skip
        entry["count"] += int(n)
        entry["states"][state] = int(n)
        entry["firstSeen"] = _least(entry["firstSeen"], first)
        entry["lastSeen"] = _most(entry["lastSeen"], last)
    listed = sorted(found.values(), key=lambda g: g["lastSeen"] or 0.0, reverse=True)
    return listed[:limit]


def outcomes(rows: Sequence[Sequence[Any]]) -> dict[str, dict[str, int]]:
    """rule -> {state: count} from (rule, state, n) rows, the rule-less left out."""
    found: dict[str, dict[str, int]] = {}
    for rule, state, n in rows:
        if rule not in (None, NO_TEXT) and int(n):
            found.setdefault(rule, {})[state] = int(n)
    return found


def per_minute(rows: Sequence[Sequence[Any]], minutes: int) -> list[int]:
    """`minutes` counts, oldest first, from (minute index, count) rows."""
    counts = [0] * minutes
    for index, n in rows:
        if 0 <= int(index) < minutes:
            counts[int(index)] += int(n)
    return counts


def _text(value: str | None) -> str | None:
    return None if value in (None, NO_TEXT) else value


def _least(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _most(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)
