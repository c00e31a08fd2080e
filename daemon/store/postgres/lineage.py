"""Which workflow a failed run belongs to, over the PostgreSQL store.

The same lines as the SQLite store's (see `daemon.store.sqlite.lineage` for why and how):
a dlqId's `workflow_key` is the run id of the first failure of its line, found through
the runs that a batch's call created (`recovered_runs`). A batch's dlqIds are `jsonb`
here, read member by member with `jsonb_array_elements_text`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from daemon.store.postgres.db import Connection
from daemon.store.records import RECOVERING

_RECOVERING = ", ".join(f"'{state}'" for state in RECOVERING)  # literals: the index is used
# A notify or remove-endpoint decision ends `done` too, but recovers nothing.
_RECOVERIES = "'resume', 'restart'"


async def record_runs(
    connection: Connection, batch_id: int, runs: Sequence[dict[str, Any]], now: float
) -> None:
    """Keep the runs a batch's call created, to know their line when they fail. A run
    already known keeps its first batch (as SQLite's INSERT OR IGNORE)."""
    run_ids = [run["workflowRunId"] for run in runs if isinstance(run.get("workflowRunId"), str)]
    if not run_ids:
        return
    await connection.execute(
        "INSERT INTO recovered_runs (run_id, batch_id, created_at) "
        "SELECT run_id, %s, %s FROM unnest(%s::text[]) AS run_id "
        "ON CONFLICT (run_id) DO NOTHING",
        (batch_id, now, run_ids),
    )


async def workflow_key(
    connection: Connection, run_id: str, fingerprint: str | None, since: float
) -> str:
    """The line `run_id` belongs to (see the module's docstring); `since` is the start of
    the budget's window, for choosing among lines when the answer is ambiguous."""
    cursor = await connection.execute(
        "SELECT callbacks.workflow_key, callbacks.fingerprint FROM recovered_runs "
        "JOIN batches ON batches.id = recovered_runs.batch_id "
        "CROSS JOIN LATERAL jsonb_array_elements_text(batches.dlq_ids) AS member (dlq_id) "
        "JOIN callbacks ON callbacks.dlq_id = member.dlq_id "
        "WHERE recovered_runs.run_id = %s AND callbacks.workflow_key IS NOT NULL",
        (run_id,),
    )
    found = await cursor.fetchall()
    lines: set[str] = {key for key, _ in found}
    if len(lines) > 1 and fingerprint is not None:
        lines = {key for key, theirs in found if theirs == fingerprint} or lines
    if not lines:
        return run_id
    # The line with the most recoveries; among equals, the first by key (as SQLite's).
    made = {key: await recoveries(connection, key, since, exclude=None) for key in lines}
    return max(sorted(lines), key=made.__getitem__)


async def recoveries(connection: Connection, key: str, since: float, exclude: str | None) -> int:
    """Recoveries of the line `key` decided since `since`, but `exclude`'s own."""
    cursor = await connection.execute(
        "SELECT count(*) FROM callbacks WHERE workflow_key = %s AND decided_at >= %s "
        f"AND state IN ({_RECOVERING}) AND action IN ({_RECOVERIES}) "
        "AND dlq_id IS DISTINCT FROM %s::text",
        (key, since, exclude),
    )
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def forget_runs(connection: Connection, batch_ids: Iterable[int]) -> None:
    """The runs of batches that were pruned: their line is no longer known."""
    await connection.execute(
        "DELETE FROM recovered_runs WHERE batch_id = ANY(%s::bigint[]) "
        "AND NOT EXISTS (SELECT 1 FROM batches WHERE batches.id = recovered_runs.batch_id)",
        (list(batch_ids),),
    )
