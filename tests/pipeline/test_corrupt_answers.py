"""Answers the client cannot decode (a corrupt gzip body from a proxy) on each operation:
no task dies, readiness stays, and work resumes with every dlqId recovered once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.account.support import RESET, rotation_settings
from tests.pipeline.support import RESUME_ALL, harness, sent_per_dlq_id
from tests.support import workflows


async def test_corrupt_answers_to_fetches_and_bulk_calls_kill_no_task(tmp_path: Path) -> None:
    """Fetches and bulk calls answered with corrupt gzip (the bulk call carried out by
    the service all the same): every dlqId is done, each run made once, no crash."""
    async with harness(tmp_path, RESUME_ALL) as h:
        dlq_ids = await h.seed(workflows(30))
        await h.fault(kind="corrupt_gzip", times=12, paths=["/v2/dlq/"])
        await h.fault(kind="corrupt_gzip", times=2, paths=["/v2/workflows/"])
        await h.send_callbacks(dlq_ids)

        assert await h.settled(30, seconds=60) == {"done": 30}

        sources = Counter(run["sourceDlqId"] for run in await h.runs())
        assert sources == Counter(dict.fromkeys(dlq_ids, 1))
        journal = await h.journal()
        assert sum(call.get("fault") == "corrupt_gzip" for call in journal) == 14
        assert sent_per_dlq_id(journal).keys() == set(dlq_ids)
        crashes = [
            sample.value
            for family in h.recoveryd.registry.collect()
            if family.name == "recoveryd_task_crashes"
            for sample in family.samples
        ]
        assert crashes  # a series a task,
        assert not any(crashes)  # each at 0
        assert (await h.recoveryd.public.get("/readyz")).status_code == 200


async def test_a_corrupt_answer_to_the_token_reset_is_checked_not_fatal(tmp_path: Path) -> None:
    """The reset's answer cannot be read (the service did not act on it): the rotation
    ends in `failure` after a check of the token, the daemon keeps working, and the next
    rotation succeeds."""
    settings = rotation_settings(tmp_path / "credentials.json")
    async with harness(tmp_path, RESUME_ALL, **settings) as h:
        await h.fault(kind="corrupt_gzip", times=1, paths=[RESET], carriedOut=False)

        first = await h.recoveryd.admin.post("/-/rotate-token", timeout=30)
        assert first.status_code == 502
        assert first.json()["rotation"]["result"] == "failure"

        second = await h.recoveryd.admin.post("/-/rotate-token", timeout=30)
        assert second.status_code == 200
        dlq_ids = await h.seed(workflows(3))
        await h.send_callbacks(dlq_ids)
        assert await h.settled(3) == {"done": 3}
        assert (await h.recoveryd.public.get("/readyz")).status_code == 200
