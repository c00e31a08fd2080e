"""Tests that need a program pip does not install (tests/system_tools.py): skipped with
the Debian package to install where it is missing, failed instead under CI, whose
`.ci/run` installs every one of them; the README names them all."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import system_tools

ROOT = Path(__file__).resolve().parents[1]
PROMTOOL_TEST = "tests/deploy/test_monitoring.py::test_promtool_accepts_the_alert_rules"


def without_system_tools(*args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    """`python -m <args>` from the repository with PATH holding only the venv's programs:
    a machine with Python and nothing else (bar PostgreSQL, found off PATH)."""
    inherited = {
        name: value
        for name, value in os.environ.items()
        if name != "CI" and not name.startswith(("PYTEST_", "RECOVERYD_"))
    }
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env={**inherited, "PATH": str(Path(sys.executable).parent), **environ},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def pytest_without_system_tools(test: str, **environ: str) -> subprocess.CompletedProcess[str]:
    return without_system_tools("pytest", "-n", "0", "-p", "no:cacheprovider", test, **environ)


def test_a_test_whose_program_is_missing_is_skipped_naming_the_package() -> None:
    ran = pytest_without_system_tools(PROMTOOL_TEST)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"^SKIPPED \[1\] .*`promtool` not found: `apt-get install prometheus`",
                     ran.stdout, re.MULTILINE), ran.stdout  # fmt: skip
    assert "1 skipped" in ran.stdout


def test_under_ci_a_test_whose_program_is_missing_fails_naming_the_package() -> None:
    ran = pytest_without_system_tools(PROMTOOL_TEST, CI="true")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert re.search(r"^ERROR .*`promtool` not found: `apt-get install prometheus`.*CI is set",
                     ran.stdout, re.MULTILINE), ran.stdout  # fmt: skip
    assert "skipped" not in ran.stdout


def test_ci_installs_the_package_of_every_program_missing() -> None:
    """`.ci/run` installs what `python -m tests.system_tools` names: here, with PATH
    emptied, every package but PostgreSQL's where its binaries are found off PATH."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "packages=$(python -m tests.system_tools)" in ci
    assert '[ -z "$packages" ] || apt_install $packages' in ci
    listed = without_system_tools("tests.system_tools")
    assert listed.returncode == 0, listed.stderr
    off_path = {"postgresql"} if system_tools.find("postgres") else set()
    assert listed.stdout.split() == sorted(set(system_tools.PACKAGES.values()) - off_path)


def test_the_readme_names_every_package_the_tests_need() -> None:
    readme = (ROOT / "README.md").read_text()
    for package in set(system_tools.PACKAGES.values()):
        assert f"`{package}`" in readme, package


def test_a_program_not_in_the_table_is_an_error_not_a_skip() -> None:
    with pytest.raises(LookupError, match="add it and its Debian package"):
        system_tools.require("kubectl")


@pytest.mark.parametrize("ci", [None, "", "0", "false", "False", "FALSE"])
def test_ci_set_to_no_is_not_ci(monkeypatch: pytest.MonkeyPatch, ci: str | None) -> None:
    """`CI` unset, empty, `0` or `false` (any case) is a person's machine: a skip."""
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception):
        system_tools.unavailable("`promtool` not found")


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_ci_set_to_anything_else_is_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    """`CI=true`, `1`, or any other value a CI service sets: a failure."""
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception):
        system_tools.unavailable("`promtool` not found")
