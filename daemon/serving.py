"""Run an ASGI app on a loopback socket inside the current event loop, or on a thread."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn


def _config(app: Any, host: str, port: int) -> uvicorn.Config:
    # lifespan "on" so apps with startup/shutdown hooks (background tasks) run them.
    return uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")


def _bound_url(server: uvicorn.Server) -> str:
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    return f"http://{host}:{port}"


@contextlib.asynccontextmanager
async def serve(app: Any, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve `app` in this event loop; yields its base URL (port 0 picks a free port)."""
    server = uvicorn.Server(_config(app, host, port))
    task = asyncio.create_task(server.serve())
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
