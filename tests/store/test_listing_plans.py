"""The listings read indexes in order, never the callbacks table whole, on both engines.

A store is filled with rows spread over states, rules, actions, URLs and URL Groups (as
a busy one has them), its statistics gathered, and each filter's statement explained:
its plan must walk the index the filter's column leads (in the page's order: no sort of
what matched, so a page costs the same on 10 million records), and read no table whole.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from daemon.store import RecordQuery, replay
from daemon.store import listing as shared
from tests import postgres
from tests.store.support import SQLITE, OpenStore

ROWS = 20_000
NOW = 1_000_000.0
CURSOR = shared.encode_cursor(NOW - 5_000, "d-15000")
# Each filter's statement, and the indexes its plan must walk (one of them, or all).
RECORDS: dict[str, tuple[RecordQuery, set[str]]] = {
    "newest": (RecordQuery(), {"callbacks_by_received"}),
    "newest, next page": (RecordQuery(cursor=CURSOR), {"callbacks_by_received"}),
    "state": (RecordQuery(state="failed", cursor=CURSOR), {"callbacks_by_state"}),
    "rule": (RecordQuery(rule="rule-7", cursor=CURSOR), {"callbacks_by_rule"}),
    "action": (RecordQuery(action="restart", cursor=CURSOR), {"callbacks_by_action"}),
    "since": (RecordQuery(since=NOW - 100), {"callbacks_by_received"}),
}
Q_INDEXES = {"callbacks_by_run_id", "callbacks_by_url", "callbacks_by_url_group"}
FILL = {
    "sqlite": (
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {rows} - 1) "
        "INSERT INTO callbacks (dlq_id, body, received_at, state, rule, action, "
        "workflow_run_id, url, url_group, endpoint, status, decided_at, updated_at, facts, shadow) "
        "SELECT 'd-' || i, X'7B7D', {now} - {rows} + i, "
        # Most records done, as in a store that works: a rare state is what one filters by.
        "CASE i % 100 WHEN 0 THEN 'received' WHEN 1 THEN 'failed' WHEN 2 THEN 'gone' "
        "ELSE 'done' END, "
        "CASE WHEN i % 4 = 0 THEN NULL ELSE 'rule-' || (i % 50) END, "
        "CASE WHEN i % 4 = 0 THEN NULL WHEN i % 97 = 0 THEN 'restart' ELSE 'resume' END, "
        "CASE WHEN i % 4 = 0 THEN NULL ELSE 'wfr-' || i END, "
        "'https://host/' || (i % 997), "
        "CASE WHEN i % 2 = 0 THEN 'group-' || (i % 89) END, "
        "CASE WHEN i % 2 = 0 THEN 'ep' END, 500 + i % 4, "
        "CASE WHEN i % 4 = 0 THEN NULL ELSE {now} - {rows} + i END, {now} - {rows} + i, "
        # The decided records keep their facts, and two in 100 a shadow decision.
        "CASE WHEN i % 4 = 0 THEN NULL ELSE '{{}}' END, "
        'CASE WHEN i % 50 = 1 THEN \'{{"rule":null,"action":null,"overrides":null}}\' END '
        "FROM n"
    ),
}
FILL["postgres"] = (
    FILL["sqlite"]
    .replace(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {rows} - 1) ", ""
    )
    .replace("X'7B7D'", "'\\x7b7d'::bytea")
    .replace("FROM n", "FROM generate_series(0, {rows} - 1) AS n(i)")
)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def filled(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OpenStore]:
    """A store of each kind, filled and analyzed once for the module: its tests only
    explain statements and read."""
    if request.param == "sqlite":
        yield fill(OpenStore(f"{SQLITE}{tmp_path_factory.mktemp('plans') / 's.db'}"))
        return
    with postgres.fresh_database(request.getfixturevalue("postgres_server")) as url:
        yield fill(OpenStore(url))


def fill(open_store: OpenStore) -> OpenStore:
    async def migrate() -> None:
        async with open_store():
            pass

    asyncio.run(migrate())
    open_store.query(FILL[open_store.kind].format(rows=ROWS, now=NOW))
    for number in range(20):  # 2,000 batches, 1 in 10 pending
        open_store.query(
            "INSERT INTO batches (action, overrides, state, dlq_ids, created_at) VALUES "
            + ", ".join(
                f"('resume', '{{}}', '{'pending' if n % 10 == 0 else 'settled'}', '[]', {n})"
                for n in range(number * 100, number * 100 + 100)
            )
        )
    open_store.query("ANALYZE")
    return open_store


def plan(store: OpenStore, sql: str, params: dict[str, Any]) -> str:
    """The plan of `sql` as text, whatever the engine: one step a line."""
    if store.kind == "sqlite":
        return "\n".join(row[3] for row in store.query(_inline(sql, params, ":{}")))
    rows = store.query(f"EXPLAIN {_inline(sql, params, '%({})s')}")
    return "\n".join(row[0] for row in rows)


def _inline(sql: str, params: dict[str, Any], mark: str) -> str:
    # The parameters as literals: each engine's EXPLAIN is run through `query`, plain SQL.
    for name, value in sorted(params.items(), key=lambda item: -len(item[0])):
        literal = f"'{value}'" if isinstance(value, str) else repr(value)
        sql = sql.replace(mark.format(name), literal)
    return sql if mark != ":{}" else f"EXPLAIN QUERY PLAN {sql}"


def _mark(store: OpenStore) -> Any:
    return (lambda name: f":{name}") if store.kind == "sqlite" else (lambda name: f"%({name})s")


def _no_full_read(store: OpenStore, steps: str) -> None:
    if store.kind == "sqlite":
        assert not re.search(r"SCAN (callbacks|batches)(?! USING)", steps), steps
        return
    assert not re.search(r"Seq Scan on (callbacks|batches)", steps), steps


def _walked(steps: str) -> set[str]:
    return set(re.findall(r"\b(callbacks_\w+|batches_\w+|sqlite_autoindex_callbacks_1)", steps))


@pytest.mark.parametrize("name", list(RECORDS))
def test_each_filter_walks_its_index_in_order(filled: OpenStore, name: str) -> None:
    """The filter's index, in the page's order: no sort, no scan of the table."""
    query, indexes = RECORDS[name]
    steps = plan(filled, *shared.records_sql(query, _mark(filled)))
    _no_full_read(filled, steps)
    assert _walked(steps) & indexes, steps
    assert not re.search(r"TEMP B-TREE|\bSort\b", steps), steps  # rows come in order


def test_a_search_is_four_walks_of_a_page_each(filled: OpenStore) -> None:
    """q: the dlqId's key, and the run id's, URL's and URL Group's indexes."""
    query = RecordQuery(q="https://host/5", state="failed", cursor=CURSOR)
    steps = plan(filled, *shared.records_sql(query, _mark(filled)))
    _no_full_read(filled, steps)
    assert _walked(steps) >= Q_INDEXES, steps
    assert _walked(steps) & {"callbacks_pkey", "sqlite_autoindex_callbacks_1"}, steps


def test_the_batches_are_walked_by_their_key(filled: OpenStore) -> None:
    """Newest first by id, and by state."""
    cursor = shared.encode_cursor(1_500)
    for state in (None, "pending"):
        steps = plan(filled, *shared.batches_sql(state, cursor, 50, _mark(filled)))
        _no_full_read(filled, steps)
        assert not re.search(r"TEMP B-TREE|\bSort\b", steps), steps


def test_the_activity_reads_two_index_ranges(filled: OpenStore) -> None:
    """Decisions by callbacks_by_decision, recoveries by callbacks_by_update."""
    mark = _mark(filled)
    bounds = {"start": NOW - 3600, "now": NOW}
    within = f">= {mark('start')} AND {{}} < {mark('now')}"
    decided = plan(
        filled,
        f"SELECT count(*) FROM callbacks WHERE decided_at {within.format('decided_at')}",
        bounds,
    )
    recovered = plan(
        filled,
        "SELECT count(*) FROM callbacks WHERE state = 'done' "
        f"AND updated_at {within.format('updated_at')}",
        bounds,
    )
    for steps, index in ((decided, "callbacks_by_decision"), (recovered, "callbacks_by_update")):
        _no_full_read(filled, steps)
        assert index in _walked(steps), steps


def test_the_groups_are_read_without_the_callbacks(filled: OpenStore) -> None:
    """The aggregate the triggers keep holds what a group count of the table would say."""

    async def read() -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
        async with filled() as store:
            return await store.failure_groups(limit=500), await store.rule_outcomes()

    groups, outcomes = asyncio.run(read())
    counted = filled.query(
        "SELECT rule, state, count(*) FROM callbacks WHERE rule IS NOT NULL GROUP BY rule, state"
    )
    assert outcomes == {rule: {} for rule, _, _ in counted} | {
        rule: {state: n for r, state, n in counted if r == rule} for rule, _, _ in counted
    }
    assert sum(group["count"] for group in groups) <= ROWS
    assert json.dumps(groups)  # plain JSON


@pytest.mark.parametrize("since", [None, NOW - 100])
def test_replay_walks_the_received_index_in_order(filled: OpenStore, since: float | None) -> None:
    """Replay's pages (store/replay.py): callbacks_by_received from the keyset on."""
    after = (NOW - 5_000, "d-15000")
    steps = plan(filled, *replay.rows_sql(since, after, 1_000, _mark(filled)))
    _no_full_read(filled, steps)
    assert "callbacks_by_received" in _walked(steps), steps
    assert not re.search(r"TEMP B-TREE|\bSort\b", steps), steps


def test_the_shadow_disagreements_read_only_the_shadowed_records(filled: OpenStore) -> None:
    """callbacks_shadowed: the records settled while shadow rules were loaded."""
    member = (
        (lambda name: f"json_extract(shadow, '$.{name}')")
        if filled.kind == "sqlite"
        else (lambda name: f"(shadow::jsonb ->> '{name}')")
    )
    steps = plan(filled, *replay.disagreements_sql(NOW - 100, _mark(filled), member))
    _no_full_read(filled, steps)
    assert "callbacks_shadowed" in _walked(steps), steps
