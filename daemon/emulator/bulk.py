"""Which DLQ entries a call selects: the filters of the bulk resume/restart (spec 4.7),
QStash's DLQ listings and its bulk delete. Pure query, filter, batch.

Rules (the spec leaves how filters combine "not shown"; these are QStash's):

* the bulk resume/restart and the listing of failed workflow runs see only entries of a
  workflow run; `GET`/`DELETE /v2/dlq` see every entry, or only a workflow run's with
  `source=workflow` (the only `source` the workflow SDK sends; no other is emulated);
* `dlqIds` selects those ids and every other filter is ignored (ids not in the DLQ, or not
  of a workflow run where only those count, are skipped silently);
* a filter given several times matches any of its values (OR), as the SDKs document for
  `label`, `workflowUrl`, `callerIp`, `flowControlKey`, `url`, `topicName`, `scheduleId`,
  `queueName` and `responseStatus`; different filters are AND-ed; `fromDate`/`toDate`
  are inclusive and compare with the entry's `createdAt` (ms);
* `workflowUrl` matches the whole URL, as the DLQ's documentation says ("filter by exact
  workflow URL"), and `workflowUrlExactMatch=true` says so explicitly (the workflow SDK
  sends it with an exact URL). `workflowUrlExactMatch=false` makes it a prefix: that is
  what the SDK's `workflowUrlStartingWith` sends, without the flag, to the cancel
  endpoint; the DLQ's default is not documented beyond "exact", so exact it stays;
* entries go in DLQ order, at most a page a call (50 runs, 100 listed or deleted), at
  most `count` when given.

`dlqIds` and `label` may also come comma-separated (`dlqIds=a,b`); the other repeatable
filters may not, as a URL can hold a comma. An empty value counts as not given. An unknown
parameter is a 400: silently ignoring a misspelt filter would turn a narrow bulk call into
one over the whole DLQ. So is a parameter that takes one value given twice.

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
from daemon.emulator.state import FAILURE_FUNCTION_STATES, DlqEntry

MAX_RUNS_PER_CALL = 50

# The parameters of each kind of call. `count` and `cursor` page a walk; the rest filter.
BULK_PARAMS = frozenset(
    {
        "dlqIds", "cursor", "count", "fromDate", "toDate", "label", "callerIp",
        "flowControlKey", "workflowUrl", "workflowUrlExactMatch", "workflowRunId",
        "workflowCreatedAt", "failureFunctionState",
    }
)  # fmt: skip
# QStash's filters of the DLQ's messages, beside the workflow ones.
MESSAGE_PARAMS = frozenset(
    {"messageId", "url", "topicName", "scheduleId", "queueName", "responseStatus"}
)
DLQ_PARAMS = BULK_PARAMS | MESSAGE_PARAMS | {"source"}

_REPEATABLE = frozenset(
    {
        "dlqIds", "label", "callerIp", "flowControlKey", "workflowUrl", "url", "topicName",
        "scheduleId", "queueName", "responseStatus",
    }
)  # fmt: skip
_COMMA_SEPARATED = frozenset({"dlqIds", "label"})
_INTEGERS = frozenset({"count", "fromDate", "toDate", "workflowCreatedAt", "responseStatus"})
_BOOLEANS = {"true": True, "false": False}
_SOURCES = ("workflow",)
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
    """A call's selection. A tuple filter matches any of its values; () is no filter."""

    dlq_ids: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    cursor: Cursor | None = None
    count: int | None = None
    from_date: int | None = None
    to_date: int | None = None
    workflow_urls: tuple[str, ...] = ()
    workflow_url_exact: bool = True
    workflow_run_id: str | None = None
    workflow_created_at: int | None = None
    failure_function_state: str | None = None
    caller_ips: tuple[str, ...] = ()
    flow_control_keys: tuple[str, ...] = ()
    message_id: str | None = None
    urls: tuple[str, ...] = ()
    topic_names: tuple[str, ...] = ()
    schedule_ids: tuple[str, ...] = ()
    queue_names: tuple[str, ...] = ()
    response_statuses: tuple[int, ...] = ()
    workflows_only: bool = True

    @property
    def names_anything(self) -> bool:
        """Whether it names ids, a filter or a page: an empty one would select everything."""
        return self != BulkQuery(workflows_only=self.workflows_only)


def parse_bulk_query(
    items: Iterable[tuple[str, str]], accepted: frozenset[str] = BULK_PARAMS
) -> BulkQuery:
    """The query parameters of a call that takes `accepted`; 400 for unknown, repeated
    single-valued or malformed ones."""
    values: dict[str, list[str]] = {}
    for name, value in items:
        if name not in accepted:
            raise BadRequest(f"unknown query parameter {name}")
        parts = value.split(",") if name in _COMMA_SEPARATED else [value]
        given = values.setdefault(name, [])
        if given and name not in _REPEATABLE:
            raise BadRequest(f"query parameter {name} must be given once")
        given.extend(part.strip() for part in parts if part.strip())
    texts = {name: tuple(dict.fromkeys(given)) for name, given in values.items() if given}
    ints = {
        name: tuple(_integer(name, v) for v in texts[name]) for name in _INTEGERS & texts.keys()
    }
    if ints.get("count", (1,))[0] < 1:
        raise BadRequest("count must be a positive integer")

    def one(name: str) -> str | None:
        return texts[name][0] if name in texts else None

    def one_int(name: str) -> int | None:
        return ints[name][0] if name in ints else None

    state = one("failureFunctionState")
    if state is not None and state not in FAILURE_FUNCTION_STATES:
        allowed = ", ".join(sorted(FAILURE_FUNCTION_STATES))
        raise BadRequest(f"failureFunctionState must be one of {allowed}")
    exact = one("workflowUrlExactMatch") or "true"
    if exact not in _BOOLEANS:
        raise BadRequest("workflowUrlExactMatch must be true or false")
    source = one("source")
    if source is not None and source not in _SOURCES:
        raise BadRequest(f"source must be one of {', '.join(_SOURCES)}")
    cursor = one("cursor")
    return BulkQuery(
        dlq_ids=texts.get("dlqIds", ()),
        labels=texts.get("label", ()),
        cursor=None if cursor is None else Cursor.decode(cursor),
        count=one_int("count"),
        from_date=one_int("fromDate"),
        to_date=one_int("toDate"),
        workflow_urls=texts.get("workflowUrl", ()),
        workflow_url_exact=_BOOLEANS[exact],
        workflow_run_id=one("workflowRunId"),
        workflow_created_at=one_int("workflowCreatedAt"),
        failure_function_state=state,
        caller_ips=texts.get("callerIp", ()),
        flow_control_keys=texts.get("flowControlKey", ()),
        message_id=one("messageId"),
        urls=texts.get("url", ()),
        topic_names=texts.get("topicName", ()),
        schedule_ids=texts.get("scheduleId", ()),
        queue_names=texts.get("queueName", ()),
        response_statuses=ints.get("responseStatus", ()),
        # Only the DLQ's own routes take `source`; the others see workflow runs alone.
        workflows_only="source" not in accepted or source == "workflow",
    )


def _integer(name: str, value: str) -> int:
    if not _INTEGER.match(value):
        raise BadRequest(f"{name} must be an integer")
    return int(value)


def matches(entry: DlqEntry, query: BulkQuery) -> bool:
    """Whether a call with `query` selects `entry`, cursor and batch size aside."""
    if query.workflows_only and entry.workflow is None:
        return False
    if query.dlq_ids:
        return entry.dlq_id in query.dlq_ids
    if query.labels and not set(query.labels) & set(entry.labels):
        return False
    return all(_filters_hold(entry, query))


def _filters_hold(entry: DlqEntry, query: BulkQuery) -> Iterator[bool]:
    message = entry.message
    yield query.from_date is None or entry.created_at >= query.from_date
    yield query.to_date is None or entry.created_at <= query.to_date
    yield _any_of(query.caller_ips, entry.caller_ip)
    yield _any_of(query.flow_control_keys, entry.flow_control_key)
    yield query.message_id in (None, message["messageId"])
    yield _any_of(query.urls, message["url"])
    yield _any_of(query.topic_names, message.get("topicName"))
    yield _any_of(query.schedule_ids, message.get("scheduleId"))
    yield _any_of(query.queue_names, message.get("queueName"))
    yield _any_of(query.response_statuses, message.get("responseStatus"))
    workflow = entry.workflow
    if workflow is None:  # any workflow filter rules it out
        yield not (
            query.workflow_urls
            or query.workflow_run_id is not None
            or query.workflow_created_at is not None
            or query.failure_function_state is not None
        )
        return
    yield not query.workflow_urls or any(
        workflow.url == url if query.workflow_url_exact else workflow.url.startswith(url)
        for url in query.workflow_urls
    )
    yield query.workflow_run_id in (None, workflow.run_id)
    yield query.workflow_created_at in (None, workflow.created_at)
    yield query.failure_function_state in (None, workflow.failure_function_state)


def _any_of(wanted: tuple[object, ...], value: object) -> bool:
    return not wanted or value in wanted


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
