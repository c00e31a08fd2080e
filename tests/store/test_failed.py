"""The dlqIds a commit made `failed`, as the store answers them for
recoveryd_dlq_ids_failed_total: each named once, by the commit that moved it, with its rule."""

from __future__ import annotations

from daemon.store.records import Notice, NotificationResult, Outcome
from tests.store.support import OWNER, OpenStore, batched, received

NOW = 5_000.0


async def test_a_fetch_settle_names_the_failed_it_recorded(open_store: OpenStore) -> None:
    """Fetches refused for good: named with no rule (none decided them). An outcome whose
    lease another worker holds now is not recorded, so not named."""
    async with open_store() as store:
        await received(store, "d-1", "d-2", at=NOW)
        await store.claim(OWNER, 2, 60.0, NOW)
        lost = await store.settle("another-worker", [Outcome("d-1", "failed")], NOW)
        settled = await store.settle(
            OWNER, [Outcome("d-1", "failed", reason="400"), Outcome("d-2", "failed")], NOW
        )
    assert lost.failed == []
    assert settled.failed == [("d-1", ""), ("d-2", "")]


async def test_a_batch_settle_names_only_the_dlq_ids_it_moved(open_store: OpenStore) -> None:
    """A rejected batch's dlqIds, with their rules; settled again (another replica, a
    check after a restart) the batch moves nothing and names none, and a dlqId no longer
    batched is not named either."""
    async with open_store() as store:
        first = await batched(store, ["d-1", "d-2"], now=NOW)
        settled = await store.settle_batch(
            first.id, failed=["d-1"], again=["d-2"], reason="400", sent=True, now=NOW
        )
        twice = await store.settle_batch(first.id, failed=["d-1", "d-2"], sent=True, now=NOW)
        second = await store.open_batch("resume", "{}", ["d-2"], NOW + 1)
        assert second is not None
        later = await store.settle_batch(
            second.id, failed=["d-1", "d-2"], reason="400", sent=True, now=NOW + 1
        )
    assert settled.failed == [("d-1", "rule-a")]
    assert [pending.dlq_id for pending in settled.decided] == ["d-2"]
    assert twice.failed == []
    assert later.failed == [("d-2", "rule-a")]


async def test_a_notification_given_up_says_it_failed_the_dlq_id_its_rule_decided(
    open_store: OpenStore,
) -> None:
    """True for the notify rule's own dlqId ending failed, once; False for one whose dlqId
    another rule decided (a line in its history only), and for one sent."""
    page = Notice("page", "https://hooks.example.com/x", "https://hooks.example.com", "k", "{}")
    async with open_store() as store:
        await received(store, "own", "other", "sent", at=NOW)
        await store.claim(OWNER, 3, 60.0, NOW)
        await store.settle(
            OWNER,
            [
                Outcome("own", "done", rule="page", action="notify", notifications=(page,)),
                Outcome("sent", "done", rule="page", action="notify", notifications=(page,)),
                Outcome(
                    "other", "decided", rule="resume-all", action="resume", overrides="{}",
                    notifications=(page,),
                ),
            ],
            NOW,
        )  # fmt: skip
        jobs = {job.dlq_id: job.id for job in await store.due_notifications(NOW, 10)}

        async def finish(dlq_id: str, result: NotificationResult) -> bool:
            return await store.finish_notification_attempt(
                jobs[dlq_id], result, status=410, reason="gone", next_at=None, now=NOW
            )

        assert await finish("own", "failed") is True
        assert await finish("own", "failed") is False  # ended already: nothing moves
        assert await finish("other", "failed") is False
        assert await finish("sent", "sent") is False
