"""`/api/v1/status` on the replicas: on SQLite the one daemon, holding the singleton lock;
on PostgreSQL every replica alive with its part of the rate limit and the one that holds
the lock, as two `recoveryd serve` processes see each other, and after the holder dies."""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from tests.processes import Served, serving
from tests.support import LOOPBACK_TLS, wait_for


def status(served: Served) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(
        f"{served.admin_url}/api/v1/status", timeout=5, verify=LOOPBACK_TLS
    ).json()
    return answer


def holding(served: Served) -> bool:
    text = httpx.get(f"{served.admin_url}/metrics", timeout=5, verify=LOOPBACK_TLS).text
    return "\nrecoveryd_singleton_jobs_running 1.0\n" in text


def test_on_sqlite_the_one_daemon_is_the_replica_and_holds_the_lock(tmp_path: Path) -> None:
    before = time.time()
    with serving(tmp_path) as served:
        answer = status(served)
    [replica] = answer["replicas"]
    assert replica["self"] is True
    assert replica["share"] == 1.0
    assert before <= replica["startedAt"] <= replica["seenAt"] <= time.time()
    assert answer["singletonHolder"] == replica["id"]


def test_on_postgresql_every_replica_its_share_and_the_lock_holder(
    tmp_path: Path, postgres_url: str
) -> None:
    settings = {"STORE": postgres_url, "REPLICA_LEASE": "3s"}
    with ExitStack() as running:
        replicas = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            replicas.append(running.enter_context(serving(tmp_path / name, **settings)))

        def both_known() -> bool:
            return all(len(status(served)["replicas"]) == 2 for served in replicas)

        wait_for(both_known, what="the replicas to see each other")
        wait_for(lambda: any(holding(served) for served in replicas), what="a lock holder")
        answers = [status(served) for served in replicas]
        ids = [[r["id"] for r in answer["replicas"]] for answer in answers]
        assert ids[0] == ids[1]  # the same two, in the same order
        mine = [next(r["id"] for r in answer["replicas"] if r["self"]) for answer in answers]
        assert sorted(mine) == sorted(ids[0])
        for answer in answers:
            assert [r["share"] for r in answer["replicas"]] in ([0.5, 0.5], [0.5, 0.0], [0.0, 0.5])
        (leader,) = [served for served in replicas if holding(served)]
        leader_id = mine[replicas.index(leader)]
        assert {answer["singletonHolder"] for answer in answers} == {leader_id}
        wait_for(
            lambda: all(r["share"] == 0.5 for r in status(replicas[0])["replicas"]),
            what="the limit shared out",
        )

        leader.stop(signal.SIGKILL)
        (other,) = [served for served in replicas if served is not leader]
        other_id = mine[replicas.index(other)]
        wait_for(lambda: status(other)["singletonHolder"] == other_id, what="the lock taken over")
        wait_for(lambda: len(status(other)["replicas"]) == 1, what="the dead replica gone")
        [alone] = status(other)["replicas"]
        assert alone == {**alone, "id": other_id, "share": 1.0, "self": True}
