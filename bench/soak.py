"""Hours of mixed traffic against `recoveryd serve` while the service misbehaves: does
anything grow that should not?

Three processes on loopback: the emulator (bench.drain's: runs recorded, not executed,
a limit of 100 requests/s), a webhook receiver for the notify rule, and `recoveryd serve`
with a short RECOVERYD_RETENTION (`--retention`, 30s: pruning runs every 10 minutes
whatever the retention, so a short one bounds the store soonest, 11 minutes in) and
RECOVERYD_MAX_BODY_BYTES of 64 KiB. Its rules resume
the workflow runs labelled billing, restart those labelled orders, notify the receiver
of those labelled payments and match nothing labelled misc (3:2:1:1, in that order).

The traffic, open loop (sent on time whatever the answers take), for `--duration`:
* callbacks at `--rate` per second (20), in a cycle of 20: 14 honest (a DLQ entry seeded
  in the emulator as bench.drain does, then its signed failure callback), 2 duplicates
  (an accepted one again, freshly signed: must be answered "duplicate"), 1 bad signature
  (a wrong key or an expired token), 1 malformed body (not JSON, or no dlqId), 1 body over
  the size limit, and 1 client that goes away (connects and closes, or closes mid-head or
  mid-body). Hostile ones must get a 4xx (or a closed connection); a 2xx or 5xx to any,
  or a 5xx, error or timeout (10 s) to an honest one or a duplicate, is a failure;
* an admin read every 0.5 s (`/api/v1/status` and `/api/v1/dlq/{an accepted dlqId}` in
  turn, `/metrics` every 5 s);
* a fault every `--window` (at most every minute), half a period in, cycling through
  outages of a fifth of the period (503, dropped connections, held calls), and the next
  calls answered 503 or 500, slowly, 429, not JSON, dropped or with a corrupt body; none
  in the last period, so the service is healthy when the traffic stops.

Every `--window` (5m) one line: recoveryd's RSS (VmRSS) and open descriptors from /proc,
its CPU, the store's size on disk (database, -wal and -shm), callbacks sent, honest ones
sent and accepted, p50 and p99 of the honest callbacks' latency as the client saw it,
dlqIds settled (turned final, pruned ones included), failures and faults switched on.
Then, once recoveryd has settled: every accepted dlqId final (in the store or pruned),
each resume and restart run made exactly once, each notification posted exactly once,
nothing done for the unmatched (the emulator's runs, the receiver's posts); any failure
there, or above, exits 1 after the report. Targets, as ratios, printed met or missed:
RSS and descriptors of the last window within 1.2x those of the first window after the
warm-up; the store bounded by retention: its largest size after its first peak within
1.2x that peak. The store is at its largest just before the first pruning pass that can
prune a whole interval's worth (retention prunes a minute after start, then every 10
minutes: 11 minutes in with a retention of 30s), and again each interval after; a run
that reaches the second peak (21 minutes) judges the store, and its warm-up (`--warmup`)
lasts until the first, as SQLite's page cache (up to 64 MiB) grows with the store; a
shorter run's warm-up is one window, and its store is not judged.
Run: python -m bench.soak --duration 1h [--window 5m] [--rate 20] [--warmup 11m]
[--retention 30s]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench import drain, servers
from bench.ingest import ISSUER, SIGNING_KEY, log_problems
from bench.options import positive_float
from bench.servers import HOST, Server, ServerError, _running, free_port, log_tail
from daemon.emulator.signing import sign
from daemon.foundation.durations import parse_duration, shown_duration

SERVICE_RPS = 100  # the emulator's limit: the service's, that recoveryd learns
MAX_BODY_BYTES = 64 * 1024
OVERSIZED_BYTES = MAX_BODY_BYTES + 32 * 1024
TIMEOUT = 10.0  # a callback or an admin read not answered by then is a failure
SETTLE_TIMEOUT = 180.0  # the pipeline's backoff is at most 60 s, a notification's 10 min
ADMIN_EVERY = 0.5
SCRAPE_EVERY = 10  # admin reads: one in ten is a /metrics scrape
SEED_CHUNK = 200
FAULT_EVERY_AT_MOST = 60.0
FLAT = 1.2  # the tolerance of every "flat" and "bounded": last within 1.2x the reference
# daemon/runtime/retention.py's schedule, which no setting changes.
PRUNE_FIRST = 60.0
PRUNE_EVERY = 600.0
FINAL = ("done", "gone", "skipped", "dry-run", "failed")  # daemon.store.records.FINAL

# What the rules do with an honest callback, by the label of its DLQ entry.
LABELS = {"resume": "billing", "restart": "orders", "notify": "payments", "unmatched": "misc"}
HONEST_CYCLE = ("resume", "resume", "resume", "restart", "restart", "notify", "unmatched")
RUN_MODES = {"resume": "resume", "restart": "restart"}
RULES = """\
version: 1
rules:
  - name: resume-billing
    match: {{labels: {{any: [billing]}}}}
    action: resume
    batch: {{maxSize: 50, maxWait: 1s}}
  - name: restart-orders
    match: {{labels: {{any: [orders]}}}}
    action: restart
    overrides: {{retries: 2}}
    batch: {{maxSize: 20, maxWait: 2s}}
  - name: notify-payments
    match: {{labels: {{any: [payments]}}}}
    action: notify
    notify: {{url: "{hook}"}}
"""
# The callbacks sent, one every 1/rate s, in this order over and over.
HONEST, DUPLICATE, FORGED, MALFORMED, OVERSIZED, GONE = (
    "honest", "duplicate", "bad signature", "malformed", "oversized", "went away"
)  # fmt: skip
TRAFFIC_CYCLE = (
    HONEST, HONEST, DUPLICATE, HONEST, HONEST, FORGED, HONEST, HONEST, MALFORMED, HONEST,
    HONEST, DUPLICATE, HONEST, HONEST, OVERSIZED, HONEST, HONEST, GONE, HONEST, HONEST,
)  # fmt: skip

GONE_VARIANTS = ("closed at once", "closed mid-head", "closed mid-body")

# The notify rule's receiver: answers 200 and counts the posts by dlqId.
_RECEIVER_MAIN = """\
import collections
import sys

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from daemon.http.serving import run_until_stopped

posts = collections.Counter()


async def hook(request):
    posts[(await request.json())["dlqId"]] += 1
    return JSONResponse({})


async def seen(request):
    return JSONResponse(posts)


app = Starlette(routes=[Route("/hook", hook, methods=["POST"]), Route("/seen", seen)])
run_until_stopped(app, sys.argv[1], int(sys.argv[2]), log_level="warning")
"""


class BenchmarkError(Exception):
    """The soak could not run to its end."""


@dataclass(frozen=True)
class Options:
    duration: float
    window: float
    rate: float
    warmup: float
    retention: float

    @property
    def fault_every(self) -> float:
        return min(self.window, FAULT_EVERY_AT_MOST)

    @property
    def windows(self) -> int:
        return math.ceil(self.duration / self.window)


# The processes.


@contextlib.contextmanager
def receiver_server(workdir: Path) -> Iterator[Server]:
    port = free_port()
    command = [sys.executable, "-c", _RECEIVER_MAIN, HOST, str(port)]
    with _running("notify receiver", command, port, workdir, "/seen") as server:
        yield server


@contextlib.contextmanager
def recoveryd_server(
    workdir: Path, store: Path, emulator: Server, receiver: Server, options: Options
) -> Iterator[Server]:
    rules = workdir / "rules.yaml"
    rules.write_text(RULES.format(hook=f"{drain.url_of(receiver)}/hook"))
    settings = {
        "RECOVERYD_RETENTION": shown_duration(options.retention),
        "RECOVERYD_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
    }
    with servers.recoveryd_server(
        workdir, store, SIGNING_KEY, service_url=drain.url_of(emulator), rules=rules,
        token=drain.TOKEN, more_settings=settings,
    ) as server:  # fmt: skip
        yield server


@dataclass(frozen=True)
class Processes:
    emulator: Server
    receiver: Server
    recoveryd: Server
    store: Path


# The traffic.


class Seeder:
    """DLQ entries seeded ahead in the emulator, `SEED_CHUNK` at a time, each labelled for
    the rule it is to meet; `kinds` remembers which."""

    def __init__(self, control: httpx.AsyncClient) -> None:
        self._control = control
        self._ready: list[str] = []
        self._lock = asyncio.Lock()
        self._numbers = itertools.count()
        self.kinds: dict[str, str] = {}

    async def take(self) -> str:
        async with self._lock:
            if not self._ready:
                await self._seed()
            return self._ready.pop()

    async def _seed(self) -> None:
        numbers = [next(self._numbers) for _ in range(SEED_CHUNK)]
        kinds = [HONEST_CYCLE[n % len(HONEST_CYCLE)] for n in numbers]
        messages = [
            {"url": f"https://app.example.com/wf/{kind}", "workflowRunId": f"wfr_soak_{n}",
             "labels": [LABELS[kind]]}
            for n, kind in zip(numbers, kinds, strict=True)
        ]  # fmt: skip
        response = await self._control.post("/_emulator/dlq", json={"messages": messages})
        dlq_ids: list[str] = response.raise_for_status().json()["dlqIds"]
        self.kinds.update(zip(dlq_ids, kinds, strict=True))
        self._ready = dlq_ids[::-1]  # taken from the end: in the order seeded


class Signer:
    """The workflow failure callback sample with a dlqId, signed as the service signs
    (daemon.emulator.signing) just before it is sent."""

    def __init__(self, callback_url: str) -> None:
        self._url = callback_url
        self._sample = json.loads(drain.SAMPLE.read_text())

    def body(self, dlq_id: str, **more: Any) -> bytes:
        return json.dumps(self._sample | {"dlqId": dlq_id} | more).encode()

    def headers(self, body: bytes, *, key: str = SIGNING_KEY, age: float = 0) -> dict[str, str]:
        signature = sign(body, url=self._url, key=key, issuer=ISSUER, now=time.time() - age)
        return {"Content-Type": "application/json", f"{ISSUER}-Signature": signature}

    def signed(self, dlq_id: str) -> tuple[bytes, dict[str, str]]:
        body = self.body(dlq_id)
        return body, self.headers(body)


@dataclass
class Tally:
    """What happened in one window."""

    sent: int = 0  # callbacks of every kind
    honest: int = 0
    accepted: int = 0
    latencies: list[float] = field(default_factory=list)  # honest callbacks answered
    failures: int = 0
    faults: int = 0


@dataclass
class Record:
    """What happened in the whole run."""

    answers: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, answer)
    failures: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    honest_sent: set[str] = field(default_factory=set)
    accepted: list[str] = field(default_factory=list)  # honest dlqIds answered "accepted"
    faults: Counter[str] = field(default_factory=Counter)
    admin_reads: int = 0


Content = bytes | AsyncIterator[bytes]


async def _chunked(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), 16 * 1024):
        yield body[start : start + 16 * 1024]


def answer_of(response: httpx.Response) -> str:
    """`accepted` or `duplicate` for a 200 saying so, the status code otherwise."""
    if response.status_code == 200:
        with contextlib.suppress(ValueError, AttributeError):
            return str(response.json().get("status", "200"))
    return str(response.status_code)


class Traffic:
    """Sends the mix and keeps the tallies: `tally` of the window under way, `record` of
    the whole run."""

    def __init__(
        self,
        public: httpx.AsyncClient,
        hostile: httpx.AsyncClient,
        admin: httpx.AsyncClient,
        seeder: Seeder,
        signer: Signer,
        public_port: int,
    ) -> None:
        self._public = public
        self._hostile = hostile
        self._admin = admin
        self._seeder = seeder
        self._signer = signer
        self._port = public_port
        self._random = random.Random(18)
        self.tally = Tally()
        self.record = Record()

    def next_window(self) -> Tally:
        """The window just ended's tally; a fresh one for the next."""
        tally, self.tally = self.tally, Tally()
        return tally

    def fail(self, what: str, example: str) -> None:
        self.record.failures[what] += 1
        self.record.examples.setdefault(what, example[:300])
        self.tally.failures += 1

    async def callbacks(self, rate: float, until: float) -> None:
        """One callback every 1/rate s until `until` (monotonic), each in its own task, so
        a slow answer delays no other; returns once every answer is in."""
        interval = 1 / rate
        next_at = time.monotonic()
        async with asyncio.TaskGroup() as group:
            for number in itertools.count():
                if next_at >= until:
                    break
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                kind = TRAFFIC_CYCLE[number % len(TRAFFIC_CYCLE)]
                group.create_task(self._send(kind, number))
                # After a stall (a long GC, a busy machine) carry on, without a burst.
                next_at = max(next_at + interval, time.monotonic() - interval)

    async def _send(self, kind: str, number: int) -> None:
        self.tally.sent += 1
        if kind == DUPLICATE and self.record.accepted:
            await self._duplicate()
        elif kind in (HONEST, DUPLICATE):
            await self._honest()
        elif kind == GONE:
            await self._go_away(number)
        else:
            await self._hostile_post(kind, *self._hostile_request(kind, number))

    async def _honest(self) -> None:
        dlq_id = await self._seeder.take()
        self.tally.honest += 1
        self.record.honest_sent.add(dlq_id)
        body, headers = self._signer.signed(dlq_id)
        started = time.perf_counter()
        try:
            response = await self._public.post("/callbacks", content=body, headers=headers)
        except httpx.HTTPError as exc:
            self.fail(f"honest callback: {type(exc).__name__}", f"{dlq_id}: {exc!r}")
            return
        self.tally.latencies.append(time.perf_counter() - started)
        answer = answer_of(response)
        self.record.answers[HONEST, answer] += 1
        if answer != "accepted":
            self.fail(f"honest callback answered {answer}", f"{dlq_id}: {response.text}")
            return
        self.tally.accepted += 1
        self.record.accepted.append(dlq_id)

    async def _duplicate(self) -> None:
        dlq_id = self._random.choice(self.record.accepted)
        body, headers = self._signer.signed(dlq_id)
        try:
            response = await self._public.post("/callbacks", content=body, headers=headers)
        except httpx.HTTPError as exc:
            self.fail(f"duplicate: {type(exc).__name__}", f"{dlq_id}: {exc!r}")
            return
        answer = answer_of(response)
        self.record.answers[DUPLICATE, answer] += 1
        if answer != "duplicate":
            self.fail(f"duplicate answered {answer}", f"{dlq_id}: {response.text}")

    def _hostile_request(self, kind: str, number: int) -> tuple[Content, dict[str, str]]:
        """A forged, malformed or oversized callback; two variants of each, in turn."""
        variant = number // len(TRAFFIC_CYCLE) % 2
        if kind == FORGED:
            body = self._signer.body(f"forged-{number}")
            if variant:
                return body, self._signer.headers(body, age=900)  # expired 10 min ago
            return body, self._signer.headers(body, key="not-the-key-" + "x" * 32)
        if kind == MALFORMED:
            body = b'{"dlqId": "malformed-' if variant else b'{"status": 500, "retried": 3}'
            return body, self._signer.headers(body)
        body = self._signer.body(f"oversized-{number}", pad="x" * OVERSIZED_BYTES)
        # With Content-Length, or chunked: refused before reading, or while reading.
        return (_chunked(body) if variant else body), self._signer.headers(body)

    async def _hostile_post(self, kind: str, body: Content, headers: dict[str, str]) -> None:
        try:
            response = await self._hostile.post("/callbacks", content=body, headers=headers)
        except httpx.HTTPError as exc:
            # recoveryd may close the connection on a refused body before it is all sent.
            self.record.answers[kind, f"connection closed ({type(exc).__name__})"] += 1
            return
        answer = answer_of(response)
        self.record.answers[kind, answer] += 1
        if not 400 <= response.status_code < 500:
            self.fail(f"{kind} callback answered {answer}", response.text)

    async def _go_away(self, number: int) -> None:
        """Connect, then close at once, after half a head, or after half a body."""
        variant = number // len(TRAFFIC_CYCLE) % len(GONE_VARIANTS)
        head = (
            f"POST /callbacks HTTP/1.1\r\nHost: {HOST}:{self._port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 2000\r\n"
        ).encode()
        sent = [b"", head[:40], head + b"\r\n" + b'{"dlqId": "gone-' + b"x" * 900][variant]
        try:
            _, writer = await asyncio.open_connection(HOST, self._port)
        except OSError as exc:
            self.record.answers[GONE, f"connect failed ({type(exc).__name__})"] += 1
            return
        writer.write(sent)
        with contextlib.suppress(OSError):
            await writer.drain()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        self.record.answers[GONE, GONE_VARIANTS[variant]] += 1

    async def admin_reads(self, until: float) -> None:
        """An admin read every ADMIN_EVERY s until `until`: the status and a dlqId in
        turn, and a /metrics scrape one time in SCRAPE_EVERY."""
        for number in itertools.count():
            await asyncio.sleep(ADMIN_EVERY)
            if time.monotonic() >= until:
                return
            if number % SCRAPE_EVERY == 0:
                path = "/metrics"
            elif number % 2 or not self.record.accepted:
                path = "/api/v1/status"
            else:
                path = f"/api/v1/dlq/{self._random.choice(self.record.accepted[-500:])}"
            await self._admin_read(path)

    async def _admin_read(self, path: str) -> None:
        self.record.admin_reads += 1
        try:
            response = await self._admin.get(path)
        except httpx.HTTPError as exc:
            self.fail(f"admin read: {type(exc).__name__}", f"{path}: {exc!r}")
            return
        # A dlqId's record is pruned once final for the retention: a 404 then.
        if response.status_code != 200 and not (
            response.status_code == 404 and path.startswith("/api/v1/dlq/")
        ):
            self.fail(f"admin read answered {response.status_code}", f"{path}: {response.text}")


# The faults.


def fault_cycle(every: float) -> list[tuple[str, str, dict[str, Any]]]:
    """The faults switched on in turn: (name, control path, what is posted)."""
    outage = round(every / 5, 1)
    bulk = ["/v2/workflows/dlq/"]
    return [
        ("outage 503", "/_emulator/outage", {"mode": "503", "seconds": outage, "retryAfter": 1}),
        ("next 8 calls 503", "/_emulator/faults", {"kind": "status", "status": 503, "times": 8}),
        ("outage dropping", "/_emulator/outage", {"mode": "drop", "seconds": outage}),
        ("next 10 calls slow", "/_emulator/faults", {"kind": "latency", "seconds": 3, "times": 10}),
        ("next 10 calls 429", "/_emulator/faults", {"kind": "rate_limit", "times": 10}),
        ("outage holding", "/_emulator/outage", {"mode": "hang", "seconds": outage}),
        ("next 2 bulk answers lost", "/_emulator/faults",
         {"kind": "drop", "times": 2, "paths": bulk}),
        ("next 5 reads not JSON", "/_emulator/faults",
         {"kind": "malformed", "times": 5, "paths": ["/v2/dlq/"]}),
        ("next 2 bulk answers corrupt", "/_emulator/faults",
         {"kind": "corrupt_gzip", "times": 2, "paths": bulk}),
        ("next 7 calls 500", "/_emulator/faults", {"kind": "status", "status": 500, "times": 7}),
    ]  # fmt: skip


async def switch_faults(
    control: httpx.AsyncClient, traffic: Traffic, every: float, start: float, end: float
) -> None:
    """A fault every `every` s from half a period after `start`; none that would start
    in the last period before `end`, so the run ends with the service healthy."""
    cycle = fault_cycle(every)
    at = start + every / 2
    for number in itertools.count():
        if at + every > end:
            return
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        name, path, payload = cycle[number % len(cycle)]
        (await control.post(path, json=payload)).raise_for_status()
        traffic.record.faults[name] += 1
        traffic.tally.faults += 1
        at += every


async def clear_faults(control: httpx.AsyncClient) -> None:
    (await control.delete("/_emulator/faults")).raise_for_status()
    (await control.delete("/_emulator/outage")).raise_for_status()


# recoveryd's process and store.


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # "VmRSS:   123456 kB"
    raise BenchmarkError(f"no VmRSS in /proc/{pid}/status")


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def store_bytes(store: Path) -> int:
    """The database with its -wal and -shm files."""
    total = 0
    for path in (store, Path(f"{store}-wal"), Path(f"{store}-shm")):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics answer, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def settled_so_far(values: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> int:
    """dlqIds final in the store plus those pruned."""
    final = sum(values.get(("recoveryd_dlq_ids", (("state", state),)), 0.0) for state in FINAL)
    return int(final + values.get(("recoveryd_pruned_records_total", ()), 0.0))


@dataclass(frozen=True)
class Sample:
    at: float  # monotonic
    rss: int
    fds: int
    store: int
    cpu: float
    settled: int


class Probe:
    """Samples recoveryd's process and store; also the store's largest size per window,
    looked at every second (the file shrinks after each pruning pass)."""

    def __init__(self, processes: Processes, admin: httpx.AsyncClient) -> None:
        self._recoveryd = processes.recoveryd
        self._store = processes.store
        self._admin = admin
        self.store_max = 0

    async def sample(self) -> Sample:
        response = (await self._admin.get("/metrics")).raise_for_status()
        pid = self._recoveryd.pid
        store = store_bytes(self._store)
        self.store_max = max(self.store_max, store)
        return Sample(
            time.monotonic(), rss_bytes(pid), descriptors(pid), store,
            self._recoveryd.cpu_seconds(), settled_so_far(metric_values(response.text)),
        )  # fmt: skip

    def next_window(self) -> int:
        """The store's largest size seen in the window just ended."""
        largest, self.store_max = self.store_max, store_bytes(self._store)
        return largest

    async def watch_store(self, until: float) -> None:
        while time.monotonic() < until:
            self.store_max = max(self.store_max, store_bytes(self._store))
            await asyncio.sleep(1.0)


# The report.


@dataclass(frozen=True)
class Window:
    index: int
    start: float  # seconds from the start of the traffic, as scheduled
    end: float
    sample: Sample
    cpu_share: float
    store_max: int
    settled: int
    tally: Tally

    def percentile(self, q: float) -> float | None:
        """Nearest rank."""
        values = sorted(self.tally.latencies)
        return values[max(0, math.ceil(q * len(values)) - 1)] if values else None


_COLUMNS = (
    ("window", 6), ("elapsed", 8), ("RSS MiB", 8), ("fds", 4), ("store MiB", 9), ("CPU", 4),
    ("sent", 6), ("honest", 6), ("accepted", 8), ("p50 ms", 7), ("p99 ms", 7),
    ("settled", 7), ("failures", 8), ("faults", 6),
)  # fmt: skip


def elapsed(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def window_line(window: Window) -> str:
    sample, tally = window.sample, window.tally
    cells = (
        str(window.index), elapsed(window.end), f"{sample.rss / 2**20:.1f}", str(sample.fds),
        f"{sample.store / 2**20:.2f}", f"{window.cpu_share:.0%}", f"{tally.sent:,}",
        f"{tally.honest:,}", f"{tally.accepted:,}", _ms(window.percentile(0.5)),
        _ms(window.percentile(0.99)), f"{window.settled:,}", str(tally.failures),
        str(tally.faults),
    )  # fmt: skip
    return "  ".join(cell.rjust(width) for cell, (_, width) in zip(cells, _COLUMNS, strict=True))


def header_line() -> str:
    return "  ".join(name.rjust(width) for name, width in _COLUMNS)


async def run_windows(
    traffic: Traffic,
    probe: Probe,
    control: httpx.AsyncClient,
    options: Options,
) -> list[Window]:
    """The traffic, the faults and the admin reads for the duration, a line per window."""
    print("\n" + header_line(), flush=True)
    previous = await probe.sample()
    start = previous.at
    end = start + options.duration
    windows: list[Window] = []
    async with asyncio.TaskGroup() as group:
        sending = group.create_task(traffic.callbacks(options.rate, end))
        group.create_task(traffic.admin_reads(end))
        group.create_task(switch_faults(control, traffic, options.fault_every, start, end))
        group.create_task(probe.watch_store(end))
        for index in range(1, options.windows + 1):
            boundary = min(start + index * options.window, end)
            await asyncio.sleep(max(0.0, boundary - time.monotonic()))
            if index == options.windows:
                await sending  # the last answers count in the last window
            sample = await probe.sample()
            window = Window(
                index, (index - 1) * options.window, boundary - start, sample,
                (sample.cpu - previous.cpu) / (sample.at - previous.at), probe.next_window(),
                sample.settled - previous.settled, traffic.next_window(),
            )  # fmt: skip
            print(window_line(window), flush=True)
            windows.append(window)
            previous = sample
    return windows


# After the traffic: settle, then check.


def _pending(status: dict[str, Any]) -> int:
    states: dict[str, int] = status["states"]
    not_final = sum(count for state, count in states.items() if state not in FINAL)
    return int(not_final + status["pendingBatches"] + status["notifications"]["pending"])


async def settle(admin: httpx.AsyncClient) -> tuple[float | None, dict[str, Any]]:
    """Wait until recoveryd has nothing pending (states, batches, notifications); the
    seconds that took (None: still pending after SETTLE_TIMEOUT) and its last status."""
    started = time.monotonic()
    while True:
        status: dict[str, Any] = (await admin.get("/api/v1/status")).raise_for_status().json()
        if _pending(status) == 0:
            return time.monotonic() - started, status
        if time.monotonic() - started > SETTLE_TIMEOUT:
            return None, status
        await asyncio.sleep(0.5)


@dataclass(frozen=True)
class Outcome:
    """What recoveryd, the emulator and the receiver ended with."""

    settle_seconds: float | None
    status: dict[str, Any]
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    runs: list[dict[str, Any]]
    journal: list[dict[str, Any]]
    posts: dict[str, int]

    @property
    def states(self) -> dict[str, int]:
        states: dict[str, int] = self.status["states"]
        return states

    @property
    def pruned(self) -> int:
        return int(self.values.get(("recoveryd_pruned_records_total", ()), 0.0))

    def callbacks(self, result: str) -> int:
        return int(self.values.get(("recoveryd_callbacks_total", (("result", result),)), 0.0))


async def read_outcome(
    admin: httpx.AsyncClient, control: httpx.AsyncClient, receiver: httpx.AsyncClient
) -> Outcome:
    seconds, status = await settle(admin)
    metrics = (await admin.get("/metrics")).raise_for_status().text

    async def get(client: httpx.AsyncClient, path: str) -> Any:
        return (await client.get(path)).raise_for_status().json()

    return Outcome(
        seconds, status, metric_values(metrics), await get(control, "/_emulator/runs"),
        await get(control, "/_emulator/journal"), await get(receiver, "/seen"),
    )  # fmt: skip


def check_states(record: Record, outcome: Outcome) -> list[str]:
    """Every accepted dlqId is final: in the store's final states, or pruned (only final
    records are)."""
    problems = []
    if outcome.settle_seconds is None:
        status = outcome.status
        problems.append(
            f"recoveryd still had work pending {SETTLE_TIMEOUT:.0f} s after the traffic "
            f"stopped: {_counts(Counter(status['states']))}, {status['pendingBatches']} "
            f"batches, {status['notifications']['pending']} notifications"
        )
    held = sum(outcome.states.values())
    if held + outcome.pruned != len(record.accepted):
        problems.append(
            f"the store holds {held:,} dlqIds and pruned {outcome.pruned:,}, but "
            f"{len(record.accepted):,} were accepted"
        )
    return problems


def check_runs(record: Record, kinds: dict[str, str], outcome: Outcome) -> list[str]:
    """Each accepted resume or restart dlqId made exactly one run of its mode; no run
    came from any other dlqId."""
    problems = []
    sources = Counter(run["sourceDlqId"] for run in outcome.runs)
    twice = sum(1 for count in sources.values() if count > 1)
    expected = {dlq_id for dlq_id in record.accepted if kinds[dlq_id] in RUN_MODES}
    missing = len(expected - set(sources))
    wrong = sum(
        1 for run in outcome.runs
        if RUN_MODES.get(kinds.get(run["sourceDlqId"], "")) != run["mode"]
        or run["sourceDlqId"] not in record.honest_sent
    )  # fmt: skip
    if twice:
        problems.append(f"{twice:,} dlqIds were resumed or restarted more than once")
    if missing:
        problems.append(f"{missing:,} accepted dlqIds to resume or restart never were")
    if wrong:
        problems.append(f"{wrong:,} runs of the wrong mode, or for a dlqId no rule recovers")
    return problems


def check_notifications(record: Record, kinds: dict[str, str], outcome: Outcome) -> list[str]:
    """Each accepted notify dlqId posted once; nothing else posted."""
    problems = []
    expected = {dlq_id for dlq_id in record.accepted if kinds[dlq_id] == "notify"}
    twice = sum(1 for count in outcome.posts.values() if count > 1)
    missing = len(expected - set(outcome.posts))
    extra = len(set(outcome.posts) - expected)
    if twice:
        problems.append(f"{twice:,} notifications were posted more than once")
    if missing:
        problems.append(f"{missing:,} accepted dlqIds to notify were not posted")
    if extra:
        problems.append(f"{extra:,} notifications posted for dlqIds no rule notifies")
    return problems


def print_traffic(record: Record) -> None:
    print("\ntraffic, by kind and answer:")
    for kind in dict.fromkeys(TRAFFIC_CYCLE):
        answers = sorted((answer, n) for (k, answer), n in record.answers.items() if k == kind)
        sent = sum(n for _, n in answers)
        shown = ", ".join(f"{answer} {n:,}" for answer, n in answers)
        print(f"  {kind:<13} {sent:>8,}: {shown}")
    print(f"  admin reads   {record.admin_reads:>8,} (/api/v1/status, /api/v1/dlq/..., /metrics)")
    faults = ", ".join(f"{name} x{n}" for name, n in record.faults.items())
    print(f"faults switched on: {faults or 'none'}")


def print_outcome(record: Record, kinds: dict[str, str], outcome: Outcome) -> None:
    calls = Counter(_call_outcome(call) for call in outcome.journal)
    injected = sum(1 for call in outcome.journal if "fault" in call or "outage" in call)
    shown = ", ".join(f"{name} {n:,}" for name, n in sorted(calls.items()))
    print(f"service calls (emulator journal): {len(outcome.journal):,}: {shown}; "
          f"{injected:,} met an injected fault or outage")  # fmt: skip
    accepted = Counter(kinds[dlq_id] for dlq_id in record.accepted)
    modes = Counter(run["mode"] for run in outcome.runs)
    settled = outcome.settle_seconds
    print(
        ("not settled" if settled is None else f"settled {settled:.1f} s")
        + " after the traffic stopped: "
        f"{len(record.accepted):,} dlqIds accepted ({_counts(accepted)}); recoveryd counted "
        f"{outcome.callbacks('accepted'):,} accepted, {outcome.callbacks('duplicate'):,} "
        f"duplicates; store {_counts(Counter(outcome.states))}, {outcome.pruned:,} pruned; "
        f"runs {_counts(modes)}; notifications posted {sum(outcome.posts.values()):,}"
    )


def _counts(counts: Counter[str]) -> str:
    return ", ".join(f"{name} {n:,}" for name, n in sorted(counts.items()) if n) or "none"


def _call_outcome(call: dict[str, Any]) -> str:
    status = call.get("status") or 0
    return "no answer" if status == 0 else f"{status // 100}xx" if status != 429 else "429"


# The targets.


def steady_store_at(retention: float) -> float:
    """When the store first reaches its largest size: just before the first pruning pass
    that comes a whole pruning interval after one that could prune (one at least the
    retention after the start). From then on it holds at most the retention plus one
    interval of final records."""
    passes = 1 + math.ceil(max(0.0, retention - PRUNE_FIRST) / PRUNE_EVERY)
    return PRUNE_FIRST + PRUNE_EVERY * passes


def verdict(met: bool | None, text: str) -> str:
    word = "not judged" if met is None else "met" if met else "missed"
    return f"{word:<10}  {text}"


def flat(name: str, base: Window, value: float, base_value: float, unit: str) -> str:
    ratio = value / base_value
    shown = ".1f" if unit else ".0f"
    return verdict(
        ratio <= FLAT,
        f"{name} flat after warm-up: {value:{shown}}{unit} in the last window, {ratio:.2f}x "
        f"window {base.index}'s {base_value:{shown}}{unit} (tolerance {FLAT}x)",
    )


def judges_store(duration: float, retention: float) -> bool:
    """Whether a run lasts until the store's second peak, one pruning interval after its
    first: the two can then be compared."""
    return duration >= steady_store_at(retention) + PRUNE_EVERY


def store_verdict(windows: Sequence[Window], options: Options) -> str:
    steady = steady_store_at(options.retention)
    name = "store bounded by retention"
    if not judges_store(options.duration, options.retention):
        return verdict(
            None,
            f"{name}: with a retention of {shown_duration(options.retention)} the store is at "
            f"its largest {elapsed(steady)} in, and again each 10:00 after (pruning runs at "
            f"1:00, then every 10:00); it takes --duration "
            f"{shown_duration(steady + PRUNE_EVERY)} or more to compare the two",
        )
    first = max(w.store_max for w in windows if w.start < steady)
    later = max(w.store_max for w in windows if w.start >= steady)
    ratio = later / first
    return verdict(
        ratio <= FLAT,
        f"{name}: largest {later / 2**20:.2f} MiB in the windows after {elapsed(steady)}, "
        f"{ratio:.2f}x the largest up to then, {first / 2**20:.2f} MiB (tolerance {FLAT}x)",
    )


def print_targets(windows: Sequence[Window], options: Options) -> None:
    print("\ntargets:")
    last = windows[-1]
    after = [w for w in windows if w.start >= options.warmup and w is not last]
    if not after:
        reason = "no window but the last starts after the warm-up"
        print(verdict(None, f"RSS and descriptors flat after warm-up: {reason}"))
    else:
        base = after[0]
        print(flat("RSS", base, last.sample.rss / 2**20, base.sample.rss / 2**20, " MiB"))
        print(flat("descriptors", base, last.sample.fds, base.sample.fds, ""))
        p99, base_p99 = last.percentile(0.99), base.percentile(0.99)
        if p99 is not None and base_p99 is not None:
            print(f"{'':<10}  (not a target) p99 ingest latency {p99 * 1e3:.1f} ms in the last "
                  f"window, {p99 / base_p99:.2f}x window {base.index}'s")  # fmt: skip
    print(store_verdict(windows, options))


# The whole run.


@contextlib.asynccontextmanager
async def clients(processes: Processes) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    recoveryd = processes.recoveryd
    urls = {
        "public": drain.url_of(recoveryd),
        "hostile": drain.url_of(recoveryd),
        "admin": drain.url_of(recoveryd, recoveryd.admin_port),
        "control": drain.url_of(processes.emulator),
        "receiver": drain.url_of(processes.receiver),
    }
    async with contextlib.AsyncExitStack() as stack:
        yield {
            name: await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=TIMEOUT))
            for name, url in urls.items()
        }


async def soak(processes: Processes, options: Options) -> list[str]:
    """The run and its report; the problems found."""
    async with clients(processes) as http:
        seeder = Seeder(http["control"])
        signer = Signer(f"{drain.url_of(processes.recoveryd)}/callbacks")
        traffic = Traffic(http["public"], http["hostile"], http["admin"], seeder, signer,
                          processes.recoveryd.port)  # fmt: skip
        probe = Probe(processes, http["admin"])
        windows = await run_windows(traffic, probe, http["control"], options)
        await clear_faults(http["control"])
        outcome = await read_outcome(http["admin"], http["control"], http["receiver"])
    record = traffic.record
    print_traffic(record)
    print_outcome(record, seeder.kinds, outcome)
    problems = [
        f"{count:,} x {what} (first: {record.examples[what]})"
        for what, count in record.failures.items()
    ]
    problems += check_states(record, outcome)
    problems += check_runs(record, seeder.kinds, outcome)
    problems += check_notifications(record, seeder.kinds, outcome)
    problems += report_exit(processes.recoveryd)
    print_correctness(problems)
    print_targets(windows, options)
    return problems


def print_correctness(problems: Sequence[str]) -> None:
    print("\ncorrectness:")
    if not problems:
        text = (
            "every answer as it must be; every accepted dlqId final; each recovered or "
            "notified exactly once, the unmatched left alone"
        )
        print(verdict(True, text))
    for problem in problems:
        print(f"{'FAILED':<10}  {problem}")


def report_exit(recoveryd: Server) -> list[str]:
    status = recoveryd.stop()
    problems = log_problems(recoveryd.log)
    events = Counter(_event(line) for line in problems)
    print(f"{recoveryd.name}: exit status {status} after SIGTERM; {len(problems):,} log lines "
          f"at warning level or above: {_counts(events)}")  # fmt: skip
    return (
        []
        if status == 0
        else [f"{recoveryd.name} must exit 0 after SIGTERM{log_tail(recoveryd.log)}"]
    )


def _event(line: str) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(line).get("event", "?"))
    return "not JSON"


def print_header(options: Options) -> None:
    honest = options.rate * TRAFFIC_CYCLE.count(HONEST) / len(TRAFFIC_CYCLE)
    print(
        f"recoveryd soak: {shown_duration(options.duration)} in windows of "
        f"{shown_duration(options.window)} (warm-up {shown_duration(options.warmup)}); "
        f"{options.rate:g} callbacks/s, {honest:g} of them honest; a fault every "
        f"{shown_duration(options.fault_every)}; RECOVERYD_RETENTION="
        f"{shown_duration(options.retention)}; the emulator allows {SERVICE_RPS} requests/s"
    )
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start",
        flush=True,
    )


def run(options: Options) -> list[str]:
    print_header(options)
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        workdir = Path(tmp)
        store = workdir / "recoveryd.db"
        with (
            drain.emulator_server(workdir, SERVICE_RPS) as emulator,
            receiver_server(workdir) as receiver,
            recoveryd_server(workdir, store, emulator, receiver, options) as recoveryd,
        ):
            return asyncio.run(soak(Processes(emulator, receiver, recoveryd, store), options))


def duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return seconds


def parse_options(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=duration, required=True, help="e.g. 1h, 40s")
    parser.add_argument("--window", type=duration, default=300.0, help="default 5m")
    parser.add_argument("--rate", type=positive_float, default=20.0, help="callbacks/s")
    parser.add_argument(
        "--warmup", type=duration, help="default: until the store is bounded, or one window"
    )
    parser.add_argument(
        "--retention", type=duration, default=30.0, help="RECOVERYD_RETENTION (default 30s)"
    )
    args = parser.parse_args(argv)
    if args.window > args.duration:
        parser.error("--window must not be longer than --duration")
    return Options(
        args.duration, args.window, args.rate, args.warmup or default_warmup(args), args.retention
    )


def default_warmup(args: argparse.Namespace) -> float:
    """Until the store is at its largest, when the run lasts long enough to judge that:
    SQLite's page cache (up to 64 MiB) grows with the store until then, which is no leak.
    One window otherwise."""
    if judges_store(args.duration, args.retention):
        return steady_store_at(args.retention)
    return float(args.window)


_STOPPERS = (BenchmarkError, ServerError, httpx.HTTPError)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(argv)
    try:
        problems = run(options)
    except _STOPPERS as exc:
        print(f"\nFAILED: {exc!r}", file=sys.stderr)
        return 1
    except ExceptionGroup as group:  # from the tasks of the traffic
        stoppers, others = group.split(_STOPPERS)
        if stoppers is None or others is not None:
            raise
        print(f"\nFAILED: {stoppers.exceptions[0]!r}", file=sys.stderr)
        return 1
    if problems:
        print(f"\nFAILED: {len(problems)} correctness problems (above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
