"""The store under test: each test that takes `open_store` runs against SQLite and against
PostgreSQL. Modules named for one of them (test_sqlite*.py, test_postgres.py) test what
is that database's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.store.support import SQLITE, OpenStore


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> OpenStore:
    """A new store of either kind, not open yet (see OpenStore)."""
    if request.param == "sqlite":
        return OpenStore(f"{SQLITE}{tmp_path / 's.db'}")
    return OpenStore(request.getfixturevalue("postgres_url"))
