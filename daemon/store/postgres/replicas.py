"""Replicas sharing one PostgreSQL store: who is alive, and the work of those gone.

Each replica renews its row in `replicas` every few seconds (`heartbeat`). What it holds
is marked with its id: the received dlqIds it has leased (`callbacks.lease_owner`), the
decided ones waiting in its batcher (the same column), and the batches it sends or
checks (`batches.owner`). A replica that lets `alive_until` pass is gone: the next
heartbeat of any replica deletes its row and frees its work in the same transaction, so
that exactly one replica adopts each batch, and only once its owner can no longer be
sending it. A replica that stops cleanly frees its work at once (`leave`).
"""

from __future__ import annotations

from daemon.store.postgres.db import Connection
from daemon.store.records import Replica


async def heartbeat(connection: Connection, replica: str, lease: float, now: float) -> list[str]:
    """`replica` is alive for `lease` seconds more; the replicas found gone, their work
    freed. A replica declared gone that is still running comes back here as a new one:
    its leases and batches are no longer its own (the store's fences see to that)."""
    await connection.execute(
        "INSERT INTO replicas (id, started_at, seen_at, alive_until) "
        "VALUES (%(id)s, %(now)s, %(now)s, %(until)s) "
        "ON CONFLICT (id) DO UPDATE SET seen_at = %(now)s, alive_until = %(until)s",
        {"id": replica, "now": now, "until": now + lease},
    )
    cursor = await connection.execute(
        "DELETE FROM replicas WHERE alive_until < %s RETURNING id", (now,)
    )
    gone = [replica_id for (replica_id,) in await cursor.fetchall()]
    if gone:
        await _free(connection, gone)
    return gone


async def leave(connection: Connection, replica: str) -> None:
    """`replica` stops: its work is anyone's from now on."""
    await connection.execute("DELETE FROM replicas WHERE id = %s", (replica,))
    await _free(connection, [replica])


async def alive(connection: Connection, now: float) -> list[Replica]:
    """The replicas alive, by id."""
    cursor = await connection.execute(
        "SELECT id, started_at, seen_at FROM replicas WHERE alive_until >= %s ORDER BY id",
        (now,),
    )
    return [Replica(*row) for row in await cursor.fetchall()]


async def _free(connection: Connection, replicas: list[str]) -> None:
    # A received dlqId's lease ends (claimable at once); a decided one waits for any
    # batcher's next look at what is pending (its lease_until is a retry time: kept).
    await connection.execute(
        "UPDATE callbacks SET lease_owner = NULL, "
        "lease_until = CASE WHEN state = 'received' THEN NULL ELSE lease_until END "
        "WHERE lease_owner = ANY(%s::text[])",
        (replicas,),
    )
    await connection.execute(
        "UPDATE batches SET owner = NULL WHERE state = 'pending' AND owner = ANY(%s::text[])",
        (replicas,),
    )
