"""The uvicorn releases recoveryd is tested against, and the check that serve makes.

The public listener subclasses uvicorn's httptools protocol and reads and sets its
internals (daemon/http/listener.py, daemon/ingest/protocol.py): none of that is uvicorn's public
API, and a minor release may change it without a word, so that limits or keep-alive stop
holding while everything seems to run. pyproject.toml bounds uvicorn to the same range
(tests/http/test_uvicorn_version.py keeps the two in step); a daemon that finds another release
installed anyway (`pip install --no-deps`, a forced upgrade) refuses to start.
"""

from __future__ import annotations

import re

# From, and up to (not included): the minor releases the listener's tests have passed on.
# Widen it only after running tests/ingest and tests/test_serve.py on the new release.
SUPPORTED = ((0, 54), (0, 55))


def specifier() -> str:
    """The range as pyproject.toml writes it."""
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED
    return f">={low_major}.{low_minor},<{high_major}.{high_minor}"


def unsupported(version: str) -> str | None:
    """What to do about uvicorn `version` (its `__version__`), or None if it is one the
    listener is tested against."""
    found = re.match(r"(\d+)\.(\d+)(?:\.|$)", version)
    low, high = SUPPORTED
    if found and low <= (int(found[1]), int(found[2])) < high:
        return None
    return (
        f"uvicorn {version} is installed, but recoveryd's listener builds on uvicorn's "
        f"internals and is tested with uvicorn{specifier()} only: install the locked "
        "versions (pip install --require-hashes -r requirements.lock, as the image does) "
        f"or pip install 'uvicorn[standard]{specifier()}'"
    )
