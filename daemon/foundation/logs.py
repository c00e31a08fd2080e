"""Structured logs (structlog) as JSON lines or for a console, uvicorn's included."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import structlog

_FOLDED_LEVELS = frozenset({"warning", "error", "critical"})


# What makes two warnings "the same" for folding.
_KIND = ("event", "task", "problem", "operation")


class RepeatFilter:
    """Folds repeated warnings and errors into one line a `window` with a count.

    When the service is down or the disk is full, the same failure happens for every
    dlqId and every commit: tens of thousands of identical lines that bury the first
    one and fill the disk further. The first line of a kind (same level, event, task,
    and `problem` or `operation` when it names one: each store problem and each
    circuit is news of its own) in each window is written; the rest are counted, and
    the next one written says how many were left out (`repeated`). Info and debug
    lines pass untouched.
    """

    def __init__(self, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self._clock = clock
        self._seen: dict[tuple[Any, ...], list[float]] = {}  # kind -> [written at, left out]

    def __call__(
        self, logger: Any, method_name: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        level = event.get("level", method_name)
        if level not in _FOLDED_LEVELS:
            return event
        kind = (level, *(event.get(key) for key in _KIND))
        now = self._clock()
        seen = self._seen.get(kind)
        if seen is not None and now - seen[0] < self._window:
            seen[1] += 1
            raise structlog.DropEvent
        if seen is not None and seen[1]:
            event["repeated"] = int(seen[1])  # lines like this left out since the last one
        self._seen[kind] = [now, 0]
        return event


def iso_times(
    logger: Any, method_name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """For people: the fields that are times (named `..._at`, seconds since the epoch) in
    ISO 8601 UTC, as the line's timestamp, not `next_run_at=1795834800.0`. JSON keeps the
    numbers, for machines (docs/operating.md)."""
    for key, value in event.items():
        if key.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
            # A value no date can say (infinite, milliseconds by mistake) stays the number.
            with contextlib.suppress(OverflowError, ValueError, OSError):
                when = datetime.fromtimestamp(value, UTC)
                event[key] = when.isoformat().replace("+00:00", "Z")
    return event


def configure_logging(fmt: Literal["json", "console"], level: int = logging.INFO) -> None:
    """Send structlog events and stdlib records (uvicorn's) through one renderer to stderr."""
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    readable: list[structlog.typing.Processor] = [] if fmt == "json" else [iso_times]
    structlog.configure(
        processors=[
            *shared,
            RepeatFilter(),
            *readable,
            structlog.processors.format_exc_info,
            renderer,
        ],
        # Filtering in the bound logger makes a disabled debug call nearly free.
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # APScheduler logs every job run at INFO; the rotation logs its own outcome.
    logging.getLogger("apscheduler").setLevel(max(level, logging.WARNING))
    # httpx logs every request at INFO with its full URL: one line per service call, and
    # whatever a URL carries would be in the log.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


class CommandSettings(Protocol):
    """What a command's logging reads of its settings (daemon.settings.Settings): named
    here, as the foundation uses no module of the daemon above it (pyproject.toml's
    contracts)."""

    @property
    def LOG_FORMAT(self) -> Literal["json", "console"]: ...

    @property
    def model_fields_set(self) -> set[str]: ...


def configure_command_logging(settings: CommandSettings) -> None:
    """Logs of a one-shot command (rotate-token, redrive): its answer is printed on stdout
    for a person, so its log goes to stderr, warnings and errors only, as console text.
    JSON only when RECOVERYD_LOG_FORMAT asks for it: the setting's default suits the
    daemon, whose log a machine collects, not a command run by hand."""
    asked = "LOG_FORMAT" in settings.model_fields_set  # set in the environment, not defaulted
    configure_logging(settings.LOG_FORMAT if asked else "console", logging.WARNING)
    # The pool warns at each failed try to reach PostgreSQL, in the daemon's log the story
    # of an outage; a command says once why it could not open the store (its error).
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
