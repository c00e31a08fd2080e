"""A store opened by a command that reads what the daemon recorded (`create=False`): it
must be there already, and is never created, on both engines."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from daemon.store import StoreMissing
from tests.store.support import SQLITE, OpenStore, callback


def made(path: Path) -> bool:
    return path.exists()


async def test_a_store_that_does_not_exist_is_refused_and_not_created(
    open_store: OpenStore,
) -> None:
    """No file, or no recoveryd schema in the database: StoreMissing, asking whether
    RECOVERYD_STORE is set as for serve, and nothing created."""
    with pytest.raises(StoreMissing, match="is RECOVERYD_STORE set as for serve\\?"):
        async with open_store(create=False):
            pass
    if open_store.kind == "sqlite":
        assert not made(Path(open_store.url.removeprefix(SQLITE)))
    else:
        assert open_store.query("SELECT to_regclass('recoveryd_schema')") == [(None,)]


async def test_a_store_serve_made_opens_with_what_it_holds(open_store: OpenStore) -> None:
    """A store that exists opens as it is, its records readable."""
    async with open_store() as store:
        await store.add_callback(callback("d-1"))
    async with open_store(create=False) as store:
        assert await store.get_callback("d-1") is not None


async def test_a_sqlite_file_that_is_not_a_store_is_refused_and_left_alone(
    tmp_path: Path,
) -> None:
    """A database without recoveryd's schema (an empty file, another program's) is not
    taken for a store: refused, and not migrated."""
    path = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(path)) as other:
        other.execute("CREATE TABLE notes (text TEXT)")
    with pytest.raises(StoreMissing, match=f"{path} is not a recoveryd store"):
        async with OpenStore(f"{SQLITE}{path}")(create=False):
            pass
    with contextlib.closing(sqlite3.connect(path)) as other:
        tables = other.execute("SELECT name FROM sqlite_master").fetchall()
        journal = other.execute("PRAGMA journal_mode").fetchone()
    assert tables == [("notes",)]
    assert journal == ("delete",)


async def test_a_relative_path_is_shown_as_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sqlite:///recoveryd.db` is missing at `./recoveryd.db`: where a user looks."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreMissing) as missing:
        async with OpenStore(f"{SQLITE}recoveryd.db")(create=False):
            pass
    assert str(missing.value) == "no store at ./recoveryd.db: is RECOVERYD_STORE set as for serve?"
    assert not (tmp_path / "recoveryd.db").exists()
