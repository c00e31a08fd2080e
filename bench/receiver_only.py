"""recoveryd's receiver with a store that keeps nothing: bench.ingest's ceiling row.

The CallbackReceiver that `recoveryd serve` runs on `/callbacks` (the token checked from
the headers, the body read and its hash checked, the callback parsed, the metrics, the
answer), under the uvicorn settings of the bare app, but its store answers "accepted" at
once and keeps nothing. So its rate is the most that any store could give recoveryd on
this machine, and the gap between it and the bare app is the receiver's own work. It
stores nothing: a figure to compare, never a way to run recoveryd. Any other path
answers as the bare app does, for the bench's readiness check. Configured by environment:
BENCH_RECEIVER_KEY (the signing key), BENCH_RECEIVER_ISSUER.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry

from bench.baselines import bare_app
from daemon.ingest.receiver import CallbackReceiver, Receive, Scope, Send
from daemon.ingest.signature import Verifier
from daemon.logs import configure_logging
from daemon.metrics import Metrics
from daemon.store import Added, Callback


class _KeepsNothing:
    async def add_callback(self, callback: Callback) -> Added:
        return "accepted"


configure_logging("json")  # as recoveryd serve logs: debug lines are dropped, not written
_ISSUER = os.environ.get("BENCH_RECEIVER_ISSUER", "Service")
_receiver = CallbackReceiver(
    store=_KeepsNothing(),  # type: ignore[arg-type]  # add_callback is all the receiver uses
    metrics=Metrics(CollectorRegistry()),
    verifier=Verifier((os.environ.get("BENCH_RECEIVER_KEY", "").encode(),), _ISSUER),
    allow_unsigned=False,
    header_prefix=_ISSUER,
    max_body_bytes=1024 * 1024,  # RECOVERYD_MAX_BODY_BYTES' default
)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "http" and scope["path"] == "/callbacks":
        await _receiver(scope, receive, send)
    else:  # the bench's readiness check
        await bare_app(scope, receive, send)
