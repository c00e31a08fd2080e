"""Fixtures of the pipeline tests."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> dict[str, str]:
    """The settings that put recoveryd on each store (SQLite is the tests' default), for
    a test that runs on both: PostgreSQL gets a database of the test's own."""
    if request.param == "postgres":
        return {"STORE": request.getfixturevalue("postgres_url")}
    return {}
