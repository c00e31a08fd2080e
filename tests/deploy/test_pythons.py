"""The Pythons recoveryd says it supports are the ones it is tested on: pyproject.toml's
classifiers name each release from the oldest CI runs the suite on to the newest, and the
image runs the newest. (That the suite passes on each is CI's: .ci/run.)"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CI = (ROOT / ".ci" / "run").read_text()
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CLASSIFIER = "Programming Language :: Python :: "


def ci_python(which: str) -> str:
    """The release .ci/run names as OLDEST_PYTHON or NEWEST_PYTHON, as "3.13"."""
    found = re.search(rf"^{which}_PYTHON=(3\.\d+)$", CI, re.MULTILINE)
    assert found, f".ci/run sets no {which}_PYTHON"
    return found.group(1)


def classified() -> list[str]:
    """The releases the classifiers name, as "3.13", in their order."""
    names = [c.removeprefix(CLASSIFIER) for c in PROJECT["classifiers"]]
    return [name for name in names if re.fullmatch(r"3\.\d+", name)]


def test_the_classifiers_name_each_python_from_the_oldest_tested_to_the_newest() -> None:
    """Every minor release between the two CI runs the suite on, those included, and only
    Python 3; the oldest is requires-python's floor."""
    oldest, newest = ci_python("OLDEST"), ci_python("NEWEST")
    assert PROJECT["requires-python"] == f">={oldest}"
    first, last = (int(version.split(".")[1]) for version in (oldest, newest))
    assert classified() == [f"3.{minor}" for minor in range(first, last + 1)]
    assert f"{CLASSIFIER}3 :: Only" in PROJECT["classifiers"]


def test_the_python_running_the_suite_is_one_the_classifiers_name() -> None:
    """A CI moved to a newer Python fails here until the classifiers, .ci/run and the
    image say so."""
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in classified()


def test_ci_runs_the_suite_on_the_newest_from_the_lock_with_hashes() -> None:
    """Its venv takes the same lock, checked by the same hashes, and recoveryd from the
    clone; without that Python, CI fails rather than test less."""
    block = re.search(r'^if \[ -n "\$\{newest:-\}" \]; then\n(.*?)^else$', CI, re.M | re.S)
    assert block, ".ci/run runs nothing on the newest Python"
    for part in ("--no-deps -e .", "--require-hashes", "requirements-test.lock", "-m pytest"):
        assert part in block.group(1), part
    missing = re.search(r"^missing\(\) \{\n(.*?)^\}", CI, re.M | re.S)
    assert missing, ".ci/run does not say what a missing Python is"
    assert 'if [ -n "${CI:-}" ]' in missing.group(1)
    assert "exit 1" in missing.group(1)


def test_the_image_runs_the_newest_python() -> None:
    """Of the two tested on every change, the one with security fixes the longer."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    image = re.search(r"^ARG PYTHON_IMAGE=python:(3\.\d+)\.\d+-", dockerfile, re.MULTILINE)
    assert image, "the Dockerfile's PYTHON_IMAGE is not python:3.X.Y-..."
    assert image.group(1) == ci_python("NEWEST")
