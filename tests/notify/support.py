"""A webhook for the notify tests: a real HTTP receiver on loopback, on its own thread (as
another machine would be), that answers as a test scripts it and records every request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from daemon.http.serving import serve_in_thread
from daemon.notify.delivery import NotifyTiming

# Short but real waits: an attempt times out in a second, retries come within 200 ms.
FAST_NOTIFY = NotifyTiming(
    timeout=1.0, base=0.05, cap=0.2, max_attempts=6, max_age=60.0, poll=0.05, drain=1.0
)


@dataclass
class Delivery:
    """One request the receiver got. `status` is what it answered, set right before the
    answer went out; None while it is held, or when the caller hung up first."""

    key: str | None
    body: dict[str, Any]
    headers: dict[str, str]
    at: float
    status: int | None = None
    hung_up: bool = False  # the caller went before it was answered


@dataclass
class Receiver:
    """Answers 500 to the first `failures` requests of each Idempotency-Key, then 200;
    while `holding` is set, holds every request that would be answered 200 (a receiver
    that hangs) until it is cleared or the caller hangs up. `answer_first` lets that many
    keys be answered before the holding starts."""

    failures: int = 0
    holding: threading.Event = field(default_factory=threading.Event)
    answer_first: int = 0
    deliveries: list[Delivery] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/hook", self._hook, methods=["POST"])])

    async def _hook(self, request: Request) -> Response:
        key = request.headers.get("idempotency-key")
        entry = Delivery(key, json.loads(await request.body()), dict(request.headers), time.time())
        with self._lock:
            seen = sum(1 for earlier in self.deliveries if earlier.key == key)
            self.deliveries.append(entry)
            answered = {d.key for d in self.deliveries if d.status and d.status < 300}
        status = 500 if seen < self.failures else 200
        if status == 200 and len(answered) >= self.answer_first:
            while self.holding.is_set():
                if await request.is_disconnected():
                    entry.hung_up = True  # nobody to answer: its status stays None
                    return Response(status_code=499)
                await asyncio.sleep(0.02)
        entry.status = status
        return Response(status_code=status)

    def answered_ok(self) -> Counter[str | None]:
        """How many requests of each Idempotency-Key were answered 2xx."""
        with self._lock:
            return Counter(d.key for d in self.deliveries if d.status and 200 <= d.status < 300)

    def keys_of(self, dlq_id: str) -> set[str | None]:
        """The Idempotency-Keys the requests for `dlq_id` carried."""
        with self._lock:
            return {d.key for d in self.deliveries if d.body.get("dlqId") == dlq_id}

    def attempts_of(self, dlq_id: str) -> list[int | None]:
        """What each request for `dlq_id` was answered, in order."""
        with self._lock:
            return [d.status for d in self.deliveries if d.body.get("dlqId") == dlq_id]

    def held(self) -> int:
        with self._lock:
            return sum(1 for d in self.deliveries if d.status is None and not d.hung_up)


@contextlib.contextmanager
def receiving(receiver: Receiver) -> Iterator[str]:
    """`receiver` served on loopback; yields its webhook URL."""
    with serve_in_thread(receiver.app()) as url:
        try:
            yield f"{url}/hook"
        finally:
            receiver.holding.clear()  # let held requests end, so the server can stop


def notify_rule(name: str, url: str, *, match: str = "{}", more: str = "") -> str:
    """A notify rule of a rules file, as YAML."""
    return (
        f"  - name: {name}\n    match: {match}\n    action: notify\n"
        f'    notify: {{url: "{url}"}}\n{more}'
    )
