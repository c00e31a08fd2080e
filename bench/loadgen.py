"""A closed-loop HTTP/1.1 load generator on raw asyncio streams, for bench.ingest.

Each of N keep-alive connections sends its next request only once the answer to the
previous one is read in full, so a round's rate is what the server sustains at that
concurrency. Requests are bytes built before the clock starts, and answers are only
recorded while it runs; checking them is the caller's job, after the clock stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import uvloop

_END_OF_HEAD = b"\r\n\r\n"
_CONTENT_LENGTH = b"\r\ncontent-length:"
# Tokens signed for a round expire after 300 s, so a round that runs longer is broken
# anyway; this only stops a server that no longer answers from hanging the benchmark.
ROUND_TIMEOUT = 300.0


class LoadError(Exception):
    """A round could not run to its end: a connection broke, or the server stopped answering."""


@dataclass(frozen=True)
class Round:
    """One timed round: per request (in request order) its latency and its answer."""

    seconds: float
    latencies: list[float]
    statuses: list[int]
    bodies: list[bytes]
    generator_cpu_seconds: float
    server_cpu_seconds: float

    @property
    def rate(self) -> float:
        """Requests answered per second."""
        return len(self.latencies) / self.seconds


def run_round(
    host: str,
    port: int,
    requests: Sequence[bytes],
    *,
    connections: int,
    server_cpu_seconds: Callable[[], float],
) -> Round:
    """Send every request in `requests` over `connections` keep-alive connections.

    `server_cpu_seconds` reads the server's CPU time, so that the round can say how
    busy the server was while the clock ran.
    """
    return uvloop.run(
        drive(host, port, requests, connections=connections, server_cpu_seconds=server_cpu_seconds)
    )


async def drive(
    host: str,
    port: int,
    requests: Sequence[bytes],
    *,
    connections: int,
    server_cpu_seconds: Callable[[], float] = lambda: 0.0,
) -> Round:
    """`run_round` in the running event loop (bench.drain sends callbacks while it polls)."""
    streams = await asyncio.gather(
        *(asyncio.open_connection(host, port) for _ in range(connections))
    )
    latencies = [0.0] * len(requests)
    statuses = [0] * len(requests)
    bodies = [b""] * len(requests)
    # One iterator shared by all connections: whichever is free takes the next request.
    pending = iter(range(len(requests)))
    # A collection of the generator's garbage mid-round would stall every connection at once.
    gc.collect()
    gc.disable()
    try:
        started_cpu, started_server_cpu = time.process_time(), server_cpu_seconds()
        started = time.perf_counter()
        await _drive_all(streams, requests, pending, latencies, statuses, bodies)
        seconds = time.perf_counter() - started
        generator_cpu = time.process_time() - started_cpu
        server_cpu = server_cpu_seconds() - started_server_cpu
    finally:
        gc.enable()
        await _close(streams)
    return Round(seconds, latencies, statuses, bodies, generator_cpu, server_cpu)


async def _drive_all(
    streams: Sequence[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
    requests: Sequence[bytes],
    pending: Iterator[int],
    latencies: list[float],
    statuses: list[int],
    bodies: list[bytes],
) -> None:
    try:
        async with asyncio.timeout(ROUND_TIMEOUT), asyncio.TaskGroup() as group:
            for reader, writer in streams:
                group.create_task(
                    _drive(reader, writer, requests, pending, latencies, statuses, bodies)
                )
    except TimeoutError:
        answered = sum(1 for status in statuses if status)
        raise LoadError(
            f"the server stopped answering: {answered} of {len(requests)} answered "
            f"in {ROUND_TIMEOUT:.0f} s"
        ) from None
    except ExceptionGroup as failures:
        first = failures.exceptions[0]
        # Broken connections and garbled answers are the server's doing; anything else
        # is a bug here and keeps its traceback.
        if not isinstance(first, OSError | EOFError | ValueError):
            raise
        raise LoadError(f"a connection failed mid-round: {first!r}") from None


async def _drive(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    requests: Sequence[bytes],
    pending: Iterator[int],
    latencies: list[float],
    statuses: list[int],
    bodies: list[bytes],
) -> None:
    """One connection's closed loop: request, whole answer, next request."""
    for index in pending:
        started = time.perf_counter()
        # No drain(): one request of about 1 KB is in flight per connection, far below
        # the transport's buffer limit, and an extra await per request would cost us.
        writer.write(requests[index])
        statuses[index], bodies[index] = await _read_answer(reader)
        latencies[index] = time.perf_counter() - started


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Status and body of one answer: the head up to its blank line, then Content-Length
    bytes. Chunked answers are not supported: every server here sends a length."""
    head = await reader.readuntil(_END_OF_HEAD)
    status = int(head[9:12])  # b"HTTP/1.1 200 OK"
    return status, await reader.readexactly(_content_length(head))


def _content_length(head: bytes) -> int:
    lowered = head.lower()
    start = lowered.find(_CONTENT_LENGTH)
    if start < 0:
        raise ValueError(f"an answer without Content-Length: {head[:200]!r}")
    end = lowered.find(b"\r\n", start + len(_CONTENT_LENGTH))
    return int(lowered[start + len(_CONTENT_LENGTH) : end])


async def _close(streams: Sequence[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    for _, writer in streams:
        writer.close()
    for _, writer in streams:
        # The server may have reset a connection whose failure is already reported.
        with contextlib.suppress(OSError):
            await writer.wait_closed()
