"""What both engines share to replay recorded decisions and to compare the shadow rules'
with them: the columns that keep them, the statements that read them, and the shapes
they are answered in.

Replay reads the records a page at a time in (received_at, dlqId) order, each page
strictly after the last one's end (keyset): a walk of callbacks_by_received that stops
after the page, so a page costs the same on 10 million records and replay holds one
page at a time, never the store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from daemon.store.listing import Mark
from daemon.store.records import ReplayRow

# SQLite migration 19, PostgreSQL migration 7: the facts a decision read (fields.kept)
# and the shadow rules' decision (rules/shadow.py). Both empty at insert, so ingest pays
# nothing for them; the shadowed records have an index of their own, which only
# settles with shadow rules loaded write to.
SCHEMA = """
    ALTER TABLE callbacks ADD COLUMN facts TEXT;
    ALTER TABLE callbacks ADD COLUMN shadow TEXT;
    CREATE INDEX callbacks_shadowed ON callbacks (received_at) WHERE shadow IS NOT NULL;
"""
REPLAY_COLUMNS = "dlq_id, received_at, state, reason, rule, action, overrides, workflow_key, facts"
EXAMPLES = 5  # dlqIds shown for each group of disagreements
MAX_PAGE = 10_000  # records a page of replay_rows: a few megabytes of facts at most


def rows_sql(
    since: float | None, after: tuple[float, str] | None, limit: int, mark: Mark
) -> tuple[str, dict[str, Any]]:
    """The statement of `replay_rows` and its parameters."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be from 1 to {MAX_PAGE}, not {limit}")
    params: dict[str, Any] = {"limit": limit}
    where = ["facts IS NOT NULL"]
    if since is not None:
        where.append(f"received_at >= {mark('since')}")
        params["since"] = since
    if after is not None:
        params["at"], params["after"] = after
        where.append(f"(received_at, dlq_id) > ({mark('at')}, {mark('after')})")
    return (
        f"SELECT {REPLAY_COLUMNS} FROM callbacks WHERE {' AND '.join(where)} "
        f"ORDER BY received_at, dlq_id LIMIT {mark('limit')}",
        params,
    )


def replay_rows(rows: Sequence[Sequence[Any]]) -> list[ReplayRow]:
    return [ReplayRow(*row) for row in rows]


# The shadow's decision, of its JSON text in `shadow`, by the engine's JSON function.
Member = Callable[[str], str]


def disagreements_sql(
    since: float | None, mark: Mark, member: Member
) -> tuple[str, dict[str, Any]]:
    """The records whose shadow decision differs from the live one (rule, action or
    overrides), grouped by the two rules and actions: each group's count and its newest
    EXAMPLES dlqIds, one row per example. A range of callbacks_shadowed."""
    params: dict[str, Any] = {"examples": EXAMPLES}
    shadowed = "shadow IS NOT NULL"
    if since is not None:
        shadowed += f" AND received_at >= {mark('since')}"
        params["since"] = since
    rule, action, overrides = member("rule"), member("action"), member("overrides")
    differ = " OR ".join(
        f"coalesce({shadow}, '') <> coalesce({live}, '')"
        for shadow, live in ((rule, "rule"), (action, "action"), (overrides, "overrides"))
    )
    group = "live_rule, live_action, shadow_rule, shadow_action"
    found = (
        f"SELECT dlq_id, received_at, rule AS live_rule, action AS live_action, "
        f"{rule} AS shadow_rule, {action} AS shadow_action FROM callbacks "
        f"WHERE {shadowed} AND ({differ})"
    )
    ranked = (
        f"SELECT {group}, dlq_id, count(*) OVER (PARTITION BY {group}) AS n, "
        f"row_number() OVER (PARTITION BY {group} ORDER BY received_at DESC, dlq_id DESC) "
        f"AS k FROM ({found}) AS differing"
    )
    sql = f"SELECT {group}, n, dlq_id FROM ({ranked}) AS ranked WHERE k <= {mark('examples')}"
    return sql, params


def disagreements(rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The groups of `disagreements_sql`'s rows, the largest first."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for live_rule, live_action, shadow_rule, shadow_action, n, dlq_id in rows:
        key = (live_rule, live_action, shadow_rule, shadow_action)
        group = groups.setdefault(
            key,
            {
                "liveRule": live_rule,
                "liveAction": live_action,
                "shadowRule": shadow_rule,
                "shadowAction": shadow_action,
                "count": int(n),
                "examples": [],
            },
        )
        group["examples"].append(dlq_id)
    for group in groups.values():
        group["examples"].sort()
    # The largest first; ties in the order of their rules' names, for a stable answer.
    return [
        groups[key]
        for key in sorted(groups, key=lambda key: (-groups[key]["count"], [k or "" for k in key]))
    ]
