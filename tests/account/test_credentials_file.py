"""The credentials file on real files: what it keeps, its mode, its atomic replacement, and
errors that name the file but never show what is in it."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.account import credentials_file
from daemon.account.credentials_file import CredentialsFileError, Saved
from daemon.upstream import Credentials

SECRET = "sk_live_SUPERSECRET_4242"
NEW_TOKEN = "tok_new_secret_token_value"
NEW_PASSWORD = "pw_new_secret_password_value"


def saved(token: str = NEW_TOKEN, password: str | None = NEW_PASSWORD) -> Saved:
    return Saved(Credentials(token, "ops@example.com", password))


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def test_everything_saved_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    original = Saved(
        Credentials("tok_round_trip", "ops@example.com", "pw_round_trip"),
        rotation=12,
        rotated_at=1795000000.25,
        limits={"max_requests_per_second": 100, "max_dlq_retention_time_milis": 604800000},
    )
    credentials_file.write(path, original)
    assert credentials_file.read(path) == original


def test_the_least_saved_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    original = Saved(Credentials("tok_only"))
    credentials_file.write(path, original)
    assert credentials_file.read(path) == original
    assert json.loads(path.read_text()) == {"token": "tok_only", "limits": {}}


def test_the_file_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    with umask(0o022):
        credentials_file.write(path, saved())
    assert mode_of(path) == 0o600
    assert not credentials_file.readable_by_others(path)


def test_an_existing_0644_file_is_replaced_by_a_0600_one(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    path.write_text('{"token": "tok_by_hand"}')
    path.chmod(0o644)
    with umask(0o022):
        credentials_file.write(path, saved())
    assert mode_of(path) == 0o600
    assert credentials_file.read(path) == saved()


def test_a_reader_never_sees_a_half_written_file(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    written = [saved(f"tok_{i:04d}_" + "x" * (i * 7 % 500), f"pw_{i}") for i in range(300)]
    credentials_file.write(path, saved("tok_first"))
    tokens = {"tok_first"} | {one.credentials.token for one in written}
    stop = threading.Event()
    seen: list[str] = []
    problems: list[BaseException] = []

    def reread() -> None:
        while not stop.is_set():
            try:
                found = credentials_file.read(path)
            except BaseException as exc:
                problems.append(exc)
                return
            if found is None:
                problems.append(AssertionError("the file was missing"))
                return
            seen.append(found.credentials.token)

    reader = threading.Thread(target=reread, name="reader")
    reader.start()
    try:
        for one in written:
            credentials_file.write(path, one)
    finally:
        stop.set()
        reader.join(10)
    assert not problems, problems[:3]
    assert seen, "the reader read nothing"
    assert set(seen) <= tokens
    assert credentials_file.read(path) == written[-1]
    assert [p.name for p in tmp_path.iterdir()] == ["credentials.json"]


def _unwritable(tmp_path: Path) -> Path:
    """A credentials path whose folder takes no new file: read-only, or (for root, whom
    permissions do not stop) a regular file."""
    if os.geteuid() == 0:
        parent = tmp_path / "not-a-folder"
        parent.write_text("a regular file")
        return parent / "credentials.json"
    folder = tmp_path / "folder"
    folder.mkdir()
    path = folder / "credentials.json"
    credentials_file.write(path, saved("tok_old", "pw_old"))
    folder.chmod(0o500)
    return path


def test_a_failed_write_raises_and_changes_nothing(tmp_path: Path) -> None:
    path = _unwritable(tmp_path)
    folder = path.parent
    before = path.read_bytes() if path.exists() else None
    listing = sorted(os.listdir(folder)) if folder.is_dir() else None
    try:
        with pytest.raises(CredentialsFileError) as caught:
            credentials_file.write(path, saved())
    finally:
        if folder.is_dir():
            folder.chmod(0o700)
    message = str(caught.value)
    assert str(path) in message
    assert NEW_TOKEN not in message
    assert NEW_PASSWORD not in message
    if before is not None:
        assert path.read_bytes() == before
        assert sorted(os.listdir(folder)) == listing
    else:
        assert not path.exists()
        assert (tmp_path / "not-a-folder").read_text() == "a regular file"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder"]


@contextlib.contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """Writes past `size` bytes fail with EFBIG (SIGXFSZ ignored instead of fatal)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_a_write_failing_halfway_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path,
) -> None:
    """The temporary file is created and partly written before the failure (this runs
    as root too: a file size limit stops root as well)."""
    path = tmp_path / "credentials.json"
    credentials_file.write(path, saved("tok_old", "pw_old"))
    before = path.read_bytes()
    big = saved(NEW_TOKEN + "y" * 4000)
    with file_size_limit(1024), pytest.raises(CredentialsFileError) as caught:
        credentials_file.write(path, big)
    message = str(caught.value)
    assert str(path) in message
    assert NEW_TOKEN not in message
    assert NEW_PASSWORD not in message
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["credentials.json"]


def test_a_missing_file_reads_as_none(tmp_path: Path) -> None:
    assert credentials_file.read(tmp_path / "absent.json") is None


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(f"token: {SECRET}".encode(), id="not-json"),
        pytest.param(b'{"token": "' + SECRET.encode() + b"\xff\xfe", id="not-utf8"),
        pytest.param(json.dumps([SECRET]).encode(), id="a-list"),
        pytest.param(json.dumps(SECRET).encode(), id="a-string"),
        pytest.param(json.dumps({"password": SECRET}).encode(), id="no-token"),
        pytest.param(json.dumps({"token": "", "password": SECRET}).encode(), id="empty-token"),
        pytest.param(json.dumps({"token": "  ", "password": SECRET}).encode(), id="blank-token"),
        pytest.param(json.dumps({"token": 4242, "password": SECRET}).encode(), id="token-number"),
        pytest.param(json.dumps({"token": SECRET, "password": ""}).encode(), id="empty-password"),
        pytest.param(json.dumps({"token": SECRET, "limits": [1]}).encode(), id="limits-list"),
        pytest.param(
            json.dumps({"token": SECRET, "limits": {"max_requests_per_second": SECRET}}).encode(),
            id="limits-text",
        ),
        pytest.param(
            json.dumps({"token": SECRET, "limits": {"max_requests_per_second": 1.5}}).encode(),
            id="limits-fraction",
        ),
        pytest.param(
            json.dumps({"token": SECRET, "limits": {"max_requests_per_second": True}}).encode(),
            id="limits-bool",
        ),
        pytest.param(json.dumps({"token": SECRET, "rotation": SECRET}).encode(), id="rotation"),
        pytest.param(json.dumps({"token": SECRET, "rotatedAt": True}).encode(), id="rotated-at"),
    ],
)
def test_a_bad_file_is_an_error_naming_it_without_its_contents(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "credentials.json"
    path.write_bytes(content)
    with pytest.raises(CredentialsFileError) as caught:
        credentials_file.read(path)
    message = str(caught.value)
    assert str(path) in message
    assert SECRET not in message
    assert "4242" not in message
    # No chained exception either: a traceback would show it (a decode error shows bytes).
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None or caught.value.__suppress_context__


def test_a_file_written_by_hand_with_only_a_token(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    path.write_text('{"token": "x"}')
    found = credentials_file.read(path)
    assert found == Saved(Credentials("x"))
    assert found is not None
    assert (found.credentials.username, found.credentials.password) == (None, None)
    assert (found.rotation, found.rotated_at, found.limits) == (None, None, {})


def test_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    path.write_text('{"token": "x"}')
    path.chmod(0o644)
    assert credentials_file.readable_by_others(path)
    path.chmod(0o600)
    assert not credentials_file.readable_by_others(path)
    path.chmod(0o640)
    assert credentials_file.readable_by_others(path)
    assert not credentials_file.readable_by_others(tmp_path / "absent.json")
