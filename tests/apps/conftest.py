"""The workflow apps as fixtures: `python_app` and `node_app` started for a test, pointed at
`service_url` (nothing listens there unless a test overrides it with the emulator's) with
`app_env` added to their environment; `app` is each of them in turn."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import system_tools
from tests.apps import support
from tests.support import UNREACHABLE_SERVICE


@pytest.fixture
def service_url() -> str:
    return UNREACHABLE_SERVICE


@pytest.fixture
def app_env() -> dict[str, str]:
    return {}


@pytest.fixture
def python_app(tmp_path: Path, service_url: str, app_env: dict[str, str]) -> Iterator[support.App]:
    with support.python_app(tmp_path, service_url, **app_env) as app:
        yield app


@pytest.fixture(scope="session")
def npm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """npm's cache for the session: filled by the first `npm ci`, read by the others."""
    return tmp_path_factory.mktemp("npm-cache")


@pytest.fixture(scope="session")
def node_installed(tmp_path_factory: pytest.TempPathFactory, npm_cache: Path) -> Path:
    """The Node app with its packages, installed once a session by `npm ci`."""
    system_tools.require("node", "npm")
    folder = tmp_path_factory.mktemp("node-app")
    support.install_node_app(folder, npm_cache)
    return folder


@pytest.fixture
def node_app(
    tmp_path: Path, node_installed: Path, service_url: str, app_env: dict[str, str]
) -> Iterator[support.App]:
    with support.node_app(tmp_path, node_installed, service_url, **app_env) as app:
        yield app


@pytest.fixture(params=["python_app", "node_app"])
def app(request: pytest.FixtureRequest) -> support.App:
    """Each app in turn."""
    started: support.App = request.getfixturevalue(request.param)
    return started
