"""What is the PostgreSQL store's own: several stores on one database at once, as replicas
run, really concurrently; its schema's versions; the server going away and coming back.
(What every store does is tested on both: see conftest.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from structlog.testing import capture_logs

from daemon.foundation.urls import without_credentials
from daemon.store import Store, StoreUnavailable
from daemon.store.postgres.schema import MIGRATIONS
from daemon.store.records import Outcome, State
from tests import postgres, system_tools
from tests.store.support import (
    ACTION,
    COUNTED,
    OVERRIDES,
    OWNER,
    OpenStore,
    callback,
    cleared_within,
    nonzero,
    problems_within,
    received,
    retried,
    settled,
)
from tests.support import eventually

NOW = 2_000.0
DAY = 86_400.0
# What settling a claimed dlqId makes of it, in turn (`received`: fetched again later).
MOVES: tuple[State, ...] = (
    "decided", "done", "failed", "gone", "decided", "skipped", "dry-run", "received"
)  # fmt: skip


@pytest.fixture
def database(postgres_url: str) -> OpenStore:
    return OpenStore(postgres_url)


@contextlib.asynccontextmanager
async def replicas(database: OpenStore, n: int = 3, **options: float) -> AsyncIterator[list[Store]]:
    """`n` stores open on `database` at once, opened together, as replicas starting."""
    async with contextlib.AsyncExitStack() as stack:
        opened = (stack.enter_async_context(database(**options)) for _ in range(n))
        yield list(await asyncio.gather(*opened))


async def claimed_until_none_left(store: Store, owner: str) -> list[tuple[str, str, int]]:
    """Claims of 7 until a claim finds none: (dlqId, owner, tries) of each leased."""
    leased: list[tuple[str, str, int]] = []
    while claimed := await store.claim(owner, 7, 60.0, NOW):
        leased += [(item.dlq_id, owner, item.tries) for item in claimed]
    return leased


async def test_replicas_opening_a_new_database_together_migrate_it_once(
    database: OpenStore,
) -> None:
    """Three stores at once on an empty database: each migration applied once, the
    version recorded once, no error; opening it again migrates nothing."""
    with capture_logs() as logs:
        async with replicas(database) as stores:
            assert [await store.inbox_depth() for store in stores] == [0, 0, 0]
        async with database():
            pass
    migrated = [entry["version"] for entry in logs if entry["event"] == "store schema migrated"]
    assert migrated == list(range(1, len(MIGRATIONS) + 1))
    assert database.query("SELECT version FROM recoveryd_schema") == [(len(MIGRATIONS),)]


async def test_a_database_of_a_newer_recoveryd_is_refused(database: OpenStore) -> None:
    """A schema version past this code's is refused at open, naming both versions, and
    left as it is."""
    async with database():
        pass
    newer = len(MIGRATIONS) + 1
    database.query(f"UPDATE recoveryd_schema SET version = {newer}")
    refusal = f"schema version {newer} is newer than this recoveryd \\({len(MIGRATIONS)}\\)"
    with pytest.raises(StoreUnavailable, match=refusal):
        async with database():
            pass
    assert database.query("SELECT version FROM recoveryd_schema") == [(newer,)]


async def test_a_server_that_cannot_be_reached_is_reported_without_the_password() -> None:
    """Nothing listening: StoreUnavailable at open, naming the store, not its password."""
    url = "postgresql://recoveryd:s3cret@127.0.0.1:1/recoveryd"
    with pytest.raises(StoreUnavailable, match="cannot open the PostgreSQL store") as refused:
        async with OpenStore(url)(connect_timeout=1.0):
            pass
    assert without_credentials(url) in str(refused.value)
    assert "s3cret" not in str(refused.value)


async def test_a_server_that_refuses_says_why_not_only_that_it_timed_out() -> None:
    """The server's own reason (nothing listening), not the pool's "initialization
    incomplete": what a person can act on."""
    with pytest.raises(StoreUnavailable) as refused:
        async with OpenStore("postgresql://recoveryd@127.0.0.1:1/recoveryd")(connect_timeout=1.0):
            pass
    assert "Connection refused" in str(refused.value)
    assert "pool initialization incomplete" not in str(refused.value)


def connections_made(listening: socket.socket) -> int:
    """How many connections `listening` has queued, none accepted before: each accepted
    now, and closed."""
    listening.setblocking(False)
    made = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            listening.accept()[0].close()
            made += 1
    return made


async def test_a_server_that_never_answers_is_waited_for_once() -> None:
    """A server that takes the connection and says nothing: the open gives up after its
    connect timeout, in the words of the pool's one try, and makes no other."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; no more
        url = f"postgresql://recoveryd@127.0.0.1:{silent.getsockname()[1]}/x"
        with pytest.raises(StoreUnavailable) as refused:
            async with OpenStore(url)(connect_timeout=1.0):
                pass
        assert connections_made(silent) == 1
    assert "connection timeout expired" in str(refused.value)


async def test_a_database_that_does_not_exist_is_named(postgres_url: str) -> None:
    """A database missing on a server that answers: the server says which."""
    url = postgres_url.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(StoreUnavailable, match='database "no_such_database" does not exist'):
        async with OpenStore(url)(connect_timeout=5.0, create=False):
            pass


async def test_concurrent_claims_never_lease_a_dlq_id_to_two_owners(database: OpenStore) -> None:
    """500 callbacks, three stores with two workers each claiming 7 at a time until none
    is left: every dlqId leased once (its first try), to the owner the database names."""
    dlq_ids = [f"d-{number:03}" for number in range(500)]
    async with replicas(database) as stores:
        await received(stores[0], *dlq_ids, at=NOW)
        workers = [
            claimed_until_none_left(store, f"replica-{n}-worker-{k}")
            for n, store in enumerate(stores)
            for k in range(2)
        ]
        leased = [item for found in await asyncio.gather(*workers) for item in found]
        leased += await claimed_until_none_left(stores[0], "late")  # any a locked row hid
    assert sorted(dlq_id for dlq_id, _, _ in leased) == dlq_ids
    assert {tries for _, _, tries in leased} == {1}
    owners = {dlq_id: owner for dlq_id, owner, _ in leased}
    assert dict(database.query("SELECT dlq_id, lease_owner FROM callbacks")) == owners
    assert len(set(owners.values())) > 3  # the workers really did share the work


async def test_a_dlq_id_given_to_two_replicas_at_once_is_accepted_by_one(
    database: OpenStore,
) -> None:
    """200 dlqIds, each delivered to two stores at the same moment (in opposite orders):
    for each, one `accepted` and one `duplicate`, and the body kept is the accepted one's."""
    dlq_ids = [f"d-{number:03}" for number in range(200)]
    async with replicas(database, 2) as (first, second):
        adds = [
            *(first.add_callback(callback(dlq_id, NOW, b"first")) for dlq_id in dlq_ids),
            *(second.add_callback(callback(dlq_id, NOW, b"second")) for dlq_id in dlq_ids[::-1]),
        ]
        answers = await asyncio.gather(*adds)
    by_first, by_second = answers[:200], answers[200:][::-1]
    assert [sorted(pair) for pair in zip(by_first, by_second, strict=True)] == [
        ["accepted", "duplicate"]
    ] * 200
    kept = dict(database.query("SELECT dlq_id, body FROM callbacks"))
    assert {dlq_id: bytes(body) for dlq_id, body in kept.items()} == {
        dlq_id: b"first" if answer == "accepted" else b"second"
        for dlq_id, answer in zip(dlq_ids, by_first, strict=True)
    }


async def test_replicas_batching_the_same_dlq_ids_put_each_in_one_batch(
    database: OpenStore,
) -> None:
    """Three stores open batches over the same 300 decided dlqIds at once, in chunks of
    other sizes that overlap: each dlqId ends in exactly one batch."""
    dlq_ids = [f"d-{number:03}" for number in range(300)]

    async def batches(store: Store, size: int) -> list[tuple[str, ...]]:
        chunks = [dlq_ids[start : start + size] for start in range(0, len(dlq_ids), size)]
        opened = [await store.open_batch(ACTION, OVERRIDES, chunk, NOW) for chunk in chunks]
        return [record.dlq_ids for record in opened if record is not None]

    async with replicas(database) as stores:
        await settled(stores[0], dlq_ids, "decided", now=NOW)
        found = await asyncio.gather(
            *(batches(store, size) for store, size in zip(stores, (10, 7, 4), strict=True))
        )
        assert await stores[1].pending() == []
    assert sorted(dlq_id for each in found for ids in each for dlq_id in ids) == dlq_ids
    stored = database.query("SELECT dlq_ids FROM batches")
    assert sorted(dlq_id for (ids,) in stored for dlq_id in ids) == dlq_ids
    assert database.query(COUNTED) == [("batched", 300)]


async def test_counts_by_state_stay_exact_under_replicas_writing_at_once(
    database: OpenStore,
) -> None:
    """Three stores ingesting, claiming, settling into every state, batching, sending and
    pruning at once (one redriving too): each store's counts are the full scan's."""

    async def churn(store: Store, n: int) -> None:
        owner = f"replica-{n}"
        for round_ in range(6):
            await received(store, *(f"{n}-{round_}-{i}" for i in range(40)), at=NOW)
            claimed = await store.claim(owner, 30, 60.0, NOW)
            outcomes = [
                Outcome(item.dlq_id, MOVES[k % len(MOVES)], rule="rule-a", action=ACTION,
                        overrides=OVERRIDES, retry_at=NOW)
                for k, item in enumerate(claimed)
            ]  # fmt: skip
            decided = [item.dlq_id for item in (await store.settle(owner, outcomes, NOW)).decided]
            record = await store.open_batch(ACTION, OVERRIDES, decided[::2], NOW)
            if record is not None and round_ % 2:  # the others stay batched
                ids = record.dlq_ids
                await store.settle_batch(record.id, done=ids[::2], again=ids[1::2], sent=True,
                                         now=NOW)  # fmt: skip
            if round_ in (1, 3):  # not the last: some of every final state stay
                await store.prune(before=NOW + 1, now=NOW, dedup_for=DAY, chunk=9)
            if n == 0 and round_ == 2:
                await store.redrive(states=("failed",), now=NOW, apply=True)

    async with replicas(database) as stores:
        await asyncio.gather(*(churn(store, n) for n, store in enumerate(stores)))
        counts = [nonzero(await store.status(NOW)) for store in stores]
    expected = dict(database.query(COUNTED))
    assert len(expected) == 8  # the work really moved dlqIds through every state
    assert counts == [expected] * 3


async def test_a_write_held_up_by_a_lock_is_refused_in_time_and_stored_once_after(
    database: OpenStore,
) -> None:
    """Another session holds a lock that inserts wait for: the callback is refused at
    commit_timeout (the service will retry), the store says it is unavailable; once the
    lock goes, the retry is taken (accepted, or a duplicate if the first commit landed)
    and the callback is stored once."""
    async with database(commit_timeout=0.3, health_interval=0.1) as store:
        with psycopg.connect(database.url) as blocker:
            blocker.execute("LOCK TABLE callbacks IN EXCLUSIVE MODE")
            # The refusal says why. `problems()` is not polled for: the server answers the
            # health check's query while the table is held, so the problem it names may
            # be cleared before a test could look.
            with pytest.raises(StoreUnavailable, match="did not commit in time"):
                await store.add_callback(callback("d-1", NOW))
            blocker.rollback()
        assert await retried(store, callback("d-1", NOW)) in ("accepted", "duplicate")
        assert await cleared_within(store)
        assert await store.inbox_depth() == 1
    assert database.query("SELECT count(*) FROM callbacks") == [(1,)]


@pytest.fixture
def own_server() -> Iterator[postgres.Cluster]:
    """A server of this test's own, to stop and start (the shared one serves others)."""
    system_tools.require("postgres")
    with postgres.own_cluster() as server:
        yield server


async def test_the_server_going_away_makes_the_store_unavailable_until_it_is_back(
    own_server: postgres.Cluster,
) -> None:
    """The server killed under an open store: callbacks and claims are refused with
    StoreUnavailable and `problems()` names the store; started again, the store recovers
    by itself, with every commit made before the crash, and takes writes again."""
    options = {"commit_timeout": 1.0, "read_timeout": 1.0, "health_interval": 0.2}
    with postgres.fresh_database(own_server.url) as url:
        database = OpenStore(url)
        async with database(**options) as store:
            await received(store, *(f"d-{number}" for number in range(20)), at=NOW)
            leased = {item.dlq_id for item in await store.claim(OWNER, 5, 600.0, NOW)}
            own_server.stop()

            with pytest.raises(StoreUnavailable):
                await store.add_callback(callback("during", NOW))
            with pytest.raises(StoreUnavailable):
                await store.claim(OWNER, 100, 600.0, NOW)
            [problem] = await problems_within(store)
            assert f"the PostgreSQL store {without_credentials(url)} is unavailable" in problem

            own_server.start()
            assert await cleared_within(store, 15.0), store.problems()
            assert await store.add_callback(callback("after", NOW)) == "accepted"
            claimed = {item.dlq_id for item in await store.claim(OWNER, 100, 600.0, NOW)}
            assert claimed == {f"d-{number}" for number in range(20)} - leased | {"after"}
            assert await store.get_callback("during") is None
            assert store.problems() == []


async def test_no_rotation_begins_while_an_operators_token_is_saved(database: OpenStore) -> None:
    """`recoveryd set-token` saves under a lock that a rotation's record waits on: the
    rotation begins once the token is saved (its reset then replaces it, and its save
    wins), never between the check and the save; once one is under way, none is saved."""
    async with replicas(database, 2) as (saving, rotating):
        entered, release = threading.Event(), threading.Event()

        def write() -> None:  # the credentials file's write, held
            entered.set()
            release.wait(30)

        saved = asyncio.create_task(saving.unless_rotating(write))
        assert await asyncio.to_thread(entered.wait, 30)
        begun = asyncio.create_task(rotating.begin_rotation(NOW))
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'rotations'::regclass"
        )
        await eventually(lambda: database.query(waiting) == [(1,)], what="the rotation, waiting")
        assert not begun.done()
        release.set()
        assert await saved is True
        assert await begun is not None

        def refused() -> None:
            raise AssertionError("saved while a rotation is under way")

        assert await saving.unless_rotating(refused) is False
