"""Deliver notifications: post each due one to its receiver, record what came of it.

One dispatcher asks the store for due notifications and starts an attempt for each,
at most `per_receiver` at a time to one receiver (scheme, host and port) and
`concurrency` in all. A receiver at its limit is left out of the next ask, so one that
is down or slow holds up its own notifications only. Every attempt is counted in the
store before it goes out, with the time it is due again should its outcome be lost
(`begin_notification_attempt`), and its outcome recorded right after the answer.

The receiver is the user's webhook, not the service: its own HTTP client, none of the
service client's rate limit, retries or circuit breakers.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import httpx
import structlog

from daemon import __version__
from daemon.metrics import NOTIFIED, Metrics
from daemon.notify.delivery import (
    NotifyTiming,
    Verdict,
    judge_answer,
    judge_error,
    next_step,
    retry_delay,
)
from daemon.runtime.supervisor import Supervisor
from daemon.store import Store, StoreUnavailable
from daemon.store.backoff import StoreBackoff
from daemon.store.records import NotificationJob

log = structlog.get_logger(__name__)
USER_AGENT = f"recoveryd/{__version__}"
# An attempt runs in a task of its own, not supervised (its notification stays pending
# in the store): a crash is counted under this task name.
ATTEMPT_TASK = "notify"


class Notifier:
    def __init__(
        self,
        store: Store,
        http: httpx.AsyncClient,
        metrics: Metrics,
        *,
        timing: NotifyTiming | None = None,
        supervisor: Supervisor | None = None,
        wall_clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """`http` is the notifier's own client (redirects not followed); each attempt is
        also bounded as a whole by `timing.timeout`, so a receiver that trickles its
        answer cannot hold a slot."""
        self._store = store
        self._http = http
        self._metrics = metrics
        self._timing = timing or NotifyTiming()
        self._supervisor = supervisor or Supervisor(metrics)
        self._wall_clock = wall_clock
        self._rand = rand
        self._busy: Counter[str] = Counter()  # attempts under way, by receiver
        self._under_way: set[int] = set()  # notification ids
        self._tasks: set[asyncio.Task[None]] = set()
        self._wakeup = asyncio.Event()
        self._stopping = False

    def wake(self) -> None:
        """Something may be due (an attempt ended, a notification was queued)."""
        self._wakeup.set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        dispatcher = self._supervisor.spawn("notifier", self._run)
        self._metrics.task_crashes.labels(ATTEMPT_TASK)  # at 0 from now on, as the notifier's
        try:
            yield
        finally:
            # Attempts under way get `drain` seconds; one cut short is due again after its
            # backoff, with the same Idempotency-Key.
            self._stopping = True
            self._wakeup.set()
            await asyncio.wait([dispatcher, *self._tasks], timeout=self._timing.drain)
            tasks = [dispatcher, *self._tasks]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        backoff = StoreBackoff("notifier")
        while not self._stopping:
            try:
                await self._dispatch()
            except StoreUnavailable as exc:
                await backoff.pause(exc)
                continue
            backoff.reset()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timing.poll):
                    await self._wakeup.wait()
            self._wakeup.clear()

    async def _dispatch(self) -> None:
        """Start an attempt for every due notification there is room for."""
        timing = self._timing
        while not self._stopping and len(self._under_way) < timing.concurrency:
            full = sorted(name for name, n in self._busy.items() if n >= timing.per_receiver)
            room = timing.concurrency - len(self._under_way)
            # Those under way may be due again already (an attempt can outlast its backoff):
            # asking for that many more leaves room for the others all the same.
            limit = room + len(self._under_way)
            due = await self._store.due_notifications(self._wall_clock(), limit, full)
            started = 0
            for job in due:
                if len(self._under_way) >= timing.concurrency:
                    break
                if job.id in self._under_way or self._busy[job.receiver] >= timing.per_receiver:
                    continue
                self._start(job)
                started += 1
            if not started:
                return

    def _start(self, job: NotificationJob) -> None:
        self._under_way.add(job.id)
        self._busy[job.receiver] += 1
        task = asyncio.create_task(self._attempt(job), name=f"recoveryd-notify-{job.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _attempt(self, job: NotificationJob) -> None:
        try:
            await self._deliver(job)
        except StoreUnavailable as exc:
            # The notification stays pending in the store and is due again at the
            # retry time written before the attempt: nothing is lost.
            log.warning("notification outcome not recorded; it will be attempted again",
                        dlq_id=job.dlq_id, rule=job.rule, error=str(exc))  # fmt: skip
        except Exception as exc:  # one attempt's bug must not stop the others
            self._metrics.task_crashes.labels(ATTEMPT_TASK).inc()
            log.error("notification attempt crashed; it will be attempted again",
                      dlq_id=job.dlq_id, rule=job.rule, error_type=type(exc).__name__,
                      error=str(exc)[:300], exc_info=exc)  # fmt: skip
        finally:
            self._under_way.discard(job.id)
            self._busy[job.receiver] -= 1
            if self._busy[job.receiver] <= 0:
                del self._busy[job.receiver]
            self.wake()

    async def _deliver(self, job: NotificationJob) -> None:
        timing = self._timing
        now = self._wall_clock()
        # Written before the request goes out: should its outcome be lost (a crash, the
        # store down), the notification is due again after this backoff, not at once.
        retry_at = now + retry_delay(job.attempts + 1, timing, self._rand)
        attempt = await self._store.begin_notification_attempt(job.id, now, retry_at)
        if attempt is None:
            return  # no longer pending
        verdict = await self._post(job)
        now = self._wall_clock()
        step = next_step(verdict, attempt, job.queued_at, now, timing, self._rand)
        made_failed = await self._store.finish_notification_attempt(
            job.id, step.result, status=verdict.status, reason=step.reason,
            next_at=step.next_at, now=now,
        )  # fmt: skip
        self._metrics.notifications.labels(job.rule, NOTIFIED[step.result]).inc()
        if made_failed:
            self._metrics.count_failed("notify_failed", [job.rule])
        context = {"dlq_id": job.dlq_id, "rule": job.rule, "receiver": job.receiver,
                   "attempt": attempt, "status": verdict.status}  # fmt: skip
        if step.result == "sent":
            log.info("notification sent", **context)
        elif step.result == "retry":
            assert step.next_at is not None
            # A receiver that is down fails many at once: the log's repeat filter folds
            # these into one line a minute with a count (daemon/foundation/logs.py).
            log.warning("notification not delivered; will try again", reason=step.reason,
                        in_seconds=round(step.next_at - now, 3), **context)  # fmt: skip
        else:
            log.error("notification failed; giving up", reason=step.reason, **context)

    async def _post(self, job: NotificationJob) -> Verdict:
        """One POST of the summary; whatever goes wrong becomes a verdict (at this
        boundary, so that every failure counts against the attempts and ends somewhere)."""
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": job.key,
            "User-Agent": USER_AGENT,
        }
        try:
            async with asyncio.timeout(self._timing.timeout):
                # The body is not read: only the status says what became of the post.
                async with self._http.stream(
                    "POST", job.url, content=job.payload.encode(), headers=headers
                ) as response:
                    retry_after = response.headers.get("retry-after")
                    return judge_answer(response.status_code, retry_after, self._wall_clock())
        except Exception as exc:
            return judge_error(exc)
