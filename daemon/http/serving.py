"""Run ASGI apps: on a loopback socket in this event loop or on a thread (tests, demo), or
in the foreground until a signal stops them (the `serve` and `emulator` commands)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal

import uvicorn

# uvicorn's choice of HTTP implementation, or a protocol class (daemon/http/listener.py).
Http = type[asyncio.Protocol] | Literal["auto"]


def _config(app: Any, host: str, port: int, http: Http = "auto") -> uvicorn.Config:
    # lifespan "on" so apps with startup/shutdown hooks (background tasks) run them.
    return uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", http=http)


def _bound_url(server: uvicorn.Server) -> str:
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    return f"http://{host}:{port}"


@contextlib.asynccontextmanager
async def serve(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    sock: socket.socket | None = None,
    http: Http = "auto",
) -> AsyncIterator[str]:
    """Serve `app` in this event loop; yields its base URL (port 0 picks a free port).

    With `sock` (see `bind`) it serves on that socket: the URL is then known before.
    """
    server = uvicorn.Server(_config(app, host, port, http))
    task = asyncio.create_task(server.serve(sockets=None if sock is None else [sock]))
    try:
        while not server.started:
            if task.done():  # failed to bind: surface uvicorn's error
                task.result()
                raise RuntimeError(f"server on {host}:{port} stopped before it started")
            await asyncio.sleep(0.01)
        yield _bound_url(server)
    finally:
        server.should_exit = True
        await task


@contextlib.contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `app` on its own thread and event loop, as a separate process would."""
    server = uvicorn.Server(_config(app, host, port))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"server on {host}:{port} stopped before it started")
            thread.join(0.01)
        yield _bound_url(server)
    finally:
        server.should_exit = True
        thread.join(10)


class _CleanExitServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM/SIGINT once its graceful shutdown is done, so the process
    dies of the signal (exit status -15). A server that drained cleanly should exit 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        stop = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in stop}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def run_until_stopped(app: Any, host: str, port: int, *, log_level: str = "info") -> None:
    """Serve `app` in the foreground until SIGTERM or SIGINT, then drain and return."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on")
    _CleanExitServer(config).run()


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket, bound before the servers start so a busy port is reported
    by the caller, naming its setting, rather than by uvicorn's exit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class _OnceEach(logging.Filter):
    """Lets each distinct info line through once. uvicorn logs its lifecycle per server
    ("Started server process [pid]", "Shutting down", "Finished server process [pid]"),
    and serve runs a server per listener: without this, every such event is two lines.
    Warnings and errors all pass; each is news."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        line = record.getMessage()
        if line in self._seen:
            return False
        self._seen.add(line)
        return True


class _QuietServer(uvicorn.Server):
    """A server that leaves signals to its caller, which stops several servers at once."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_until_stopped(
    listeners: Sequence[tuple[Any, socket.socket, Http]],
    *,
    drain_seconds: float = 30.0,
    on_hangup: Callable[[], Any] | None = None,
) -> None:
    """Serve each app on its socket with its HTTP protocol until SIGTERM or SIGINT;
    in-flight requests then get up to `drain_seconds` to finish before the servers
    return. SIGHUP calls `on_hangup`."""
    servers = [
        _QuietServer(
            uvicorn.Config(
                app,
                http=http,
                log_config=None,  # logs go through the root logger that logs.py set up
                access_log=False,  # one line per callback would be the busiest log there is
                lifespan="off",
                timeout_graceful_shutdown=int(drain_seconds),
            )
        )
        for app, _, http in listeners
    ]
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for server in servers:
            server.should_exit = True

    handlers = {signal.SIGTERM: stop, signal.SIGINT: stop}
    if on_hangup is not None:
        handlers[signal.SIGHUP] = on_hangup
    for sig, handler in handlers.items():
        loop.add_signal_handler(sig, handler)
    uvicorn_log = logging.getLogger("uvicorn.error")  # uvicorn's lifecycle lines, despite the name
    once = _OnceEach()
    uvicorn_log.addFilter(once)
    try:
        pairs = zip(servers, (sock for _, sock, _ in listeners), strict=True)
        await asyncio.gather(*(server.serve(sockets=[sock]) for server, sock in pairs))
    finally:
        uvicorn_log.removeFilter(once)
        for sig in handlers:
            loop.remove_signal_handler(sig)
