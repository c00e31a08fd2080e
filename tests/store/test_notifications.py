"""The notifications' outbox in the store: queued with the decision, once per
(dlqId, rule), never pruned while pending, gone with their dlqId."""

from __future__ import annotations

from daemon.store import Store
from daemon.store.records import Notice, NotificationResult, Outcome
from tests.store.support import OWNER, OpenStore, received

NOW = 100_000.0
DAY = 86_400.0


def notice(rule: str = "page", receiver: str = "https://hooks.example.com") -> Notice:
    return Notice(rule, f"{receiver}/secret-path", receiver, f"key-{rule}", '{"event":"x"}')


async def decided(store: Store, dlq_id: str, *notices: Notice, now: float = NOW) -> None:
    """`dlq_id` received and decided by a notify rule, with `notices` queued."""
    await received(store, dlq_id, at=now)
    [claimed] = await store.claim(OWNER, 1, 60.0, now)
    assert claimed.dlq_id == dlq_id
    outcome = Outcome(
        dlq_id, "done", reason="queued", rule="page", action="notify", notifications=notices
    )
    await store.settle(OWNER, [outcome], now)


ROWS = "SELECT dlq_id, rule, state FROM notifications ORDER BY id"


async def test_a_decision_queues_its_notifications_in_the_same_commit(
    open_store: OpenStore,
) -> None:
    """Settled with two notices: both due at once, each for its own rule."""
    async with open_store() as store:
        await decided(store, "d-1", notice("page"), notice("audit", "https://audit.example.com"))
        due = await store.due_notifications(NOW, 10)
        status = await store.status(NOW)
    assert [(job.dlq_id, job.rule, job.attempts) for job in due] == [
        ("d-1", "page", 0),
        ("d-1", "audit", 0),
    ]
    assert status["notifications"] == {"pending": 2}


async def test_an_outcome_whose_lease_was_lost_queues_nothing(open_store: OpenStore) -> None:
    """A worker that no longer holds the dlqId records nothing, notifications included."""
    async with open_store() as store:
        await received(store, "d-1", at=NOW)
        await store.claim(OWNER, 1, 60.0, NOW)
        outcome = Outcome("d-1", "done", rule="page", action="notify", notifications=(notice(),))
        await store.settle("another-worker", [outcome], NOW)
        assert await store.due_notifications(NOW, 10) == []


async def test_a_busy_receiver_is_left_out_and_the_others_come_first(open_store: OpenStore) -> None:
    """`skip_receivers`: none of theirs, even when theirs are due longer."""
    async with open_store() as store:
        for number in range(3):
            await decided(store, f"slow-{number}", notice(receiver="https://slow"), now=NOW)
        await decided(store, "fast", notice(receiver="https://fast"), now=NOW + 1)
        due = await store.due_notifications(NOW + 1, 2, skip_receivers=["https://slow"])
    assert [job.dlq_id for job in due] == ["fast"]


async def test_an_attempt_is_counted_and_rescheduled_before_it_goes_out(
    open_store: OpenStore,
) -> None:
    """begin: attempt 1, not due until its retry time (a crash then waits for it);
    finish retry: due at next_at; finish sent: never due again."""
    async with open_store() as store:
        await decided(store, "d-1", notice())
        [job] = await store.due_notifications(NOW, 10)
        assert await store.begin_notification_attempt(job.id, NOW, NOW + 5) == 1
        assert await store.due_notifications(NOW + 4, 10) == []
        assert [j.attempts for j in await store.due_notifications(NOW + 5, 10)] == [1]
        await store.finish_notification_attempt(
            job.id, "retry", status=503, reason="answered 503", next_at=NOW + 2, now=NOW + 1
        )
        assert [j.id for j in await store.due_notifications(NOW + 2, 10)] == [job.id]
        assert await store.begin_notification_attempt(job.id, NOW + 2, NOW + 9) == 2
        await store.finish_notification_attempt(
            job.id, "sent", status=200, reason="answered 200", next_at=None, now=NOW + 3
        )
        assert await store.due_notifications(NOW + 100, 10) == []
        assert await store.begin_notification_attempt(job.id, NOW + 100, NOW + 101) is None
        record = await store.record("d-1")
    assert record is not None
    [shown] = record["notifications"]
    assert shown["state"] == "sent"
    assert shown["attempts"] == 2
    assert shown["lastStatus"] == 200
    assert "secret-path" not in str(record)
    assert record["reason"] == "rule page notified https://hooks.example.com"


async def test_deciding_again_neither_duplicates_nor_resends(open_store: OpenStore) -> None:
    """A dlqId decided again (redriven) with its notification sent: still one row, sent.
    One that failed is queued again, its attempts starting over."""
    async with open_store() as store:
        await decided(store, "sent", notice())
        await decided(store, "failed", notice())
        ends: list[tuple[str, NotificationResult]] = [("sent", "sent"), ("failed", "failed")]
        for dlq_id, result in ends:
            [job] = [j for j in await store.due_notifications(NOW, 10) if j.dlq_id == dlq_id]
            await store.begin_notification_attempt(job.id, NOW, NOW + 1)
            await store.finish_notification_attempt(
                job.id, result, status=None, reason="r", next_at=None, now=NOW
            )
        assert (await store.record("failed") or {})["state"] == "failed"
        redriven = await store.redrive(states=["done", "failed"], now=NOW + 1, apply=True)
        assert redriven == ["failed", "sent"]
        claimed = await store.claim(OWNER, 2, 60.0, NOW + 2)
        outcomes = [
            Outcome(item.dlq_id, "done", rule="page", action="notify", notifications=(notice(),))
            for item in claimed
        ]
        await store.settle(OWNER, outcomes, NOW + 2)
        due = await store.due_notifications(NOW + 2, 10)
    assert [(job.dlq_id, job.attempts) for job in due] == [("failed", 0)]
    assert open_store.query(ROWS) == [("sent", "page", "sent"), ("failed", "page", "pending")]


async def test_a_pending_notification_keeps_its_record_and_the_rest_go_with_theirs(
    open_store: OpenStore,
) -> None:
    """Pruning: a final record whose notification is pending stays (pending work); one
    whose notification ended is pruned, and its notification with it."""
    async with open_store() as store:
        await decided(store, "pending", notice(), now=NOW - 10)
        await decided(store, "ended", notice(), now=NOW - 10)
        [job] = [j for j in await store.due_notifications(NOW, 10) if j.dlq_id == "ended"]
        await store.begin_notification_attempt(job.id, NOW - 10, NOW)
        await store.finish_notification_attempt(
            job.id, "sent", status=200, reason="answered 200", next_at=None, now=NOW - 10
        )
        assert await store.prune(before=NOW, now=NOW, dedup_for=DAY) == 1
        assert await store.record("pending") is not None
        assert await store.record("ended") is None
    assert open_store.query(ROWS) == [("pending", "page", "pending")]
