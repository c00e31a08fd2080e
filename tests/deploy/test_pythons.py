"""The Pythons recoveryd says it supports are the ones it is tested on: pyproject.toml's
classifiers name each release from the oldest CI runs the suite on to the newest. (That
the suite passes on each is CI's: .ci/run.)"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CI = (ROOT / ".ci" / "run").read_text()
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CLASSIFIER = "Programming Language :: Python :: "


def ci_python() -> str:
    """The release .ci/run names as OLDEST_PYTHON, as "3.11"."""
    found = re.search(r"^OLDEST_PYTHON=(3\.\d+)$", CI, re.MULTILINE)
    assert found, ".ci/run sets no OLDEST_PYTHON"
    return found.group(1)


# The newest release the suite is known to pass on (run by hand: CONTRIBUTING.md).
NEWEST = "3.13"


def classified() -> list[str]:
    """The releases the classifiers name, as "3.13", in their order."""
    names = [c.removeprefix(CLASSIFIER) for c in PROJECT["classifiers"]]
    return [name for name in names if re.fullmatch(r"3\.\d+", name)]


def test_the_classifiers_name_each_python_from_the_oldest_tested_to_the_newest() -> None:
    """Every minor release from the one CI runs the suite on to the newest it passes on,
    and only Python 3; the oldest is requires-python's floor."""
    oldest = ci_python()
    assert PROJECT["requires-python"] == f">={oldest}"
    first, last = (int(version.split(".")[1]) for version in (oldest, NEWEST))
    assert classified() == [f"3.{minor}" for minor in range(first, last + 1)]
    assert f"{CLASSIFIER}3 :: Only" in PROJECT["classifiers"]


def test_the_python_running_the_suite_is_one_the_classifiers_name() -> None:
    """A suite run on a Python the classifiers do not name fails here until they do."""
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in classified()
