"""The account's rate limit learned once: against a service that tells its limit only on
a 429 (and counts it in a sliding second), three `recoveryd serve` on one PostgreSQL, two
of them restarted mid-drain, earn one episode of 429s in all, and the store keeps the
limit and how it was learned."""

from __future__ import annotations

import asyncio
import signal
from contextlib import ExitStack
from pathlib import Path

import httpx
import psycopg

from daemon.account.rate import SharedRate
from daemon.runtime.supervisor import Supervisor
from daemon.store import open_store
from daemon.upstream import RateLimiter
from tests.pipeline.support import BULK_PATHS, assert_recovered_once
from tests.pipeline.test_replicas import metric, post_all, status
from tests.processes import Served, emulator_process, serving
from tests.support import LOOPBACK_TLS, emulator_config, eventually, wait_for, workflows

LIMIT = 20  # the account's requests a second
ROUNDS = 3  # of callbacks: before the restarts, after the first, after the second
PER_ROUND = 120
# 429s closer than this to the one before belong to one episode. A discovery's 429s come
# within a second or two of each other (the replicas ramp at once and each learns from
# its own 429 or from the store within a second); another episode is 429s earned later.
EPISODE_GAP = 5.0
RULES = """\
version: 1
rules:
  - name: resume-all
    match: {workflow: true}
    action: resume
    batch: {maxSize: 20, maxWait: 200ms}
"""


def episodes(refused_at: list[float]) -> list[list[float]]:
    """The 429s' times in episodes: each 429 within EPISODE_GAP s of the one before."""
    grouped: list[list[float]] = []
    for at in sorted(refused_at):
        if grouped and at - grouped[-1][-1] <= EPISODE_GAP:
            grouped[-1].append(at)
        else:
            grouped.append([at])
    return grouped


async def test_a_limit_learned_is_kept_and_adopted_before_the_next_starts_first_call(
    tmp_path: Path,
) -> None:
    """A limit discovered here is saved; the next start (a new limiter on the same store)
    knows it before any call, and how it was learned."""
    store_url = f"sqlite:///{tmp_path / 'recoveryd.db'}"
    async with open_store(store_url) as store:
        limiter = RateLimiter(probe=True)
        async with SharedRate(store, limiter, "before", Supervisor()).running():
            assert limiter.phase == "probing"
            limiter.learn(120, "discovered")
            kept = await eventually(store.learned_rate, 10, "the limit kept")
        assert (kept.rate, kept.source, kept.replica) == (120, "discovered", "before")
    async with open_store(store_url) as store:
        limiter = RateLimiter(probe=True)
        async with SharedRate(store, limiter, "after", Supervisor()).running():
            assert (limiter.phase, limiter.rate, limiter.source) == ("known", 120, "discovered")


def calls_made(served: Served) -> float:
    text = httpx.get(f"{served.admin_url}/metrics", timeout=5, verify=LOOPBACK_TLS).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("recoveryd_upstream_calls_total{")
    )


def test_three_replicas_and_two_restarts_discover_a_silent_limit_once(
    tmp_path: Path, postgres_url: str
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    config = emulator_config(
        execute_runs=False,
        max_requests_per_second=LIMIT,
        rate_limit_headers="on_429",
        rate_limit_window="sliding",
    )
    with (
        emulator_process(config) as service_url,
        httpx.Client(base_url=service_url, timeout=30) as control,
        ExitStack() as running,
    ):
        dlq_ids: list[str] = control.post(
            "/_emulator/dlq", json={"messages": workflows(ROUNDS * PER_ROUND)}
        ).json()["dlqIds"]
        settings = {
            "SERVICE_URL": service_url,
            "RULES": str(rules),
            "STORE": postgres_url,
            "REPLICA_LEASE": "3s",
        }
        started = 0

        def start() -> Served:
            nonlocal started
            folder = tmp_path / f"replica-{started}"
            folder.mkdir()
            started += 1
            return running.enter_context(serving(folder, prefix=(), **settings))

        def drain(replicas: list[Served], batch: list[str], done: int) -> None:
            wait_for(lambda: all(metric(s, "recoveryd_replicas") == 3 for s in replicas),
                     60, "three replicas to see each other")  # fmt: skip
            assert asyncio.run(post_all(replicas, batch)) == set(batch)
            wait_for(lambda: status(replicas[0])["states"]["done"] == done, 120,
                     f"{done} dlqIds done")  # fmt: skip

        replicas = [start() for _ in range(3)]
        drain(replicas, dlq_ids[:PER_ROUND], PER_ROUND)
        restarted: list[tuple[float, float]] = []  # (calls made, the pace they kept to)
        for round_, how in enumerate((signal.SIGKILL, signal.SIGTERM), start=1):
            replicas[0].stop(how)
            replicas = [*replicas[1:], start()]
            batch = dlq_ids[round_ * PER_ROUND : (round_ + 1) * PER_ROUND]
            drain(replicas, batch, (round_ + 1) * PER_ROUND)
            pace = metric(replicas[-1], "recoveryd_upstream_rate_limit_requests_per_second")
            restarted.append((calls_made(replicas[-1]), pace))
        journal = control.get("/_emulator/journal").json()
        runs = control.get("/_emulator/runs").json()
        stats = control.get("/_emulator/stats").json()
    with psycopg.connect(postgres_url) as pg:
        kept = pg.execute("SELECT rate, source FROM learned_rate").fetchall()

    refused = [call["at"] for call in journal if call["status"] == 429]
    assert len(episodes(refused)) == 1, f"429s at {sorted(refused)}"
    assert kept == [(LIMIT, "discovered")]
    # Each restarted replica called the service, at the limit it read from the store.
    assert [pace for _, pace in restarted] == [LIMIT, LIMIT]
    assert all(calls > 0 for calls, _ in restarted)
    callback_calls = [
        call for call in journal
        if call["path"] not in BULK_PATHS or any(n == "dlqIds" for n, _ in call["query"])
    ]  # fmt: skip
    assert_recovered_once(callback_calls, runs, dlq_ids)
    assert stats["rate_limited"] == len(refused)
