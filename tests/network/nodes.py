"""The programs the network tests run inside a namespace (`ip netns exec NS python -m
tests.network.nodes ROLE ...`): the emulator, recoveryd with short timings, and the
service's side of the callbacks, which sends them and retries those not answered 2xx.

The emulator and the daemon also listen on a Unix socket, for the test: a path in the
file system reaches across network namespaces and no impairment of the link touches
it, so the test can read both sides while the link between them is down."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import signal
import socket
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import uvicorn

from daemon.app import running
from daemon.emulator import create_app
from daemon.foundation.logs import configure_logging
from daemon.http.serving import bind, serve_until_stopped
from daemon.pipeline import Tuning
from daemon.settings import Settings, load_settings
from daemon.upstream import BreakerPolicy, RetryPolicy
from tests.support import callback_json, daemon_env, emulator_config, signed

# The pair's addresses (a private /30; each pair is a world of its own, so every pair
# can use the same ones) and ports.
SERVICE_IP, DAEMON_IP, PREFIX_LENGTH = "10.203.0.1", "10.203.0.2", 30
SERVICE_PORT, DAEMON_PORT = 8081, 8080
SERVICE_URL = f"http://{SERVICE_IP}:{SERVICE_PORT}"
CALLBACKS_URL = f"http://{DAEMON_IP}:{DAEMON_PORT}/callbacks"

# recoveryd's waits, short enough that a fault of a few seconds is recovered from within
# seconds, long enough that a lost packet (200 ms to retransmit, 1 s for a SYN) is not
# always a timeout: some calls time out, and those are the ones worth testing.
HTTP_TIMEOUT = 2.0
RETRY = RetryPolicy(base_delay=0.05, max_delay=0.5, max_attempts=4, max_elapsed=5.0)
TUNING = Tuning(
    retry_base=0.1, retry_cap=2.0, idle_poll=0.05, housekeeping=1.0, drain_timeout=2.0, lease=30.0
)
BREAKER = BreakerPolicy(first_open=0.2, max_open=2.0, probe_poll=0.05)

# The service's callbacks: a few at a time, each retried until answered 2xx.
SENDERS = 8
CALLBACK_TIMEOUT = 2.0
CALLBACK_RETRY_PAUSE = 0.2


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def unix_listener(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def emulator(control: Path) -> None:
    """The emulator on the service's address, its whole API on `control` too. Seeded
    workflow URLs are fictional: runs are recorded, not executed. The limit is announced
    on every answer, as QStash does, so the daemon does not start slow."""
    config = emulator_config(execute_runs=False, max_requests_per_second=1000)
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning", lifespan="on"))
    server.run(sockets=[bind(SERVICE_IP, SERVICE_PORT), unix_listener(control)])


def daemon(state: Path, rules: Path, admin: Path) -> None:
    """recoveryd as `recoveryd serve` runs it (public listener on the daemon's address,
    logs as JSON on stderr), but with the short timings above and its admin listener on
    `admin`."""
    settings = load_settings(
        daemon_env(
            state,
            SERVICE_URL=SERVICE_URL,
            LISTEN=f"{DAEMON_IP}:{DAEMON_PORT}",
            RULES=str(rules),
        ),
        require=("SERVICE_URL",),
    )
    configure_logging("json")
    asyncio.run(_daemon(settings, admin))


async def _daemon(settings: Settings, admin: Path) -> None:
    public = bind(*settings.listen)
    async with running(
        settings, retry=RETRY, tuning=TUNING, breaker=BREAKER, http_timeout=HTTP_TIMEOUT
    ) as served:
        listeners = [
            (served.public, public, served.public_http),
            (served.admin, unix_listener(admin), served.admin_http),
        ]
        await serve_until_stopped(listeners, drain_seconds=2)


def send(dlq_ids: Path, out: Path, deadline: float) -> None:
    """The failure callback of each dlqId in the file `dlq_ids` (one a line), signed, as
    the service sends it, retried until answered 2xx or `deadline` seconds have passed;
    what came of them written to `out` as JSON: `accepted` (dlqIds), `attempts` and
    `failures` (counted by kind)."""
    ids = dlq_ids.read_text().split()
    result = asyncio.run(_send(ids, time.monotonic() + deadline))
    out.write_text(json.dumps(result))


async def _send(ids: list[str], deadline: float) -> dict[str, object]:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for dlq_id in ids:
        queue.put_nowait(dlq_id)
    accepted: list[str] = []
    failures: Counter[str] = Counter()
    attempts = 0

    async def sender(client: httpx.AsyncClient) -> None:
        nonlocal attempts
        while not queue.empty():
            dlq_id = queue.get_nowait()
            body = callback_json(dlq_id, "failure-callback-workflow.json")
            while time.monotonic() < deadline:
                attempts += 1
                try:
                    answer = await client.post(CALLBACKS_URL, content=body, headers=signed(body))
                except httpx.HTTPError as exc:
                    failures[type(exc).__name__] += 1
                else:
                    if answer.is_success:
                        accepted.append(dlq_id)
                        break
                    failures[f"status {answer.status_code}"] += 1
                await asyncio.sleep(CALLBACK_RETRY_PAUSE)

    async with httpx.AsyncClient(timeout=CALLBACK_TIMEOUT) as client:
        await asyncio.gather(*(sender(client) for _ in range(SENDERS)))
    return {"accepted": accepted, "attempts": attempts, "failures": dict(failures)}


def die_with_parent() -> None:
    """SIGTERM when the test's process dies, even by SIGKILL: a node left behind would
    keep serving, and keep its namespace alive, for ever."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() == 1:  # it died before that
        sys.exit(1)


def main(argv: list[str]) -> None:
    die_with_parent()
    parser = argparse.ArgumentParser(prog="python -m tests.network.nodes")
    roles = parser.add_subparsers(dest="role", required=True)
    roles.add_parser("emulator").add_argument("control", type=Path)
    role = roles.add_parser("daemon")
    for name in ("state", "rules", "admin"):
        role.add_argument(name, type=Path)
    role = roles.add_parser("send")
    role.add_argument("dlq_ids", type=Path)
    role.add_argument("out", type=Path)
    role.add_argument("deadline", type=float)
    args = parser.parse_args(argv)
    if args.role == "emulator":
        emulator(args.control)
    elif args.role == "daemon":
        daemon(args.state, args.rules, args.admin)
    else:
        send(args.dlq_ids, args.out, args.deadline)


if __name__ == "__main__":
    main(sys.argv[1:])
