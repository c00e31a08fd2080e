"""Selection of DLQ entries for bulk resume/restart, as pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.emulator.bulk import (
    MAX_RUNS_PER_CALL,
    BulkQuery,
    Cursor,
    matches,
    parse_bulk_query,
    select_batch,
)
from daemon.emulator.errors import BadRequest
from daemon.emulator.headers import HeaderNames
from daemon.emulator.state import DlqEntry, SeedMessage, build_entry

NAMES = HeaderNames("Service")


def entry(seq: int, **fields: Any) -> DlqEntry:
    fields.setdefault("url", "https://app.example.com/wf")
    fields.setdefault("workflowRunId", f"wfr_{seq}")
    fields.setdefault("createdAt", 1000 + seq)
    seed = SeedMessage.model_validate(fields)
    return build_entry(seed, seq=seq, now_ms=5000, names=NAMES)


def ids(entries: tuple[DlqEntry, ...] | list[DlqEntry]) -> list[str]:
    return [e.dlq_id for e in entries]


def test_repeated_and_comma_separated_arrays_combine() -> None:
    """dlqIds and label come repeated, comma-separated, or both."""
    query = parse_bulk_query([("dlqIds", "a,b"), ("dlqIds", "c"), ("label", "x, y")])
    assert query.dlq_ids == ("a", "b", "c")
    assert query.labels == ("x", "y")


@pytest.mark.parametrize(
    ("name", "value"),
    [("count", "ten"), ("fromDate", "1.5"), ("toDate", "x"), ("workflowCreatedAt", "1e3")],
)
def test_non_integer_where_an_integer_is_required_is_rejected(name: str, value: str) -> None:
    """count, fromDate, toDate and workflowCreatedAt must be integers."""
    with pytest.raises(BadRequest, match=name):
        parse_bulk_query([(name, value)])


@pytest.mark.parametrize("value", ["0", "-3"])
def test_count_must_be_positive(value: str) -> None:
    """count of zero or below is rejected."""
    with pytest.raises(BadRequest, match="count"):
        parse_bulk_query([("count", value)])


def test_unknown_failure_function_state_is_rejected() -> None:
    """failureFunctionState takes only the four states of the spec."""
    with pytest.raises(BadRequest, match="failureFunctionState"):
        parse_bulk_query([("failureFunctionState", "CALLBACK_MAYBE")])


def test_unknown_parameter_is_rejected() -> None:
    """A misspelt filter is an error, not a bulk call over the whole DLQ."""
    with pytest.raises(BadRequest, match="labels"):
        parse_bulk_query([("labels", "billing")])


def test_single_valued_parameter_given_twice_is_rejected() -> None:
    """count=1&count=2 is ambiguous."""
    with pytest.raises(BadRequest, match="once"):
        parse_bulk_query([("count", "1"), ("count", "2")])


def test_empty_value_counts_as_not_given() -> None:
    """count= is no count."""
    assert parse_bulk_query([("count", ""), ("label", "")]) == BulkQuery()


@pytest.mark.parametrize("value", ["", "nonsense", "djE6eDox", "djE6MQ"])
def test_invalid_cursor_is_rejected(value: str) -> None:
    """Only a cursor the emulator handed out is accepted."""
    with pytest.raises(BadRequest, match="cursor"):
        Cursor.decode(value)


def test_cursor_round_trips() -> None:
    """A cursor decodes to what it encoded."""
    assert Cursor.decode(Cursor(41, 99).encode()) == Cursor(41, 99)


def test_only_workflow_entries_match() -> None:
    """A plain message is never resumed or restarted."""
    plain = build_entry(SeedMessage(url="https://a.example.com"), seq=0, now_ms=1, names=NAMES)
    assert not matches(plain, BulkQuery())
    assert not matches(plain, BulkQuery(dlq_ids=(plain.dlq_id,)))


def test_header_alone_makes_a_workflow_entry() -> None:
    """A seeded header `<Prefix>-Workflow-RunId`, in any spelling, marks a workflow run."""
    seeded = entry(0, workflowRunId=None, header={"service-workflow-runid": ["wfr_h"]})
    assert seeded.workflow is not None
    assert seeded.workflow.run_id == "wfr_h"


def test_dlq_ids_ignore_every_other_filter() -> None:
    """With dlqIds, a filter that would exclude the entry does not."""
    target = entry(0, callerIP="1.1.1.1", labels=["a"])
    query = BulkQuery(dlq_ids=(target.dlq_id,), caller_ips=("9.9.9.9",), labels=("zzz",))
    assert matches(target, query)
    assert not matches(entry(1), query)


def test_labels_are_ored() -> None:
    """An entry matches when it has any one of the labels."""
    query = BulkQuery(labels=("a", "b"))
    assert matches(entry(0, labels=["b", "c"]), query)
    assert not matches(entry(1, labels=["c"]), query)
    assert not matches(entry(2), query)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (BulkQuery(caller_ips=("1.1.1.1",), workflow_urls=("https://x.example.com/wf",)), True),
        (BulkQuery(caller_ips=("1.1.1.1",), workflow_urls=("https://y.example.com/wf",)), False),
        (BulkQuery(caller_ips=("2.2.2.2",), workflow_urls=("https://x.example.com/wf",)), False),
        (BulkQuery(labels=("a",), flow_control_keys=("fk",)), True),
        (BulkQuery(labels=("a",), flow_control_keys=("other",)), False),
        (BulkQuery(workflow_run_id="wfr_0", failure_function_state="CALLBACK_FAIL"), True),
        (BulkQuery(workflow_run_id="wfr_0", failure_function_state="CALLBACK_SUCCESS"), False),
        (BulkQuery(workflow_created_at=777), True),
        (BulkQuery(workflow_created_at=778), False),
    ],
)
def test_other_filters_are_anded(query: BulkQuery, expected: bool) -> None:
    """Every filter besides label must hold at once."""
    subject = entry(
        0,
        callerIP="1.1.1.1",
        workflowUrl="https://x.example.com/wf",
        labels=["a"],
        flowControlKey="fk",
        failureFunctionState="CALLBACK_FAIL",
        workflowCreatedAt=777,
    )
    assert matches(subject, query) is expected


def test_date_filters_are_inclusive() -> None:
    """fromDate and toDate include their own millisecond of createdAt."""
    entries = [entry(i, createdAt=at) for i, at in enumerate([999, 1000, 2000, 2001])]
    batch = select_batch(entries, BulkQuery(from_date=1000, to_date=2000), newest_seq=3)
    assert [e.created_at for e in batch.entries] == [1000, 2000]


def test_at_most_fifty_per_call_with_a_cursor_for_the_rest() -> None:
    """A call takes 50 in DLQ order and hands out a cursor; the last call's cursor is ""."""
    entries = [entry(i) for i in range(120)]
    first = select_batch(entries, BulkQuery(), newest_seq=119)
    assert len(first.entries) == MAX_RUNS_PER_CALL
    assert first.cursor != ""
    second = select_batch(entries, BulkQuery(cursor=Cursor.decode(first.cursor)), newest_seq=119)
    third = select_batch(entries, BulkQuery(cursor=Cursor.decode(second.cursor)), newest_seq=119)
    assert [len(b.entries) for b in (second, third)] == [50, 20]
    assert third.cursor == ""
    assert ids(first.entries + second.entries + third.entries) == ids(entries)


def test_count_bounds_a_call() -> None:
    """count takes fewer than 50, and the cursor says more remain."""
    batch = select_batch([entry(i) for i in range(5)], BulkQuery(count=2), newest_seq=4)
    assert len(batch.entries) == 2
    assert batch.cursor != ""


def test_count_above_fifty_is_capped() -> None:
    """A count above the service's limit still processes 50."""
    batch = select_batch([entry(i) for i in range(60)], BulkQuery(count=500), newest_seq=59)
    assert len(batch.entries) == MAX_RUNS_PER_CALL


def test_exact_fit_ends_with_an_empty_cursor() -> None:
    """When the last matching entry is taken, the cursor is "" even at the batch limit."""
    batch = select_batch([entry(i) for i in range(3)], BulkQuery(count=3), newest_seq=2)
    assert batch.cursor == ""


def test_cursor_continues_past_removed_entries() -> None:
    """Entries removed between calls do not upset the walk."""
    entries = [entry(i) for i in range(6)]
    first = select_batch(entries, BulkQuery(count=2), newest_seq=5)
    remaining = [e for e in entries if e not in first.entries and e.seq != 3]
    cursor = Cursor.decode(first.cursor)
    second = select_batch(remaining, BulkQuery(cursor=cursor), newest_seq=5)
    assert [e.seq for e in second.entries] == [2, 4, 5]


def test_walk_ignores_entries_newer_than_its_first_call() -> None:
    """Runs that fail again during a walk re-enter the DLQ but not that walk."""
    entries = [entry(i) for i in range(3)]
    first = select_batch(entries, BulkQuery(count=2), newest_seq=2)
    later = [*entries[2:], entry(3), entry(4)]
    rest = select_batch(later, BulkQuery(cursor=Cursor.decode(first.cursor)), newest_seq=4)
    assert [e.seq for e in rest.entries] == [2]
    assert rest.cursor == ""
