"""Files replaced whole: the credentials file, the rules file `promote` writes."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def replace_atomically(path: Path, content: bytes, mode: int | None = None) -> None:
    """Replace `path` with `content`, durable on disk when this returns: written beside it
    and renamed over it, so a reader sees the old file or the new, never half of one.
    The new file is 0600 (mkstemp's O_EXCL: no moment where others can read it), or
    `mode`. OSError when it cannot be written; nothing is left behind then."""
    folder = path.parent
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(content)
            file.flush()
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    # The rename is durable once the folder's entry is.
    handle = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
