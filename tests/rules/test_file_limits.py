"""Rules files that would cost more to load than any rules file needs are refused, fast,
at the line and column where they go too far: the alias bomb, deep nesting, too many
anchors, a file too large."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon.rules.yamlfile import (
    MAX_ALIASES,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    FileError,
    parse_document,
    read_document,
)
from tests.support import running_recoveryd

VALID = "version: 1\nrules:\n  - name: resume\n    match: {workflow: true}\n    action: resume\n"


def billion_laughs(levels: int = 9) -> str:
    """Each anchor a list of nine aliases of the one before: 9**levels values once
    expanded (387 million for nine levels) from a file of under a kilobyte."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def refusal(text: str) -> str:
    with pytest.raises(FileError) as caught:
        parse_document(text, "rules.yaml")
    (problem,) = caught.value.problems
    return str(problem)


def test_the_alias_bomb_is_refused_at_its_first_alias_without_expanding_it() -> None:
    started = time.perf_counter()
    assert refusal(billion_laughs()) == (
        "rules.yaml:2:10: <document>: the aliases expand the file past 100000 values"
    )
    assert time.perf_counter() - started < 1


def test_aliases_that_expand_modestly_are_fine() -> None:
    shared = "base: &base {workflow: true}\n" + VALID.replace("{workflow: true}", "*base")
    assert parse_document(shared, "rules.yaml").data["rules"][0]["match"] == {"workflow": True}


def test_more_anchors_than_allowed_are_refused_at_the_first_too_many() -> None:
    text = "".join(f"k{n}: &x{n} 1\n" for n in range(MAX_ALIASES + 5))
    assert refusal(text) == (
        f"rules.yaml:{MAX_ALIASES + 1}:{len(f'k{MAX_ALIASES}: ') + 1}: <document>: "
        f"more than {MAX_ALIASES} anchors; a rules file needs a few at most"
    )


def test_more_aliases_than_allowed_are_refused() -> None:
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_ALIASES + 1)) + "]\n"
    assert "more than 100 aliases" in refusal(text)


def test_deep_nesting_is_refused_before_the_parser_spends_minutes_on_it() -> None:
    """Half a megabyte of `[`: the parser's time grows with the square of the depth."""
    started = time.perf_counter()
    message = refusal("[" * 250_000 + "]" * 250_000)
    assert message == f"rules.yaml:1:{MAX_DEPTH + 1}: <document>: nested deeper than 50 levels"
    assert time.perf_counter() - started < 5


def test_a_file_over_the_size_cap_is_refused_where_it_passes_it(tmp_path: Path) -> None:
    """Reported at the line and column of the first byte too many; a huge file is not
    read whole (a sparse 4 GiB file here)."""
    path = tmp_path / "rules.yaml"
    path.write_text("version: 1\n# " + "x" * MAX_FILE_BYTES)
    with pytest.raises(FileError) as caught:
        read_document(path)
    assert str(caught.value) == (
        f"{path}:2:{MAX_FILE_BYTES - len('version: 1')}: <document>: "
        f"the file is over {MAX_FILE_BYTES} bytes, the most a rules file may be"
    )
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as stream:
        stream.truncate(4 * 2**30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(FileError, match="the file is over"):
        read_document(huge)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB


def test_recoveryd_check_reports_the_bomb_as_an_invalid_file(tmp_path: Path) -> None:
    """Exit 1 (invalid), the problem on one line, in well under a second of parsing."""
    path = tmp_path / "rules.yaml"
    path.write_text(VALID + billion_laughs())
    result = subprocess.run(
        [sys.executable, "-m", "daemon", "check", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "the aliases expand the file past 100000 values" in result.stdout + result.stderr


async def test_a_reload_of_a_bomb_is_refused_and_the_running_rules_stay(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(VALID)
    async with running_recoveryd(tmp_path, RULES=str(rules)) as recoveryd:
        rules.write_text(VALID + billion_laughs())
        answer = await recoveryd.admin.post("/-/reload")
        assert answer.status_code == 400
        assert answer.json()["problems"] == [
            f"{rules}:7:10: <document>: the aliases expand the file past 100000 values"
        ]
        assert recoveryd.daemon.rules.current.rules[0].name == "resume"
