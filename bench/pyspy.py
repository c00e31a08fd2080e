"""Sample a process with py-spy while a block runs, and rank its functions by time."""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SAMPLES_PER_SECOND = 200
_ATTACH_TIMEOUT = 10.0
_LINE_NUMBER = re.compile(r":\d+\)$")


class ProfileError(Exception):
    """py-spy is missing, could not attach, or wrote nothing."""


@dataclass(frozen=True)
class Profile:
    """Sample counts per function: `own` where the function itself was running, `total`
    where it was anywhere on the stack. A function is `name (file)`, lines merged.

    `total` leaves out each thread's trunk, the frames every one of its samples passes
    through (runpy, click, the event loop's `run`...): they would top the ranking and
    say nothing."""

    samples: int
    own: Counter[str]
    total: Counter[str]


def py_spy() -> str:
    """The py-spy next to this Python (the virtualenv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise ProfileError("py-spy is not installed: pip install py-spy")
    return found


@contextlib.contextmanager
def recording(pid: int, output: Path) -> Iterator[None]:
    """Record `pid`'s stacks (py-spy raw format) into `output` while the block runs.

    Stopped with SIGINT rather than given a --duration, so the recording covers the
    block exactly however long it takes.
    """
    log = output.with_suffix(".log")
    command = [
        py_spy(), "record", "--pid", str(pid), "--format", "raw", "--output", str(output),
        "--rate", str(SAMPLES_PER_SECOND),
    ]  # fmt: skip
    with log.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        _wait_until_sampling(process, log)
        yield
    finally:
        process.send_signal(signal.SIGINT)
        status = process.wait(30)
    if status != 0 or not output.exists():
        raise ProfileError(f"py-spy failed (status {status}): {log.read_text().strip()}")


def _wait_until_sampling(process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _ATTACH_TIMEOUT
    while b"Sampling process" not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise ProfileError(f"py-spy did not start sampling: {log.read_text().strip()}")
        time.sleep(0.05)


def read_profile(path: Path) -> Profile:
    """Parse py-spy's raw (collapsed) format: `frame;frame;...;leaf COUNT` per line,
    each frame `function (file:line)`."""
    stacks = list(_read_stacks(path))
    trunks = _trunks(functions for functions, _ in stacks)
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for functions, count in stacks:
        own[functions[-1]] += count
        # A set: a recursive function counts once per sample.
        for function in set(functions) - trunks[functions[0]]:
            total[function] += count
    return Profile(sum(count for _, count in stacks), own, total)


def _read_stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            yield [_LINE_NUMBER.sub(")", frame) for frame in stack.split(";")], int(count)


def _trunks(stacks: Iterable[list[str]]) -> dict[str, set[str]]:
    """Per root frame (one per kind of thread), the frames all its stacks start with."""
    prefixes: dict[str, list[str]] = {}
    for functions in stacks:
        prefix = prefixes.setdefault(functions[0], functions)
        common = 0
        while common < min(len(prefix), len(functions)) and prefix[common] == functions[common]:
            common += 1
        prefixes[functions[0]] = prefix[:common]
    return {root: set(prefix) for root, prefix in prefixes.items()}


def top_lines(profile: Profile, ranking: Counter[str], count: int = 15) -> list[str]:
    """The `count` heaviest functions of `ranking`, as lines `  12.3%  name (file)`."""
    return [
        f"  {samples / profile.samples:6.1%}  {function}"
        for function, samples in ranking.most_common(count)
    ]
