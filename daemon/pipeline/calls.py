"""Every service call counted and timed, and credited to the dlqId or batch it was for.

The client reports each attempt to one observer. Which dlqId (or batch) a call is for
is known only to the task that makes it, so that task opens `recording()`: a context
variable, which asyncio copies into the task and nothing else sees.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from daemon.metrics import Metrics
from daemon.upstream import CallRecord

_recording: ContextVar[list[dict[str, Any]] | None] = ContextVar("recoveryd_calls", default=None)


@contextlib.contextmanager
def recording() -> Iterator[list[dict[str, Any]]]:
    """Collect, as JSON, the calls this task makes inside the block."""
    calls: list[dict[str, Any]] = []
    token = _recording.set(calls)
    try:
        yield calls
    finally:
        _recording.reset(token)


def observer(
    metrics: Metrics, wall_clock: Callable[[], float] = time.time
) -> Callable[[CallRecord], None]:
    """The client's `observe`: metrics for every call, and the record for `recording()`."""

    def observe(call: CallRecord) -> None:
        metrics.upstream_calls.labels(call.operation, call.outcome).inc()
        metrics.upstream_seconds.labels(call.operation).observe(call.seconds)
        calls = _recording.get()
        if calls is not None:
            calls.append({**call.to_json(), "at": wall_clock()})

    return observe
