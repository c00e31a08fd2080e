"""How fast `recoveryd serve` drains a workflow DLQ backlog under the service's rate limit.

The emulator (its own process, enforcing `--rate` requests per second) is seeded with
`--entries` workflow DLQ entries, and recoveryd (its own process, one rule: resume every
workflow run, batches of 50 within 1 s) is sent their signed failure callbacks (signed
beforehand) as fast as 32 keep-alive connections of bench.loadgen carry them: the bench's
own client must not be what bounds a drain that makes no GET. The clock starts at the
first callback and stops when recoveryd's status counts every dlqId `done`. recoveryd
must make one GET per dlqId and one bulk resume per 50, so no client can finish before
(N + ceil(N/50)) / rate seconds.

The baseline, in the same run against the same emulator (reset): a loop of 8 workers
that GETs each dlqId and resumes it with its own call, through the same ServiceClient,
whose rate limiter learns the limit from the answers as recoveryd's does. It needs
2N calls. It drains `--naive-entries` (fewer than `--entries` by default, to keep the
run short): its per-run figures are measured, its drain time for `--entries` is scaled.

With `--replicas N` (N > 1, or `--store postgres`), N `recoveryd serve` processes share
one PostgreSQL store (a durable server the bench starts on loopback: fsync and
synchronous_commit on), and the callbacks are spread over them in turn. They share the
account's limit (each takes its part, daemon/runtime/replicas.py), so the theoretical drain is
the same as one replica's. The clock starts once every replica has seen the others.

With `--fetch needed`, recoveryd runs with RECOVERYD_FETCH=needed: it decides from the
signed callbacks and makes no GET, so the fewest calls are ceil(N/50) and the limit no
longer bounds the drain. In the same run, against the same emulator (reset), a second
recoveryd with RECOVERYD_FETCH=always drains `--naive-entries` entries, and its drain
rate is set beside the first's.

With `--outage 60s`, the drain after an outage: the service's API is down (503s) when
the callbacks arrive and for that long from the first, then comes back; the clock
starts at its return. The backlog must be drained within 1.5x the theoretical time plus
5 s (issue 35): the wait was the service's, and its return ends it for every dlqId.
The calls that met the outage are counted apart.

With `--service silent`, the emulator announces its limit only on a 429 and counts it in
a sliding second (EMULATOR_RATE_LIMIT_HEADERS=on_429, EMULATOR_RATE_LIMIT_WINDOW=sliding):
recoveryd learns the limit by exceeding it once. Its 429s are grouped in episodes (each
within EPISODE_GAP seconds of the one before); the target is one episode, and a drain
rate >= 85% of the theoretical limit. `--service announcing` (the default) is the
emulator as the service documents itself: the limit on every answer, fixed windows.

With `--against REVISION`, recoveryd as it was at a git revision (a worktree of it,
bench/servers.py's `revision`, as bench.ingest's `--against`) drains the same backlog
too: the same entries, rate, rules and options, the emulator reset, a fresh recoveryd
each time. Over `--rounds` (2 then, 1 otherwise) the two take turns going first, so
that drift on a noisy machine hits both; each one's drain rate (runs/s) and calls per
run are printed, median of its rounds, and this tree's rate over the revision's. The
naive loop is skipped then, to keep the run short.

Every figure of calls comes from the emulator's journal and stats, every resumed run
is checked against the seeded dlqIds, or the run fails with status 1.
Targets, `--fetch always`: drain rate >= 90% of the theoretical limit, < 1.05 upstream
calls per recovered run, zero 429s once the limit is known (counted: every 429).
`--fetch needed`: at most 0.05 calls per recovered run, at least 10x the drain rate
(runs per second) of `always`, no 429 after the first answer.
Run: python -m bench.drain [--entries N] [--rate N] [--naive-entries N] [--skip-naive]
                           [--replicas N] [--store sqlite|postgres]
                           [--fetch always|needed] [--outage DURATION]
                           [--service announcing|silent]
                           [--against REVISION] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import servers
from bench.ingest import SIGNING_KEY, SignedCallbacks, log_problems
from bench.loadgen import drive
from bench.options import positive_int
from bench.postgres import Unavailable, durable_server
from bench.servers import HOST, Revision, Server, ServerError, _running, free_port, log_tail
from daemon.foundation.durations import parse_duration
from daemon.upstream import (
    MAX_BULK,
    Credentials,
    CredentialsHolder,
    RateLimiter,
    ServiceClient,
)

SAMPLE = (
    Path(__file__).resolve().parent.parent / "tests/testdata/samples/failure-callback-workflow.json"
)
TOKEN = "tok_bench_drain"
RULES = """\
version: 1
rules:
  - name: resume-workflows
    match: {workflow: true}
    action: resume
    batch: {maxSize: 50, maxWait: 1s}
"""
GET_PREFIX = "/v2/dlq/"
BULK_PATH = "/v2/workflows/dlq/resume"
SEED_CHUNK = 1_000
# Keep-alive connections a replica, at least: ingest is far faster than the drain. More
# when a connection would carry more than the 1,000 requests recoveryd's listener
# serves on one (RECOVERYD_MAX_REQUESTS_PER_CONNECTION).
POSTERS = 32
REQUESTS_PER_CONNECTION = 900
NAIVE_WORKERS = 8
POLL = 0.2  # seconds between looks at recoveryd's status
TARGET_SHARE = 0.90
TARGET_SILENT_SHARE = 0.85
EPISODE_GAP = 3.0  # seconds: 429s closer than this to the one before are one episode
TARGET_CALLS_PER_RUN = 1.05
TARGET_NEEDED_CALLS_PER_RUN = 0.05
TARGET_NEEDED_SPEEDUP = 10.0
# After an outage: drained within this many times the theoretical time, plus the slack.
TARGET_OUTAGE_FACTOR = 1.5
TARGET_OUTAGE_SLACK = 5.0

# `recoveryd emulator` has no setting that turns run execution off: each resumed run
# would be delivered to its workflow URL and, failing, dead-lettered again, work that is
# not part of the drain and competes with it for the emulator's CPU. So it is started as
# the command starts it, with runs recorded only (as the pipeline tests do), and without
# an access log line per call.
_EMULATOR_MAIN = """\
import dataclasses
import sys

from daemon.emulator import EmulatorConfig, create_app
from daemon.http.serving import run_until_stopped
config = dataclasses.replace(EmulatorConfig.from_env(), execute_runs=False)
run_until_stopped(create_app(config), sys.argv[1], int(sys.argv[2]), log_level="warning")
"""


class BenchmarkError(Exception):
    """The drain did not end as it must (a dlqId not resumed, or resumed twice)."""


@dataclass(frozen=True)
class Options:
    entries: int
    rate: int
    naive_entries: int
    skip_naive: bool
    replicas: int = 1
    store: str = "sqlite"
    fetch: str = "always"  # RECOVERYD_FETCH
    outage: float | None = None  # seconds the service is down while the callbacks arrive
    service: str = "announcing"  # or "silent": the limit told on 429s only, a sliding second
    rounds: int = 1  # drains by each recoveryd, the order alternating
    against: str | None = None  # a git revision whose recoveryd drains the same backlog too


@dataclass(frozen=True)
class Drain:
    """One client's drain of `entries` dlqIds, as the emulator saw it."""

    name: str
    entries: int
    required_calls: int  # the fewest calls this way of draining can make
    rate: int
    seconds: float
    gets: int
    bulks: int
    others: int
    rate_limited: int
    rate_limited_by_second: Counter[int]
    rate_limited_after_the_first: int  # 429s but the first answer's
    episodes: int = 0  # runs of 429s, each within EPISODE_GAP s of the one before

    @property
    def calls(self) -> int:
        return self.gets + self.bulks + self.others

    @property
    def calls_per_run(self) -> float:
        return self.calls / self.entries

    @property
    def minimum_seconds(self) -> float:
        return self.required_calls / self.rate

    @property
    def share(self) -> float:
        """The drain rate as a share of what the limit allows: minimum / actual time."""
        return self.minimum_seconds / self.seconds

    @property
    def runs_per_second(self) -> float:
        return self.entries / self.seconds


# The processes.


@contextlib.contextmanager
def emulator_server(workdir: Path, rate: int, service: str = "announcing") -> Iterator[Server]:
    """The emulator enforcing `rate` requests per second, runs recorded but not executed;
    a `silent` service tells its limit only on 429s and counts it in a sliding second."""
    port = free_port()
    # Every credential set, so that none is generated and printed to its log.
    settings = {
        "EMULATOR_TOKEN": TOKEN,
        "EMULATOR_PASSWORD": "pw_bench_drain",
        "EMULATOR_SIGNING_KEY_CURRENT": SIGNING_KEY,
        "EMULATOR_SIGNING_KEY_NEXT": SIGNING_KEY[::-1],
        "EMULATOR_MAX_RPS": str(rate),
    }
    if service == "silent":
        settings |= {
            "EMULATOR_RATE_LIMIT_HEADERS": "on_429",
            "EMULATOR_RATE_LIMIT_WINDOW": "sliding",
        }
    command = [sys.executable, "-c", _EMULATOR_MAIN, HOST, str(port)]
    with _running("emulator", command, port, workdir, "/_emulator/stats", settings) as server:
        yield server


@contextlib.contextmanager
def recoveryd_servers(
    workdir: Path,
    service_url: str,
    options: Options,
    revision: Revision | None = None,
    tag: str = "",
) -> Iterator[list[Server]]:
    """`recoveryd serve` as shipped (production pipeline tuning), with the one-rule file:
    one on SQLite, or `options.replicas` on one PostgreSQL store, each fresh; run from
    `revision`'s tree if given (this one by default), `tag` naming its files apart."""
    rules = workdir / "rules.yaml"
    rules.write_text(RULES)
    with contextlib.ExitStack() as stack:
        if options.store == "sqlite":
            store: Path | str = workdir / f"recoveryd-{options.fetch}{tag}.db"
            more: dict[str, str] = {}
        else:
            try:
                store = stack.enter_context(durable_server()).url
            except Unavailable as exc:
                raise BenchmarkError(f"no PostgreSQL: {exc}") from None
            # Heartbeats every second: the replicas find each other, and their parts of
            # the limit, within seconds of starting.
            more = {"RECOVERYD_REPLICA_LEASE": "3s"}
        more["RECOVERYD_FETCH"] = options.fetch
        started = []
        name, repo = (
            (revision.name, revision.tree) if revision else ("recoveryd serve", servers.REPO)
        )
        for number in range(options.replicas):
            folder = workdir / f"{options.fetch}{tag}-replica-{number}"
            folder.mkdir()
            started.append(stack.enter_context(servers.recoveryd_server(
                folder, store, SIGNING_KEY, name=f"{name} #{number}", service_url=service_url,
                rules=rules, token=TOKEN, more_settings=more, repo=repo,
            )))  # fmt: skip
        if options.store == "postgres":
            asyncio.run(all_see_each_other(started))
        yield started


async def all_see_each_other(replicas: Sequence[Server]) -> None:
    """Until each replica counts them all (30 s at most), then two heartbeats more: a
    replica takes its part of the limit once the others have seen it
    (daemon/runtime/replicas.py)."""
    wanted = f"recoveryd_replicas {float(len(replicas))}"

    async def counts_all(http: httpx.AsyncClient, replica: Server) -> bool:
        metrics = await http.get(f"{url_of(replica, replica.admin_port)}/metrics")
        return wanted in metrics.text

    async with httpx.AsyncClient(timeout=5) as http, asyncio.timeout(30):
        for replica in replicas:
            while not await counts_all(http, replica):  # noqa: ASYNC110 (another process)
                await asyncio.sleep(POLL)
    await asyncio.sleep(2.0)


def url_of(server: Server, port: int | None = None) -> str:
    return f"http://{server.host}:{port or server.port}"


# The emulator's side: seed, then read back what happened.


async def seed(control: httpx.AsyncClient, count: int) -> list[str]:
    """`count` workflow DLQ entries, in chunks so that no request is huge."""
    dlq_ids: list[str] = []
    for start in range(0, count, SEED_CHUNK):
        messages = [
            {"url": "https://app.example.com/wf", "workflowRunId": f"wfr_{i}"}
            for i in range(start, min(count, start + SEED_CHUNK))
        ]
        response = await control.post("/_emulator/dlq", json={"messages": messages})
        response.raise_for_status()
        dlq_ids += response.json()["dlqIds"]
    return dlq_ids


@dataclass(frozen=True)
class Seen:
    """What the emulator recorded of one drain."""

    journal: list[dict[str, Any]]  # the calls that met an outage left out
    stats: dict[str, int]
    runs: list[dict[str, Any]]
    met_outage: int = 0  # calls the outage answered

    def count(self) -> Counter[str]:
        """Service calls by kind: get, bulk or other."""
        return Counter(_kind(call) for call in self.journal)

    def rate_limited_by_second(self) -> Counter[int]:
        """429s by the emulator's one-second window, 0 being the window of the first call:
        the client learns the limit from the first answers, inside window 0."""
        first = math.floor(min(call["at"] for call in self.journal))
        return Counter(
            math.floor(call["at"]) - first for call in self.journal if call["status"] == 429
        )

    def tightest(self, count: int) -> tuple[float, float]:
        """The shortest time in which `count` calls arrived, and when (from the first call).
        Under one second, they could not all fit in one second of the limit."""
        arrivals = sorted(call["at"] for call in self.journal)
        span, start = min(
            (arrivals[i + count - 1] - arrivals[i], arrivals[i])
            for i in range(len(arrivals) - count + 1)
        )
        return span, start - arrivals[0]

    def bulk_sizes(self) -> list[int]:
        return [
            sum(name == "dlqIds" for name, _ in call["query"])
            for call in self.journal
            if _kind(call) == "bulk" and call["status"] == 200
        ]


def _kind(call: dict[str, Any]) -> str:
    if call["method"] == "GET" and call["path"].startswith(GET_PREFIX):
        return "get"
    return "bulk" if call["path"] == BULK_PATH else "other"


async def read_back(control: httpx.AsyncClient) -> Seen:
    async def get(path: str) -> Any:
        return (await control.get(f"/_emulator/{path}")).raise_for_status().json()

    journal = await get("journal")
    served = [call for call in journal if not call.get("outage")]
    return Seen(served, await get("stats"), await get("runs"), len(journal) - len(served))


def check_runs(name: str, seen: Seen, dlq_ids: Sequence[str]) -> None:
    """Every seeded dlqId resumed exactly once, and nothing else."""
    sources = Counter(run["sourceDlqId"] for run in seen.runs)
    twice = sum(1 for count in sources.values() if count > 1)
    missing = len(set(dlq_ids) - set(sources))
    extra = len(set(sources) - set(dlq_ids))
    if twice or missing or extra or any(run["mode"] != "resume" for run in seen.runs):
        raise BenchmarkError(
            f"{name}: {len(seen.runs):,} runs for {len(dlq_ids):,} dlqIds: {missing} not "
            f"resumed, {twice} resumed more than once, {extra} not seeded"
        )


def drain_of(
    name: str, seen: Seen, entries: int, required: int, rate: int, seconds: float
) -> Drain:
    kinds = seen.count()
    return Drain(
        name=name,
        entries=entries,
        required_calls=required,
        rate=rate,
        seconds=seconds,
        gets=kinds["get"],
        bulks=kinds["bulk"],
        others=kinds["other"],
        rate_limited=seen.stats["rate_limited"],
        rate_limited_by_second=seen.rate_limited_by_second(),
        rate_limited_after_the_first=sum(
            call["status"] == 429 for call in sorted(seen.journal, key=lambda c: c["at"])[1:]
        ),
        episodes=episodes(call["at"] for call in seen.journal if call["status"] == 429),
    )


def episodes(refused_at: Iterable[float]) -> int:
    """How many runs of 429s there were, each 429 within EPISODE_GAP s of the one before."""
    times = sorted(refused_at)
    return sum(1 for i, at in enumerate(times) if i == 0 or at - times[i - 1] > EPISODE_GAP)


# recoveryd's drain.


async def post_callbacks(recoveryd: Sequence[Server], dlq_ids: Sequence[str]) -> float:
    """Each dlqId's signed callback, to each replica in turn (each signed for the first:
    replicas share one public URL), over keep-alive connections (POSTERS a replica, or
    more) from bench.loadgen, signed before the first is sent (tokens live 300 s); each
    must be accepted. The wall-clock time the last one was."""
    callbacks = SignedCallbacks(json.loads(SAMPLE.read_text()))
    signed_for = f"{url_of(recoveryd[0])}/callbacks"
    shares = [
        (replica, callbacks.requests(replica.host, replica.port, ids, signed_for), ids)
        for number, replica in enumerate(recoveryd)
        if (ids := dlq_ids[number :: len(recoveryd)])
    ]
    rounds = await asyncio.gather(*(
        drive(replica.host, replica.port, requests,
              connections=max(POSTERS, math.ceil(len(requests) / REQUESTS_PER_CONNECTION)))
        for replica, requests, _ in shares
    ))  # fmt: skip
    for (replica, _, ids), sent in zip(shares, rounds, strict=True):
        for dlq_id, status, body in zip(ids, sent.statuses, sent.bodies, strict=True):
            if status != 200 or json.loads(body) != {"status": "accepted", "dlqId": dlq_id}:
                raise BenchmarkError(f"callback {dlq_id} to {replica.name}: {status} {body!r}")
    return time.time()


async def wait_done(admin_url: str, count: int) -> dict[str, int]:
    """Poll recoveryd's status until `count` dlqIds are done; its counts by state then."""
    async with httpx.AsyncClient(base_url=admin_url, timeout=30) as admin:
        while True:
            states: dict[str, int] = (await admin.get("/api/v1/status")).json()["states"]
            if states["done"] >= count:
                return states
            await asyncio.sleep(POLL)


@dataclass(frozen=True)
class Timeline:
    """Where recoveryd's drain time went: seconds from the first callback sent, on the
    wall clock, which the emulator's journal uses too."""

    first_call: float
    callbacks_accepted: float
    last_get: float | None  # None: no GET made
    last_bulk: float
    done_seen: float

    @classmethod
    def of(cls, seen: Seen, started: float, posted: float, seconds: float) -> Timeline:
        def last(kind: str) -> float | None:
            at = max((call["at"] for call in seen.journal if _kind(call) == kind), default=None)
            return None if at is None else at - started

        first: float = min(call["at"] for call in seen.journal)
        last_bulk = last("bulk")
        assert last_bulk is not None  # check_runs found every dlqId resumed
        return cls(first - started, posted - started, last("get"), last_bulk, seconds)


async def send_and_wait(recoveryd: Sequence[Server], dlq_ids: Sequence[str], rate: int) -> float:
    """Send the callbacks while polling recoveryd's status until every dlqId is done;
    the wall-clock time the last callback was accepted. Whichever fails first ends the
    wait: a refused callback need not wait for the timeout, three times what the GETs
    alone need at `rate`, and 30 s."""
    timeout = 30 + 3 * len(dlq_ids) / rate
    posting = asyncio.create_task(post_callbacks(recoveryd, dlq_ids))
    admin = url_of(recoveryd[0], recoveryd[0].admin_port)  # counts are the store's: shared
    waiting = asyncio.create_task(wait_done(admin, len(dlq_ids)))
    done, late = await asyncio.wait(
        {posting, waiting}, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION
    )
    for task in late:
        task.cancel()
    for task in done:
        task.result()  # raises what failed
    if late:
        raise BenchmarkError(f"recoveryd had not drained after {timeout:.0f} s")
    states = waiting.result()
    if states["done"] != len(dlq_ids) or sum(states.values()) != len(dlq_ids):
        raise BenchmarkError(f"recoveryd ended with {states}")
    return posting.result()


async def send_in_outage(
    control: httpx.AsyncClient,
    recoveryd: Sequence[Server],
    dlq_ids: Sequence[str],
    options: Options,
) -> tuple[float, float]:
    """The service down (503s) while the callbacks are sent and until `options.outage`
    seconds after the first, then back; wait until every dlqId is done. The wall-clock
    times the last callback was accepted and the service came back."""
    assert options.outage is not None
    (await control.post("/_emulator/outage", json={"mode": "503"})).raise_for_status()
    down = time.time()
    posted = await post_callbacks(recoveryd, dlq_ids)
    await asyncio.sleep(max(0.0, down + options.outage - time.time()))
    back = time.time()
    (await control.delete("/_emulator/outage")).raise_for_status()
    timeout = 30 + 3 * len(dlq_ids) / options.rate
    admin = url_of(recoveryd[0], recoveryd[0].admin_port)
    try:
        states = await asyncio.wait_for(wait_done(admin, len(dlq_ids)), timeout)
    except TimeoutError:
        raise BenchmarkError(
            f"recoveryd had not drained {timeout:.0f} s after the outage"
        ) from None
    if states["done"] != len(dlq_ids) or sum(states.values()) != len(dlq_ids):
        raise BenchmarkError(f"recoveryd ended with {states}")
    return posted, back


async def drain_recoveryd(
    control: httpx.AsyncClient, recoveryd: Sequence[Server], options: Options
) -> tuple[Drain, Seen, Timeline]:
    (await control.post("/_emulator/reset")).raise_for_status()
    dlq_ids = await seed(control, options.entries)
    bulks = math.ceil(options.entries / MAX_BULK)
    required = bulks if options.fetch == "needed" else options.entries + bulks
    # Wall clock, as the emulator's journal timestamps are: the timeline compares them.
    started = time.time()
    if options.outage is None:
        posted = await send_and_wait(recoveryd, dlq_ids, options.rate)
        seconds = time.time() - started
    else:
        posted, back = await send_in_outage(control, recoveryd, dlq_ids, options)
        seconds = time.time() - back
    seen = await read_back(control)
    check_runs(options.fetch, seen, dlq_ids)
    drain = drain_of(options.fetch, seen, options.entries, required, options.rate, seconds)
    return drain, seen, Timeline.of(seen, started, posted, seconds)


# The naive baseline.


async def drain_naive(control: httpx.AsyncClient, url: str, options: Options) -> Drain:
    """GET each dlqId, then resume it alone, NAIVE_WORKERS at a time, through a
    ServiceClient whose limiter learns the limit from the answers (recoveryd's defaults)."""
    (await control.post("/_emulator/reset")).raise_for_status()
    dlq_ids = await seed(control, options.naive_entries)
    todo = iter(dlq_ids)
    async with httpx.AsyncClient(timeout=10) as http:
        client = ServiceClient(
            http,
            base_url=url,
            credentials=CredentialsHolder(Credentials(TOKEN)),
            limiter=RateLimiter(),
        )

        async def worker() -> None:
            for dlq_id in todo:
                await client.get_dlq_message(dlq_id)
                await client.bulk("resume", dlq_ids=[dlq_id])

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(NAIVE_WORKERS)))
        seconds = time.monotonic() - started
    seen = await read_back(control)
    check_runs("naive", seen, dlq_ids)
    required = 2 * options.naive_entries
    return drain_of("naive", seen, options.naive_entries, required, options.rate, seconds)


# The report.


_ROW = "{:<10} {:>7} {:>7} {:>6} {:>5} {:>9} {:>8} {:>7} {:>8} {:>5}"


def print_table(drains: Sequence[Drain]) -> None:
    print()
    print(_ROW.format("", "entries", "GET", "bulk", "other", "calls/run", "drain s", "min s",
                      "of limit", "429s"))  # fmt: skip
    for d in drains:
        print(_ROW.format(
            d.name, f"{d.entries:,}", f"{d.gets:,}", f"{d.bulks:,}", f"{d.others:,}",
            f"{d.calls_per_run:.3f}", f"{d.seconds:.1f}", f"{d.minimum_seconds:.1f}",
            f"{d.share:.1%}", f"{d.rate_limited:,}",
        ))  # fmt: skip
    print(
        "(calls: every service call the emulator answered, 429s included; min s: the fewest "
        "calls that way of draining needs, at the limit; of limit: min s / drain s)"
    )
    for d in drains:
        if d.rate_limited:
            seconds = ", ".join(
                f"{n} in second {s}" for s, n in sorted(d.rate_limited_by_second.items())
            )
            print(f"{d.name} 429s: {seconds} (0: the emulator's second of the first call)")


def print_details(drain: Drain, seen: Seen, timeline: Timeline) -> None:
    """What explains recoveryd's share of the limit."""
    sizes = seen.bulk_sizes()
    steady = drain.calls / max(timeline.last_bulk - timeline.first_call, 1e-3)
    last_get = "none made" if timeline.last_get is None else f"{timeline.last_get:.2f}"
    print(
        f"\nrecoveryd ({drain.name}) timeline (s after the first callback sent): first "
        f"service call {timeline.first_call:.2f}, every callback accepted "
        f"{timeline.callbacks_accepted:.2f}, last GET {last_get}, last bulk call "
        f"{timeline.last_bulk:.2f}, all done seen {timeline.done_seen:.2f}"
    )
    print(
        f"recoveryd between its first and last call: {steady:.1f} calls/s "
        f"({steady / drain.rate:.1%} of the limit); busiest emulator second: "
        f"{seen.stats['max_requests_in_window']} calls; bulk calls carried "
        f"{sum(sizes) / len(sizes):.1f} dlqIds on average ({min(sizes)} to {max(sizes)})"
    )
    if len(seen.journal) > drain.rate:
        span, at = seen.tightest(drain.rate + 1)
        print(
            f"recoveryd's {drain.rate + 1} closest calls arrived within {span:.3f} s "
            f"(from {at:.1f} s after its first call); its limiter starts at most "
            f"{drain.rate} in any second plus its headroom"
        )


def print_comparison(recoveryd: Drain, other: Drain) -> None:
    scaled = other.entries and other.seconds * recoveryd.entries / other.entries
    if other.entries != recoveryd.entries:
        print(
            f"\n{other.name} measured on {other.entries:,} entries; scaled to "
            f"{recoveryd.entries:,} at the same rate per run it would take {scaled:.1f} s"
        )
    print(
        f"recoveryd ({recoveryd.name}) drains {scaled / recoveryd.seconds:.2f}x as fast as "
        f"{other.name} ({recoveryd.runs_per_second:,.0f} against "
        f"{other.runs_per_second:,.1f} runs/s)"
    )


def print_against(this: Sequence[Measured], other: Sequence[Measured], revision: str) -> None:
    """Each recoveryd's drain rate and calls per run, median of its rounds, and the ratio
    of the rates: this tree's over the revision's."""
    print(f"\nthis tree against {revision}, {len(this)} drains each, the order alternating:")
    rates = []
    for name, rounds in (("this tree", this), (f"recoveryd @{revision}", other)):
        drains = [drain for drain, _, _ in rounds]
        rate = statistics.median(drain.runs_per_second for drain in drains)
        calls = statistics.median(drain.calls_per_run for drain in drains)
        spread = ", ".join(f"{drain.runs_per_second:,.1f}" for drain in drains)
        print(f"  {name:<24} {rate:7,.1f} runs/s  {calls:.3f} calls/run  (rounds: {spread})")
        rates.append(rate)
    print(f"ratio this tree / {revision}: {rates[0] / rates[1]:.3f} (drain rate, median of rounds)")


def print_targets(drain: Drain, always: Drain | None, service: str = "announcing") -> None:
    if always is not None:
        speedup = drain.runs_per_second / always.runs_per_second
        print_verdicts([
            (
                f"calls per recovered run <= {TARGET_NEEDED_CALLS_PER_RUN}",
                f"{drain.calls_per_run:.3f}",
                drain.calls_per_run <= TARGET_NEEDED_CALLS_PER_RUN,
            ),
            (
                f"drain rate >= {TARGET_NEEDED_SPEEDUP:.0f}x that of --fetch always",
                f"{speedup:.1f}x",
                speedup >= TARGET_NEEDED_SPEEDUP,
            ),
            (
                "no 429 after the first answer",
                f"{drain.rate_limited_after_the_first}",
                drain.rate_limited_after_the_first == 0,
            ),
        ])  # fmt: skip
        return
    if service == "silent":
        print_verdicts([
            (
                f"drain rate >= {TARGET_SILENT_SHARE:.0%} of the theoretical limit",
                f"{drain.share:.1%}",
                drain.share >= TARGET_SILENT_SHARE,
            ),
            (
                f"upstream calls per recovered run < {TARGET_CALLS_PER_RUN}",
                f"{drain.calls_per_run:.3f}",
                drain.calls_per_run < TARGET_CALLS_PER_RUN,
            ),
            (
                f"429s in one discovery episode (429s within {EPISODE_GAP:g} s of each other)",
                f"{drain.rate_limited} in {drain.episodes}",
                drain.episodes <= 1,
            ),
        ])  # fmt: skip
        return
    verdicts = [
        (
            f"drain rate >= {TARGET_SHARE:.0%} of the theoretical limit",
            f"{drain.share:.1%}",
            drain.share >= TARGET_SHARE,
        ),
        (
            f"upstream calls per recovered run < {TARGET_CALLS_PER_RUN}",
            f"{drain.calls_per_run:.3f}",
            drain.calls_per_run < TARGET_CALLS_PER_RUN,
        ),
        (
            "zero 429s once the limit is known (all 429s counted)",
            f"{drain.rate_limited}",
            drain.rate_limited == 0,
        ),
    ]
    print_verdicts(verdicts)


def print_outage_targets(drain: Drain, seen: Seen, outage: float) -> None:
    """After an outage the clock starts at the service's return: the bound of issue 35."""
    bound = TARGET_OUTAGE_FACTOR * drain.minimum_seconds + TARGET_OUTAGE_SLACK
    print(
        f"\nafter a {outage:g} s outage ({seen.met_outage:,} calls met it, left out above): "
        f"drained {drain.seconds:.1f} s after the service returned, theoretical "
        f"{drain.minimum_seconds:.1f} s, bound {bound:.1f} s"
    )
    print_verdicts([
        (
            f"drained within {TARGET_OUTAGE_FACTOR}x the theoretical time + "
            f"{TARGET_OUTAGE_SLACK:g} s of the return",
            f"{drain.seconds:.1f} s",
            drain.seconds <= bound,
        ),
        (
            f"upstream calls per recovered run < {TARGET_CALLS_PER_RUN}",
            f"{drain.calls_per_run:.3f}",
            drain.calls_per_run < TARGET_CALLS_PER_RUN,
        ),
    ])  # fmt: skip


def print_verdicts(verdicts: Sequence[tuple[str, str, bool]]) -> None:
    print()
    for text, value, met in verdicts:
        print(f"{'PASS' if met else 'MISS'}  {text}: {value}")


def report_exit(recoveryd: Server) -> None:
    status = recoveryd.stop()
    problems = log_problems(recoveryd.log)
    print(
        f"\n{recoveryd.name}: exit status {status} after SIGTERM; {len(problems)} log lines "
        "at warning level or above" + (f", the first: {problems[0]}" if problems else "")
    )
    if status != 0:
        raise BenchmarkError(
            f"{recoveryd.name} must exit 0 after SIGTERM" + log_tail(recoveryd.log)
        )


def print_header(options: Options) -> None:
    naive = f"{options.naive_entries:,} entries"
    if options.skip_naive or options.against is not None:
        naive = "skipped"
    store = "SQLite" if options.store == "sqlite" else "one PostgreSQL (fsync on)"
    always = (
        f"; RECOVERYD_FETCH=always beside it: {options.naive_entries:,} entries"
        if options.fetch == "needed"
        else ""
    )
    print(
        f"recoveryd drain: {options.entries:,} workflow DLQ entries, the emulator enforcing "
        f"{options.rate} requests/s ({options.service} service); {options.replicas} recoveryd "
        f"on {store} with RECOVERYD_FETCH={options.fetch}{always}; naive baseline: {naive}"
    )
    if options.against is not None:
        print(
            f"against recoveryd at {options.against}: {options.rounds} drains each, the same "
            "backlog (the emulator reset), which goes first alternating"
        )
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start",
        flush=True,
    )


Measured = tuple[Drain, Seen, Timeline]


async def measure(emulator: Server, recoveryd: Sequence[Server], options: Options) -> Measured:
    """recoveryd's drain, its processes stopped after it (out of the next drain's way)."""
    async with httpx.AsyncClient(base_url=url_of(emulator), timeout=60) as control:
        measured = await drain_recoveryd(control, recoveryd, options)
    for replica in recoveryd:
        report_exit(replica)
    return measured


async def measure_naive(emulator: Server, options: Options) -> Drain:
    async with httpx.AsyncClient(base_url=url_of(emulator), timeout=60) as control:
        return await drain_naive(control, url_of(emulator), options)


def drain_rounds(
    workdir: Path, emulator: Server, options: Options, revision: Revision | None
) -> tuple[list[Measured], list[Measured]]:
    """`options.rounds` drains of the same backlog (the emulator reset, a fresh recoveryd
    each time) by this tree's recoveryd and, given `revision`, by that revision's, which
    goes first alternating, so that drift on a noisy machine hits both alike."""
    this: list[Measured] = []
    other: list[Measured] = []
    for number in range(1, options.rounds + 1):
        sides = [(None, this), (revision, other)] if revision else [(None, this)]
        for side, results in sides if number % 2 else reversed(sides):
            tag = f"-{'against' if side else 'this'}-{number}"
            with recoveryd_servers(workdir, url_of(emulator), options, side, tag) as recoveryd:
                drain, seen, timeline = asyncio.run(measure(emulator, recoveryd, options))
            if side is not None:
                drain = dataclasses.replace(drain, name=f"@{side.revision[:9]}")
            results.append((drain, seen, timeline))
            if options.rounds > 1:
                print(f"round {number}  {side.name if side else 'this tree':<20} "
                      f"{drain.runs_per_second:7,.1f} runs/s  {drain.calls_per_run:.3f} "
                      f"calls/run  {drain.seconds:.1f} s", flush=True)  # fmt: skip
    return this, other


def median_round(rounds: Sequence[Measured]) -> Measured:
    """The round of the median drain rate (the lower of the middle two)."""
    rates = [drain.runs_per_second for drain, _, _ in rounds]
    return rounds[rates.index(statistics.median_low(rates))]


def run(options: Options) -> None:
    print_header(options)
    with (
        tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp,
        emulator_server(Path(tmp), options.rate, options.service) as emulator,
        contextlib.ExitStack() as up,
    ):
        workdir = Path(tmp)
        revision = None
        if options.against is not None:
            revision = up.enter_context(servers.revision(options.against, workdir))
        this, other = drain_rounds(workdir, emulator, options, revision)
        drain, seen, timeline = median_round(this)
        always = None
        if options.fetch == "needed":
            beside = dataclasses.replace(options, fetch="always", entries=options.naive_entries)
            with recoveryd_servers(workdir, url_of(emulator), beside) as recoveryd:
                always = asyncio.run(measure(emulator, recoveryd, beside))[0]
        skip_naive = options.skip_naive or options.against is not None
        naive = None if skip_naive else asyncio.run(measure_naive(emulator, options))
    against = median_round(other)[0] if other else None
    drains = [drain, *(d for d in (against, always, naive) if d is not None)]
    print_table(drains)
    print_details(drain, seen, timeline)
    for baseline in (always, naive):
        if baseline is not None:
            print_comparison(drain, baseline)
    if options.against is not None:
        print_against(this, other, options.against)
    if options.outage is not None:
        print_outage_targets(drain, seen, options.outage)
    else:
        print_targets(drain, always, options.service)


def parse_options(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.drain",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--entries", type=positive_int, default=10_000)
    parser.add_argument("--rate", type=positive_int, default=200, help="the limit, requests/s")
    parser.add_argument(
        "--naive-entries", type=positive_int, default=2_000, help="entries the baseline drains"
    )
    parser.add_argument("--skip-naive", action="store_true", help="measure recoveryd only")
    parser.add_argument(
        "--replicas", type=positive_int, default=1, help="recoveryd processes (PostgreSQL if > 1)"
    )
    parser.add_argument("--store", choices=("sqlite", "postgres"), default=None)
    parser.add_argument(
        "--fetch", choices=("always", "needed"), default="always", help="RECOVERYD_FETCH"
    )
    parser.add_argument(
        "--outage", type=parse_duration, default=None,
        help="the service down this long (e.g. 60s) while the callbacks arrive",
    )  # fmt: skip
    parser.add_argument(
        "--service",
        choices=("announcing", "silent"),
        default="announcing",
        help="the limit on every answer, or only on 429s (counted in a sliding second)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=None,
        help="drains by each recoveryd, the median reported (default: 1, 2 with --against)",
    )
    parser.add_argument(
        "--against",
        metavar="REVISION",
        help="also drain the same backlog with recoveryd as it was at this git revision (a "
        "worktree), the order alternating over --rounds, and print this tree's drain rate "
        "over it; the naive loop is skipped then, to keep the run short",
    )
    args = parser.parse_args(argv)
    store = args.store or ("postgres" if args.replicas > 1 else "sqlite")
    if store == "sqlite" and args.replicas > 1:
        parser.error("--replicas above 1 needs --store postgres: SQLite is one process's")
    return Options(
        args.entries,
        args.rate,
        args.naive_entries,
        args.skip_naive,
        args.replicas,
        store,
        args.fetch,
        args.outage,
        args.service,
        args.rounds or (2 if args.against else 1),
        args.against,
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        run(parse_options(argv))
    except (BenchmarkError, ServerError, httpx.HTTPError) as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
