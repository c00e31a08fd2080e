"""The SQLite store's health: files deleted or replaced under it, a full or unwritable disk.

Each of these makes a store that still answers lose what it is given: a deleted file
takes every later commit with it at the next start, and a full disk fails every commit.
So the store watches for them (`SQLiteStore` runs `check_files` and, while a write
problem holds, a probe write on a timer), refuses callbacks while one holds (the service
retries them later), and readiness reports them. Each problem is logged once when it
starts and once when it clears, however many commits fail meanwhile: a full disk must
not also fill the log.

A deleted or replaced file never clears: the connection keeps writing to the old inode,
which nothing will open again, so only a restart (which opens the new file) helps. A full
or unwritable store clears when a write that needs new space succeeds again.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

log = structlog.get_logger(__name__)

Kind = Literal["database", "wal", "full", "unwritable"]
# The write problems, cleared by a write that succeeds; the others never clear.
WRITE_PROBLEMS: tuple[Kind, ...] = ("full", "unwritable")

# Primary result codes (the low byte of an extended code) that are about the files, not
# about this one statement or a lock another process holds.
_FULL = {13}  # SQLITE_FULL: the disk, or PRAGMA max_page_count
_UNWRITABLE = {3, 8, 10, 11, 14, 26}  # PERM, READONLY, IOERR, CORRUPT, CANTOPEN, NOTADB

# Migration 8 (see sqlite.MIGRATIONS): where the probe writes. Its row needs new pages,
# as a callback does; rewriting a row in place would succeed on a full store.
SCHEMA = """
    CREATE TABLE health_probe (id INTEGER PRIMARY KEY, filler BLOB NOT NULL);
"""
PROBE_BYTES = 64 * 1024


def classify(error: sqlite3.Error) -> Kind | None:
    """Which write problem `error` shows, if any (None: busy, locked, a bad statement)."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is None:
        return None
    if code & 0xFF in _FULL:
        return "full"
    if code & 0xFF in _UNWRITABLE:
        return "unwritable"
    return None


def probe(connection: sqlite3.Connection) -> None:
    """A small write that needs new pages, committed, then taken back (on the store's
    thread, inside a transaction)."""
    connection.execute(
        "INSERT INTO health_probe (id, filler) VALUES (1, zeroblob(?))", (PROBE_BYTES,)
    )
    connection.execute("DELETE FROM health_probe")


class FilesMoved(Exception):
    """The store's files are not those it opened: a commit now would be lost."""

    def __init__(self, found: dict[Kind, _Identity | None]) -> None:
        super().__init__("the store's files were deleted or replaced while open")
        self.found = found


@dataclass(frozen=True)
class _Identity:
    device: int
    inode: int


def _identity(path: Path) -> _Identity | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return _Identity(found.st_dev, found.st_ino)


class Health:
    """The problems the store has now, each logged once when it starts and once when it
    clears. Not thread-safe: used from the event loop only."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._path = path
        self._clock = clock
        self._problems: dict[Kind, str] = {}
        self._files: dict[Kind, _Identity | None] = {}
        self._failures = _Throttle(clock)

    def problems(self) -> list[str]:
        """What is wrong now, one sentence each; empty when the store is healthy."""
        return list(self._problems.values())

    def has(self, *kinds: Kind) -> bool:
        return any(kind in self._problems for kind in kinds)

    def remember_files(self) -> None:
        """Record which files the open connection uses (right after it opened them)."""
        self._files = self.files_now()

    def files_now(self) -> dict[Kind, _Identity | None]:
        """The files at the path now (stat calls: run it off the event loop)."""
        return {"database": _identity(self._path), "wal": _identity(self._wal)}

    def ensure_files(self) -> None:
        """Raise FilesMoved unless the files at the path are those the connection opened.
        Two stat calls, on the store's thread right before a commit of callbacks: the
        timer alone would leave a second in which callbacks are answered 200 and lost."""
        found = self.files_now()
        if any(opened is not None and found[kind] != opened
               for kind, opened in self._files.items()):  # fmt: skip
            raise FilesMoved(found)

    def compare_files(self, found: dict[Kind, _Identity | None]) -> None:
        """A problem for each file at the path that is not the one the connection opened."""
        for kind, now in found.items():
            opened = self._files.get(kind)
            if opened is None:  # the WAL may not exist yet at open: its first one counts
                self._files[kind] = now
            elif now != opened:
                what = "write-ahead log" if kind == "wal" else "database"
                how = "deleted" if now is None else "replaced by another file"
                self._start(kind, f"the store's {what} {self._named(kind)} was {how} "
                            "while open; what is stored from now on would be lost: "
                            "restart recoveryd")  # fmt: skip

    def failed(self, error: BaseException, *, what: str) -> None:
        """A store operation (`what`) failed with `error`: a problem if it shows one,
        otherwise a line in the log, at most one a minute with a count."""
        kind = classify(error) if isinstance(error, sqlite3.Error) else None
        if kind == "full":
            self._start(kind, f"the store is full (the disk, or max_page_count): {error}")
        elif kind == "unwritable":
            self._start(kind, f"the store cannot write its files: {error}")
        elif (left_out := self._failures.allow(what)) is not None:
            log.error(what, error=str(error), repeated=left_out)

    def wrote(self) -> None:
        """A write that needed new space succeeded: full and unwritable are over."""
        for kind in WRITE_PROBLEMS:
            if kind in self._problems:
                del self._problems[kind]
                log.info("store problem cleared", problem=kind)

    def _start(self, kind: Kind, text: str) -> None:
        if kind not in self._problems:
            self._problems[kind] = text
            log.error("store problem", problem=kind, detail=text)

    @property
    def _wal(self) -> Path:
        return self._path.with_name(self._path.name + "-wal")

    def _named(self, kind: Kind) -> Path:
        return self._wal if kind == "wal" else self._path


class _Throttle:
    """Lets one line of a kind through a `window`; says how many it held back since."""

    def __init__(self, clock: Callable[[], float], window: float = 60.0) -> None:
        self._clock = clock
        self._window = window
        self._seen: dict[str, tuple[float, int]] = {}

    def allow(self, kind: str) -> int | None:
        """The count of lines held back since the last one, when this one may be logged;
        None when it must not."""
        now = self._clock()
        last = self._seen.get(kind)
        if last is not None and now - last[0] < self._window:
            self._seen[kind] = (last[0], last[1] + 1)
            return None
        self._seen[kind] = (now, 0)
        return last[1] if last is not None else 0
