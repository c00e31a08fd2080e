"""The lock files agree with pyproject.toml and with each other, every file in them is
checked by hash, and CI and CONTRIBUTING.md use them as they were made. (That the image
installs from requirements.lock is tests/deploy/test_image.py's.)"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.locks import RUNTIME_LOCK, TEST_LOCK, command, pins

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
RUNTIME = [Requirement(line) for line in PROJECT["dependencies"]]
TEST = RUNTIME + [Requirement(line) for line in PROJECT["optional-dependencies"]["test"]]


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, TEST_LOCK], ids=lambda lock: lock.name)
def test_every_pin_has_sha256_hashes(lock: Path) -> None:
    """pip's --require-hashes refuses a line without one; a hash of another kind is not
    what uv writes."""
    for name, choices in pins(lock).items():
        for pin in choices:
            assert pin.hashes, f"{lock.name}: {name} has no hash"
            assert all(h.startswith("sha256:") and len(h) == 71 for h in pin.hashes), name


@pytest.mark.parametrize(
    ("lock", "wanted"), [(RUNTIME_LOCK, RUNTIME), (TEST_LOCK, TEST)], ids=["runtime", "test"]
)
def test_the_lock_pins_each_requirement_within_its_range(
    lock: Path, wanted: list[Requirement]
) -> None:
    """A range changed in pyproject.toml without the lock made again fails here, naming
    the package, rather than in the image build or CI's install."""
    locked = pins(lock)
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{lock.name} has no {name}: make the locks again"
        for pin in locked[name]:
            assert requirement.specifier.contains(pin.version, prereleases=True), (
                f"{lock.name}: {name}=={pin.version} is outside pyproject.toml's "
                f"{requirement.specifier}: make the locks again (CONTRIBUTING.md)"
            )


def test_the_test_lock_pins_what_the_image_runs() -> None:
    """Each package of the runtime lock at the same versions in the test lock: CI tests
    the dependencies the image ships, not their newer releases."""
    runtime, test = pins(RUNTIME_LOCK), pins(TEST_LOCK)
    for name, choices in runtime.items():
        assert name in test, f"{TEST_LOCK.name} has no {name}"
        assert [p.version for p in test[name]] == [p.version for p in choices], name


def test_the_locks_are_universal_from_python_3_11() -> None:
    """One lock for every Python the project supports (requires-python), on every platform:
    not only the interpreter it was made with."""
    assert PROJECT["requires-python"] == ">=3.11"
    for lock in (RUNTIME_LOCK, TEST_LOCK):
        words = command(lock).split()
        assert "--universal" in words, lock.name
        assert words[words.index("--python-version") + 1] == "3.11", lock.name
        assert "--generate-hashes" in words, lock.name
    assert f"-c {RUNTIME_LOCK.name}" in command(TEST_LOCK)  # the runtime pins, kept


def test_contributing_gives_the_commands_that_made_the_locks() -> None:
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    for lock in (RUNTIME_LOCK, TEST_LOCK):
        assert command(lock) in contributing, f"CONTRIBUTING.md: not how {lock.name} is made"


def test_ci_installs_the_test_lock_with_hashes_before_anything_else() -> None:
    """Then the README's commands find every dependency installed, at the locked version,
    and add only recoveryd itself."""
    ci = (ROOT / ".ci" / "run").read_text()
    from_lock = f"pip install --quiet --require-hashes --requirement {TEST_LOCK.name}"
    assert from_lock in ci
    installs = [line for line in ci.splitlines() if line.startswith("pip install")]
    assert installs[0] == from_lock, installs
