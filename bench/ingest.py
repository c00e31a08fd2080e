"""Signed callbacks/s that `recoveryd serve` stores durably, against a bare uvicorn app.

Five servers run as their own processes: `recoveryd serve` on a fresh SQLite store; a
bare ASGI app (bench.baselines) that reads the body and answers 200, under uvicorn with
the settings of recoveryd's listener (one process, uvloop, httptools, no access log);
the naive peer (bench.naive: FastAPI, PyJWT, one SQLite insert and commit per request
with synchronous=FULL) under the same uvicorn; recoveryd's public listener and receiver
with a store that keeps nothing (bench.receiver_only), whose rate is the most any store
could give recoveryd here; and a raw asyncio server that answers
without parsing, against which the load generator (bench.loadgen, in this process)
shows its own ceiling. All get the same load: the
sample failure callback with a dlqId never sent before, signed just before its round,
over the same keep-alive connections in a closed loop. After a warm-up, timed rounds
alternate between the servers so that drift on a noisy machine hits them alike; a
server's rate is its median round, its latencies are over all its rounds.
With `--store sqlite,postgres` (the default) recoveryd runs twice, on SQLite and on a
PostgreSQL server the bench starts on loopback (bench/postgres.py: fsync,
synchronous_commit and full_page_writes on, as durable as SQLite's synchronous=FULL),
both in the same alternating rounds; a machine without PostgreSQL's binaries skips it
and says why. Every answer must be a 200 (from recoveryd, "accepted" for the dlqId sent)
and each store must end up holding exactly the dlqIds it accepted, or the run fails
with status 1.
Targets: recoveryd/bare >= 0.4, and recoveryd faster than the naive peer. `--profile`
samples recoveryd with py-spy during one extra round and prints its heaviest functions.
`--against REVISION` also runs recoveryd as it was at a git revision (a worktree of it,
on SQLite) in the same rounds, and prints this tree's rate over it: a change measured
against what it changed, on the same noisy machine at the same moments.
Run: python -m bench.ingest [--requests N] [--connections N] [--rounds N] [--profile]
                            [--store sqlite,postgres] [--against REVISION]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import pyspy, servers
from bench.loadgen import LoadError, Round, run_round
from bench.options import positive_int
from bench.postgres import PostgresServer, Unavailable, durable_server
from bench.servers import (
    Server,
    ServerError,
    bare_server,
    log_tail,
    naive_server,
    raw_server,
    receiver_server,
    recoveryd_server,
)
from daemon.emulator.signing import sign

SAMPLE = Path(__file__).resolve().parent.parent / "tests/testdata/samples/failure-callback.json"
SIGNING_KEY = "bench-signing-key-0123456789abcdef"  # the daemon wants at least 32 bytes
ISSUER = "Service"
TARGET_RATIO = 0.4
_COMMIT_METRIC = "recoveryd_store_commit_callbacks"
# The generator counts as out of the way when it can drive the cheapest server at least
# this many times faster than the bare app answers.
CEILING_MARGIN = 2.0


class BenchmarkError(Exception):
    """An answer or the store is not what recoveryd promises: the figures would be void."""


@dataclass(frozen=True)
class Options:
    requests: int
    connections: int
    rounds: int
    warmup: int
    profile: bool
    stores: tuple[str, ...] = ("sqlite", "postgres")
    against: str | None = None  # a git revision whose recoveryd runs in the same rounds


@dataclass(frozen=True)
class Target:
    """A server under load; `accepts` when its answers must say "accepted" for each dlqId,
    `stores` when its store must then hold each one too."""

    server: Server
    stores: bool = False
    accepts: bool = False

    @property
    def name(self) -> str:
        return self.server.name


@dataclass(frozen=True)
class Batch:
    """A round's requests as bytes, and the dlqId each one carries."""

    requests: list[bytes]
    dlq_ids: list[str]


class SignedCallbacks:
    """The sample failure callback, each time with a new dlqId, signed as the service
    signs (daemon.emulator.signing)."""

    def __init__(self, sample: dict[str, Any]) -> None:
        self._sample = sample
        # Shaped like the service's ids (`<ms>-<n>`), fixed width so all requests and
        # all answers are the same size.
        self._prefix = f"{int(time.time() * 1000):013d}"
        self._numbers = itertools.count()

    def batch(self, host: str, port: int, count: int) -> Batch:
        """`count` requests for the server at `host:port`. The tokens are valid for 300 s
        from now, so build a batch just before sending it."""
        dlq_ids = [f"{self._prefix}-{next(self._numbers):07d}" for _ in range(count)]
        return Batch(self.requests(host, port, dlq_ids), dlq_ids)

    def requests(
        self, host: str, port: int, dlq_ids: Sequence[str], url: str | None = None
    ) -> list[bytes]:
        """The request of each dlqId for the server at `host:port`, signed for `url` (by
        default the server's own /callbacks)."""
        url = url or f"http://{host}:{port}/callbacks"
        now = time.time()
        return [self._request(host, port, url, dlq_id, now) for dlq_id in dlq_ids]

    def _request(self, host: str, port: int, url: str, dlq_id: str, now: float) -> bytes:
        body = json.dumps(self._sample | {"dlqId": dlq_id}, separators=(",", ":")).encode()
        signature = sign(body, url=url, key=SIGNING_KEY, issuer=ISSUER, now=now)
        head = (
            f"POST /callbacks HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{ISSUER}-Signature: {signature}\r\n\r\n"
        )
        return head.encode("ascii") + body


class Bench:
    """Runs rounds against the targets, checks every answer, and remembers which dlqIds
    recoveryd accepted."""

    def __init__(self, callbacks: SignedCallbacks, connections: int) -> None:
        self._callbacks = callbacks
        self._connections = connections
        self.accepted: dict[str, set[str]] = {}  # by server name

    def prepare(self, target: Target, count: int) -> Batch:
        return self._callbacks.batch(target.server.host, target.server.port, count)

    def run(self, target: Target, batch: Batch) -> Round:
        """One round of `batch`; BenchmarkError if any answer is not what it must be."""
        server = target.server
        result = run_round(
            server.host,
            server.port,
            batch.requests,
            connections=self._connections,
            server_cpu_seconds=server.cpu_seconds,
        )
        _check_answers(target, result, batch.dlq_ids)
        if target.stores:
            self.accepted.setdefault(target.name, set()).update(batch.dlq_ids)
        return result

    def round(self, target: Target, count: int) -> Round:
        return self.run(target, self.prepare(target, count))


def _check_answers(target: Target, result: Round, dlq_ids: Sequence[str]) -> None:
    problems: Counter[str] = Counter()
    example = ""
    for status, body, dlq_id in zip(result.statuses, result.bodies, dlq_ids, strict=True):
        if status != 200:
            problem = f"status {status}"
        elif (target.accepts or target.stores) and not _accepted(body, dlq_id):
            problem = "200 but not accepted"
        else:
            continue
        problems[problem] += 1
        example = example or f"{problem}: {body[:300]!r}"
    if problems:
        counts = ", ".join(f"{count} x {problem}" for problem, count in problems.items())
        hint = " (tokens expire 300 s after signing: is the round too long?)"
        raise BenchmarkError(
            f"{target.name} gave {sum(problems.values())} bad answers of {len(dlq_ids)}: "
            f"{counts}{hint if problems['status 401'] else ''}\n  first: {example}"
            + log_tail(target.server.log)
        )


def _accepted(body: bytes, dlq_id: str) -> bool:
    try:
        return bool(json.loads(body) == {"status": "accepted", "dlqId": dlq_id})
    except ValueError:
        return False


def measure(bench: Bench, targets: Sequence[Target], options: Options) -> dict[str, list[Round]]:
    """Warm every target up, then the timed rounds, alternating between the targets."""
    sizes: set[int] = set()
    for target in targets:
        batch = bench.prepare(target, options.warmup)
        sizes.update(len(request) for request in batch.requests)
        bench.run(target, batch)
    # One size for all servers shows that each gets the same requests, byte for byte but
    # for the port number and the ids.
    print(f"warm-up done; every request is {' or '.join(map(str, sorted(sizes)))} bytes")
    rounds: dict[str, list[Round]] = {target.name: [] for target in targets}
    for number in range(1, options.rounds + 1):
        # Reversed every other round, so that no server always follows the same one.
        order = targets if number % 2 else list(reversed(targets))
        for target in order:
            result = bench.round(target, options.requests)
            rounds[target.name].append(result)
            print(f"round {number}  {target.name:<20} {_figures(result)}", flush=True)
    return rounds


def _figures(result: Round) -> str:
    latencies = _percentiles(result.latencies)
    return (
        f"{result.rate:9,.0f} req/s  p50 {latencies[0] * 1e3:6.2f} ms  "
        f"p99 {latencies[1] * 1e3:6.2f} ms  CPU: server {_cpu(result.server_cpu_seconds, result)}"
        f"  generator {_cpu(result.generator_cpu_seconds, result)}"
    )


def _cpu(cpu_seconds: float, result: Round) -> str:
    return f"{cpu_seconds / result.seconds:4.0%}"


def _percentiles(latencies: Sequence[float]) -> tuple[float, float]:
    """p50 and p99."""
    cuts = statistics.quantiles(latencies, n=100)
    return cuts[49], cuts[98]


@dataclass(frozen=True)
class Summary:
    """A server's figures over all its timed rounds."""

    rate: float  # of the median round
    p50: float
    p99: float
    server_cpu: float  # cores kept busy, on average over the rounds
    generator_cpu: float

    @classmethod
    def of(cls, rounds: Sequence[Round]) -> Summary:
        seconds = sum(result.seconds for result in rounds)
        p50, p99 = _percentiles([latency for result in rounds for latency in result.latencies])
        return cls(
            rate=statistics.median(result.rate for result in rounds),
            p50=p50,
            p99=p99,
            server_cpu=sum(result.server_cpu_seconds for result in rounds) / seconds,
            generator_cpu=sum(result.generator_cpu_seconds for result in rounds) / seconds,
        )


def print_summary(
    summaries: dict[str, Summary],
    ceiling: str,
    bare: str,
    naive: str,
    receiver: str,
    recoveryd: Sequence[str],
) -> None:
    columns = ("req/s", "p50 ms", "p99 ms", "CPU: server", "generator")
    print("\n{:<20} {:>9}  {:>7} {:>7}  {:>11} {:>9}".format("", *columns))
    for name, summary in summaries.items():
        print(
            f"{name:<20} {summary.rate:9,.0f}  {summary.p50 * 1e3:7.2f} {summary.p99 * 1e3:7.2f}"
            f"  {summary.server_cpu:11.0%} {summary.generator_cpu:9.0%}"
        )
    print("(req/s: median round; latencies: all rounds; CPU: share of one core)")
    print()
    for name in recoveryd:
        ratio = summaries[name].rate / summaries[bare].rate
        verdict = "PASS" if ratio >= TARGET_RATIO else "BELOW"
        print(f"ratio {name} / {bare}: {ratio:.2f}   target >= {TARGET_RATIO}: {verdict}")
        over = summaries[name].rate / summaries[naive].rate
        verdict = "PASS" if over > 1 else "BELOW"
        print(f"ratio {name} / {naive}: {over:.2f}   target > 1: {verdict}")
    most = summaries[receiver].rate / summaries[bare].rate
    print(
        f"ratio {receiver} / {bare}: {most:.2f}   the most any store could give "
        "recoveryd here; the rest of the gap to the bare app is recoveryd's listener and receiver"
    )
    if most < TARGET_RATIO:
        print(
            f"  under the target of {TARGET_RATIO} already: no store can reach it on this machine"
        )
    headroom = summaries[ceiling].rate / summaries[bare].rate
    if headroom >= CEILING_MARGIN:
        judgement = "the load generator is not the bottleneck"
    else:
        judgement = (
            f"WARNING: under {CEILING_MARGIN:.0f}x, the load generator may be holding the bare "
            "rate down, which would flatter the ratio"
        )
    print(
        f"load generator ceiling ({ceiling}): {summaries[ceiling].rate:,.0f} req/s, "
        f"{headroom:.1f}x the {bare} rate: {judgement}"
    )


def print_group_commits(recoveryd: Server) -> None:
    """How many callbacks a commit carried on average, from recoveryd's own histogram."""
    metrics = httpx.get(f"http://{recoveryd.host}:{recoveryd.admin_port}/metrics").text
    values = dict(
        line.split(" ", 1) for line in metrics.splitlines() if line.startswith(_COMMIT_METRIC)
    )
    commits = float(values[f"{_COMMIT_METRIC}_count"])
    callbacks = float(values[f"{_COMMIT_METRIC}_sum"])
    print(
        f"{recoveryd.name} group commit: {commits:,.0f} commits of {callbacks / commits:.1f} "
        f"callbacks on average, warm-up included ({_COMMIT_METRIC})"
    )


def stored_dlq_ids(store: Path) -> list[str]:
    """Every dlqId in the store, read with SQLite opened read-only."""
    uri = f"{store.as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
        return [row[0] for row in connection.execute("SELECT dlq_id FROM callbacks")]


def check_store(name: str, stored: Sequence[str], accepted: set[str]) -> None:
    """The store must hold each accepted dlqId once, and nothing else."""
    distinct = set(stored)
    line = (
        f"{name} store: {len(stored):,} rows, {len(distinct):,} distinct dlqIds; "
        f'{len(accepted):,} dlqIds were answered "accepted"'
    )
    if len(stored) != len(distinct) or distinct != accepted:
        missing, extra = len(accepted - distinct), len(distinct - accepted)
        raise BenchmarkError(f"{line}: MISMATCH ({missing} accepted but missing, {extra} extra)")
    print(f"{line}: OK")


def log_problems(log: Path) -> list[str]:
    """Lines of a JSON log at warning level or above, and lines that are not JSON."""
    problems = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            level = json.loads(line).get("level", "")
        except (ValueError, AttributeError):
            level = "not json"
        if level not in ("debug", "info"):
            problems.append(line)
    return problems


def profile_round(bench: Bench, target: Target, requests: int, workdir: Path) -> None:
    """One more round of `target` with py-spy sampling its process; prints where it spent
    its time."""
    batch = bench.prepare(target, requests)
    output = workdir / "recoveryd-profile.txt"
    with pyspy.recording(target.server.pid, output):
        result = bench.run(target, batch)
    print(f"\nprofiled round       {_figures(result)}")
    rate = pyspy.SAMPLES_PER_SECOND
    print(f"  (py-spy pauses the process {rate} times a second: not a figure to compare)")
    profile = pyspy.read_profile(output)
    samples = f"{profile.samples:,} samples, all threads"
    print(f"\n{target.name}: top 15 functions by own time ({samples})")
    print("\n".join(pyspy.top_lines(profile, profile.own)))
    print(f"\n{target.name}: top 15 functions by total time (own + callees)")
    print("\n".join(pyspy.top_lines(profile, profile.total)))


def print_header(options: Options) -> None:
    print(
        f"recoveryd ingest: {options.requests:,} signed callbacks x {options.rounds} rounds per "
        f"server after {options.warmup:,} warm-up, {options.connections} keep-alive connections"
    )
    load = os.getloadavg()[0]
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {load:.2f} at start\n",
        flush=True,
    )


@dataclass
class Stored:
    """A recoveryd under test, and how to read back what its store holds."""

    server: Server
    stored: Callable[[], list[str]]
    exit_status: int | None = None


def run(options: Options) -> None:
    """The whole benchmark; BenchmarkError, LoadError, ServerError or ProfileError if it
    cannot give trustworthy figures."""
    print_header(options)
    callbacks = SignedCallbacks(json.loads(SAMPLE.read_text()))
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp, contextlib.ExitStack() as up:
        workdir = Path(tmp)
        raw = up.enter_context(raw_server(workdir))
        bare = up.enter_context(bare_server(workdir))
        naive_store = workdir / "naive.db"
        naive = up.enter_context(naive_server(workdir, naive_store, SIGNING_KEY, ISSUER))
        receiver = up.enter_context(receiver_server(workdir, SIGNING_KEY, ISSUER))
        recoveryds, postgres = start_recoveryds(up, workdir, options.stores)
        if not recoveryds:
            raise BenchmarkError("no store to measure recoveryd on")
        against = None
        if options.against is not None:
            against = start_against(up, workdir, options.against)
            recoveryds.append(against)
        bench = Bench(callbacks, options.connections)
        targets = [Target(raw), Target(bare), Target(naive, stores=True)]
        targets += [Target(receiver, accepts=True)]
        recoveryd_targets = [Target(stored.server, stores=True) for stored in recoveryds]
        targets += recoveryd_targets
        postgres_cpu = postgres.cpu_seconds() if postgres else 0.0
        rounds = measure(bench, targets, options)
        summaries = {name: Summary.of(results) for name, results in rounds.items()}
        names = [stored.server.name for stored in recoveryds if stored is not against]
        print_summary(
            summaries,
            ceiling=raw.name,
            bare=bare.name,
            naive=naive.name,
            receiver=receiver.name,
            recoveryd=names,
        )
        if against is not None:
            this, other = recoveryds[0].server.name, against.server.name
            change = summaries[this].rate / summaries[other].rate
            print(f"ratio {this} / {other}: {change:.2f}   this tree against "
                  f"{options.against}, in the same rounds")  # fmt: skip
        if postgres is not None:
            seconds = sum(result.seconds for result in rounds["recoveryd serve pg"])
            busy = (postgres.cpu_seconds() - postgres_cpu) / seconds
            print(f"PostgreSQL server: {busy:.0%} of one core during recoveryd serve pg's "
                  "rounds (its processes, not counted in recoveryd's CPU above)")  # fmt: skip
        for stored in recoveryds:
            print_group_commits(stored.server)
        if options.profile:
            profile_round(bench, recoveryd_targets[0], options.requests, workdir)
        for stored in recoveryds:
            stored.exit_status = stored.server.stop()
        print()
        check_store(naive.name, stored_dlq_ids(naive_store), bench.accepted[naive.name])
        for stored in recoveryds:
            name = stored.server.name
            check_store(name, stored.stored(), bench.accepted.get(name, set()))
            report_exit(stored.server, stored.exit_status or 0)


def start_recoveryds(
    up: contextlib.ExitStack, workdir: Path, stores: Sequence[str]
) -> tuple[list[Stored], PostgresServer | None]:
    """`recoveryd serve` on each of `stores` (and the PostgreSQL server its store needs),
    stopped with `up`."""
    recoveryds: list[Stored] = []
    postgres: PostgresServer | None = None
    if "sqlite" in stores:
        store = workdir / "recoveryd.db"
        server = up.enter_context(recoveryd_server(workdir, store, SIGNING_KEY))
        recoveryds.append(Stored(server, lambda: stored_dlq_ids(store)))
    if "postgres" in stores:
        try:
            postgres = up.enter_context(durable_server())
        except Unavailable as exc:
            print(f"PostgreSQL skipped: {exc}\n")
            return recoveryds, None
        print_postgres(postgres)
        server = up.enter_context(
            recoveryd_server(workdir, postgres.url, SIGNING_KEY, name="recoveryd serve pg")
        )
        recoveryds.append(Stored(server, postgres.stored_dlq_ids))
    return recoveryds, postgres


def start_against(up: contextlib.ExitStack, workdir: Path, revision: str) -> Stored:
    """`recoveryd serve` as it was at `revision`, on a SQLite store of its own, stopped
    with `up`."""
    rev = up.enter_context(servers.revision(revision, workdir))
    store = workdir / "against.db"
    server = up.enter_context(
        recoveryd_server(workdir, store, SIGNING_KEY, name=rev.name, repo=rev.tree)
    )
    return Stored(server, lambda: stored_dlq_ids(store))


def print_postgres(server: PostgresServer) -> None:
    shown = ", ".join(f"{name}={value}" for name, value in server.settings.items())
    print(f"PostgreSQL {server.version} on loopback for recoveryd serve pg: {shown}\n")


def report_exit(recoveryd: Server, exit_status: int) -> None:
    problems = log_problems(recoveryd.log)
    print(
        f"{recoveryd.name}: exit status {exit_status} after SIGTERM; "
        f"{len(problems)} log lines at warning level or above"
        + (f", the first: {problems[0]}" if problems else "")
    )
    if exit_status != 0:
        message = f"{recoveryd.name} must exit 0 after SIGTERM"
        raise BenchmarkError(message + log_tail(recoveryd.log))


def parse_options(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ingest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=positive_int, default=20_000, help="per timed round")
    parser.add_argument("--connections", type=positive_int, default=32)
    parser.add_argument("--rounds", type=positive_int, default=3, help="timed rounds per server")
    parser.add_argument("--warmup", type=positive_int, default=2_000, help="requests per server")
    parser.add_argument(
        "--profile", action="store_true", help="profile recoveryd with py-spy in one more round"
    )
    parser.add_argument(
        "--store", default="sqlite,postgres", help="the stores recoveryd runs on, comma-separated"
    )
    parser.add_argument(
        "--against",
        metavar="REVISION",
        help="also run recoveryd as it was at this git revision (on SQLite), in the same "
        "rounds, and print this tree's rate over it",
    )
    args = parser.parse_args(argv)
    stores = tuple(dict.fromkeys(name.strip() for name in args.store.split(",") if name.strip()))
    if not stores or not set(stores) <= {"sqlite", "postgres"}:
        parser.error(f"--store: sqlite, postgres or both; got {args.store!r}")
    if args.against is not None and stores[0] != "sqlite":
        parser.error("--against compares on SQLite: list sqlite first in --store")
    return Options(
        args.requests, args.connections, args.rounds, args.warmup, args.profile, stores,
        args.against,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    try:
        run(parse_options(argv))
    except (BenchmarkError, LoadError, ServerError, pyspy.ProfileError) as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
