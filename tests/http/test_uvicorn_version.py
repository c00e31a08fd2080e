"""The uvicorn range: the installed release is in it, others are refused with what to do,
and pyproject.toml and the lock say the same."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import uvicorn
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from daemon.http.uvicorn_version import specifier, unsupported
from tests.deploy.locks import RUNTIME_LOCK, installed_here
from tests.processes import environ

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_uvicorn_is_one_the_listener_is_tested_against() -> None:
    assert unsupported(uvicorn.__version__) is None, unsupported(uvicorn.__version__)


@pytest.mark.parametrize("version", ["0.54.0", "0.54.7", "0.54.0.post1", "0.54.1rc1", "0.54"])
def test_a_release_of_the_supported_minor_passes(version: str) -> None:
    assert unsupported(version) is None


@pytest.mark.parametrize(
    "version", ["0.55.0", "0.55.0rc1", "0.53.9", "1.0.0", "0.5.4", "0.540.0", "0.54rc1", "dev", ""]
)
def test_any_other_release_is_refused_naming_it_and_what_to_do(version: str) -> None:
    problem = unsupported(version)
    assert problem is not None
    assert problem.startswith(f"uvicorn {version} is installed")
    assert "uvicorn>=0.54,<0.55" in problem
    assert "pip install --require-hashes -r requirements.lock" in problem


def test_pyproject_bounds_uvicorn_to_the_same_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (uvicorn_line,) = [
        line for line in project["dependencies"] if Requirement(line).name == "uvicorn"
    ]
    assert Requirement(uvicorn_line).specifier == SpecifierSet(specifier())


def test_the_lock_pins_a_supported_uvicorn() -> None:
    assert unsupported(installed_here(RUNTIME_LOCK)["uvicorn"]) is None


@pytest.mark.parametrize("command", [["serve"], ["dev", "--duration", "5s"]])
def test_serve_and_dev_refuse_to_start_on_another_uvicorn(
    tmp_path: Path, command: list[str]
) -> None:
    """Each checks the release it imported before anything else: run in a process whose
    uvicorn says it is 0.55.0, it exits 1 with the one line saying what to do."""
    as_if_newer = textwrap.dedent(f"""
        import sys, uvicorn
        uvicorn.__version__ = "0.55.0"
        from daemon.cli import main
        sys.argv = ["recoveryd", *{command!r}]
        main()
    """)
    result = subprocess.run(
        [sys.executable, "-c", as_if_newer],
        env=environ(tmp_path), cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr == f"Error: {unsupported('0.55.0')}\n"
