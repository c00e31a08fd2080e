"""Which workflow a failed run belongs to, across the new run ids that recovery creates.

The service gives a resumed or restarted run a new workflowRunId, so a budget counted
per run id would never see the second recovery of a workflow that keeps failing: it
would be resumed forever. Each dlqId's record therefore carries a `workflow_key`, the
run id of the first failure of its line:

* the bulk call's answer lists the runs it created (`workflowRuns`); they are kept with
  the batch that created them (`recovered_runs`);
* a failed run whose id is one of those belongs to the line of a dlqId of that batch.
  A batch of one dlqId says which; in a larger one, the answer's order is not promised
  to follow the dlqIds', so the dlqId whose message has the same fingerprint (its url
  and body, which a new run repeats) is taken. When that still leaves several lines,
  the one with the most recoveries is taken: a budget may stop a run a little early,
  never let one through past it;
* any other run (the first failure, or a run made by a sweep or by hand) starts a line
  of its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from daemon.store.records import RECOVERING

# Migration 9 (see sqlite.MIGRATIONS).
SCHEMA = """
    ALTER TABLE callbacks ADD COLUMN workflow_key TEXT;
    ALTER TABLE callbacks ADD COLUMN fingerprint TEXT;
    UPDATE callbacks SET workflow_key = workflow_run_id;
    CREATE INDEX callbacks_by_workflow ON callbacks (workflow_key, decided_at);
    CREATE TABLE recovered_runs (
        run_id TEXT PRIMARY KEY,
        batch_id INTEGER NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE INDEX recovered_runs_by_batch ON recovered_runs (batch_id);
"""

# Migration 13: budgets count by workflow_key now (callbacks_by_workflow); the index by run
# id that the count per run id read would only cost every write of a decision.
RUN_INDEX_DROPPED = """
    DROP INDEX callbacks_by_run;
"""

_RECOVERING = ", ".join(f"'{state}'" for state in RECOVERING)  # literals: the index is used
# A notify or remove-endpoint decision ends `done` too, but recovers nothing.
_RECOVERIES = "'resume', 'restart'"


def record_runs(
    connection: sqlite3.Connection, batch_id: int, runs: Sequence[dict[str, Any]], now: float
) -> None:
    """Keep the runs a batch's call created, to know their line when they fail."""
    connection.executemany(
        "INSERT OR IGNORE INTO recovered_runs (run_id, batch_id, created_at) VALUES (?, ?, ?)",
        [
            (run["workflowRunId"], batch_id, now)
            for run in runs
            if isinstance(run.get("workflowRunId"), str)
        ],
    )


def workflow_key(
    connection: sqlite3.Connection, run_id: str, fingerprint: str | None, since: float
) -> str:
    """The line `run_id` belongs to (see the module's docstring); `since` is the start of
    the budget's window, for choosing among lines when the answer is ambiguous."""
    found = connection.execute(
        "SELECT callbacks.workflow_key, callbacks.fingerprint FROM recovered_runs "
        "JOIN batches ON batches.id = recovered_runs.batch_id "
        "JOIN json_each(batches.dlq_ids) AS member "
        "JOIN callbacks ON callbacks.dlq_id = member.value "
        "WHERE recovered_runs.run_id = ? AND callbacks.workflow_key IS NOT NULL",
        (run_id,),
    ).fetchall()
    lines: set[str] = {key for key, _ in found}
    if len(lines) > 1 and fingerprint is not None:
        lines = {key for key, theirs in found if theirs == fingerprint} or lines
    if not lines:
        return run_id
    return max(sorted(lines), key=lambda key: recoveries(connection, key, since, exclude=None))


def recoveries(connection: sqlite3.Connection, key: str, since: float, exclude: str | None) -> int:
    """Recoveries of the line `key` decided since `since`, but `exclude`'s own."""
    (count,) = connection.execute(
        "SELECT count(*) FROM callbacks WHERE workflow_key = ? AND decided_at >= ? "
        f"AND state IN ({_RECOVERING}) AND action IN ({_RECOVERIES}) AND dlq_id IS NOT ?",
        (key, since, exclude),
    ).fetchone()
    return int(count)


def forget_runs(connection: sqlite3.Connection, batch_ids: Iterable[int]) -> None:
    """The runs of batches that were pruned: their line is no longer known."""
    connection.executemany(
        "DELETE FROM recovered_runs WHERE batch_id = ? "
        "AND NOT EXISTS (SELECT 1 FROM batches WHERE id = ?)",
        [(batch_id, batch_id) for batch_id in batch_ids],
    )
