"""recoveryd's listener and receiver with a store that keeps nothing: bench.ingest's
ceiling row.

The CallbackReceiver that `recoveryd serve` runs on `/callbacks` (the token checked from
the headers, the body read and its hash checked, the callback parsed, the metrics, the
answer), behind the HTTP protocol of recoveryd's public listener (daemon.http.listener: its
limits on header size, deadlines and connections, at their defaults), served by
daemon.http.serving as `recoveryd serve` serves it, but its store answers "accepted" at once
and keeps nothing. So its rate is the most that any store could give recoveryd on this
machine, and the gap between it and the bare app is the work recoveryd does before it
stores. It stores nothing: a figure to compare, never a way to run recoveryd. Any other
path answers as the bare app does, for the bench's readiness check.

Run: python -m bench.receiver_only --port P, with BENCH_RECEIVER_KEY (the signing key)
and BENCH_RECEIVER_ISSUER in the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import uvloop
from prometheus_client import CollectorRegistry

from bench.baselines import bare_app
from daemon.foundation.logs import configure_logging
from daemon.http.listener import limited_protocol
from daemon.http.serving import bind, serve_until_stopped
from daemon.ingest.protocol import callback_protocol
from daemon.ingest.receiver import CallbackReceiver, Receive, Scope, Send
from daemon.ingest.signature import Verifier
from daemon.metrics import Metrics
from daemon.settings import ListenerLimits
from daemon.store import Added, Callback


class _KeepsNothing:
    def add_callback(self, callback: Callback) -> asyncio.Future[Added]:
        kept: asyncio.Future[Added] = asyncio.get_running_loop().create_future()
        kept.set_result("accepted")
        return kept


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    # Served as `recoveryd serve` serves its public listener, on uvloop as it runs.
    protocol = limited_protocol(
        ListenerLimits(), "public", lambda reason: None, callback_protocol(_receiver)
    )
    uvloop.run(serve_until_stopped([(app, bind(args.host, args.port), protocol)]))


if __name__ == "__main__":
    main()
