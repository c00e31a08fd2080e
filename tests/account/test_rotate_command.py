"""`recoveryd rotate-token` as a separate process against the emulator: done in its own
process when no daemon runs, by the daemon when one does, and refused or failed with a
reason and exit status 1, never printing a secret."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from cryptography.fernet import Fernet

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from tests.processes import environ, free_port, serving
from tests.support import LOOPBACK_TLS, PASSWORD, TOKEN, USERNAME, emulator_config

WRONG_PASSWORD = "pw_tests_wrong_password"


@pytest.fixture
def service_url() -> Iterator[str]:
    with serve_in_thread(create_app(emulator_config(execute_runs=False))) as url:
        yield url


def rotate_token(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daemon", "rotate-token", "--timeout", "15s"],
        env=environ(tmp_path, **settings),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def rotate_alone(
    tmp_path: Path, service_url: str, credentials: Path, **changes: str
) -> subprocess.CompletedProcess[str]:
    """The command with no daemon to ask (nothing listens on its admin address)."""
    settings = {
        "SERVICE_URL": service_url,
        "CREDENTIALS_FILE": str(credentials),
        "ACCOUNT_USERNAME": USERNAME,
        "ACCOUNT_PASSWORD": PASSWORD,
        "ADMIN_LISTEN": f"127.0.0.1:{free_port()}",
    }
    return rotate_token(tmp_path, **(settings | changes))


def check_token(service_url: str, token: str) -> int:
    """404 for a token the service takes (no such dlqId), 401 for one it refuses."""
    response = httpx.get(
        f"{service_url}/v2/dlq/nope",
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
        verify=LOOPBACK_TLS,
    )
    return response.status_code


def secrets_absent(output: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in output


def test_with_no_daemon_the_command_rotates_and_saves(tmp_path: Path, service_url: str) -> None:
    credentials = tmp_path / "credentials.json"
    done = rotate_alone(tmp_path, service_url, credentials)
    assert done.returncode == 0, done.stderr
    assert "token rotated" in done.stdout
    assert "by the daemon" not in done.stdout
    assert str(credentials) in done.stdout
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    saved = json.loads(credentials.read_text())
    assert saved["token"] != TOKEN
    assert saved["password"] != PASSWORD
    assert saved["username"] == USERNAME
    assert check_token(service_url, saved["token"]) == 404
    assert check_token(service_url, TOKEN) == 401
    secrets_absent(done.stdout + done.stderr, TOKEN, PASSWORD, saved["token"], saved["password"])


def test_the_command_needs_neither_a_token_nor_a_signing_key(
    tmp_path: Path, service_url: str
) -> None:
    """The reset takes basic credentials, and a command checks no callback: a first
    rotation, to get a token at all, works with neither set."""
    unset = {"TOKEN": "", "SIGNING_KEY_CURRENT": "", "SIGNING_KEY_NEXT": ""}
    done = rotate_alone(tmp_path, service_url, tmp_path / "credentials.json", **unset)
    assert done.returncode == 0, done.stderr
    assert "token rotated" in done.stdout


def test_with_a_daemon_running_the_daemon_rotates(tmp_path: Path, service_url: str) -> None:
    credentials = tmp_path / "credentials.json"
    settings = {
        "SERVICE_URL": service_url,
        "CREDENTIALS_FILE": str(credentials),
        "ACCOUNT_USERNAME": USERNAME,
        "ACCOUNT_PASSWORD": PASSWORD,
    }
    with serving(tmp_path, **settings) as served:
        admin_port = urlsplit(served.admin_url).port
        done = rotate_token(tmp_path, **settings, ADMIN_LISTEN=f"127.0.0.1:{admin_port}")
        assert done.returncode == 0, done.stderr
        assert "by the daemon" in done.stdout
        status = httpx.get(
            f"{served.admin_url}/api/v1/status", timeout=5, verify=LOOPBACK_TLS
        ).json()
        assert status["lastTokenRotation"]["result"] == "success"
        metrics = httpx.get(f"{served.admin_url}/metrics", timeout=5, verify=LOOPBACK_TLS).text
        assert re.search(
            r'^recoveryd_token_rotations_total\{result="success"\} 1\.0$', metrics, re.MULTILINE
        ), metrics
        saved = json.loads(credentials.read_text())
        assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
        assert check_token(service_url, saved["token"]) == 404
        assert check_token(service_url, TOKEN) == 401
        _, logs = served.stop()
    printed = done.stdout + done.stderr + logs
    secrets_absent(printed, TOKEN, PASSWORD, saved["token"], saved["password"])


def test_without_the_password_nothing_is_rotated(tmp_path: Path, service_url: str) -> None:
    credentials = tmp_path / "credentials.json"
    done = rotate_alone(tmp_path, service_url, credentials, ACCOUNT_PASSWORD="")
    assert done.returncode == 1
    assert "RECOVERYD_ACCOUNT_USERNAME and RECOVERYD_ACCOUNT_PASSWORD" in done.stderr
    assert not credentials.exists()
    assert check_token(service_url, TOKEN) == 404
    secrets_absent(done.stdout + done.stderr, TOKEN)


def test_refused_basic_credentials_end_in_failure(tmp_path: Path, service_url: str) -> None:
    credentials = tmp_path / "credentials.json"
    done = rotate_alone(tmp_path, service_url, credentials, ACCOUNT_PASSWORD=WRONG_PASSWORD)
    assert done.returncode == 1
    assert "ended in failure" in done.stderr
    assert not credentials.exists()
    assert [p.name for p in tmp_path.iterdir() if "credentials" in p.name] == []
    assert check_token(service_url, TOKEN) == 404
    secrets_absent(done.stdout + done.stderr, TOKEN, PASSWORD, WRONG_PASSWORD)


def test_a_rotation_prints_its_message_and_nothing_else(tmp_path: Path, service_url: str) -> None:
    """A command run by hand: its answer on stdout, and no log line (the daemon's JSON
    lines, such as "token rotation started", are for a log collector)."""
    credentials = tmp_path / "credentials.json"
    done = rotate_alone(tmp_path, service_url, credentials)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"token rotated (rotation 1); credentials saved to {credentials}\n"
    assert done.stderr == ""


def test_its_warnings_go_to_stderr_as_text_and_as_json_only_when_asked(
    tmp_path: Path, service_url: str
) -> None:
    """A credentials file others can read is warned about on stderr: a line for a person
    by default, JSON with RECOVERYD_LOG_FORMAT=json; stdout has the answer alone."""
    credentials = tmp_path / "credentials.json"
    credentials.write_text(json.dumps({"token": TOKEN}))
    for log_format, rotation in (("", 1), ("json", 2)):
        credentials.chmod(0o644)  # the rotation wrote it 0600 again: readable once more
        done = rotate_alone(tmp_path, service_url, credentials, LOG_FORMAT=log_format)
        assert done.returncode == 0, done.stderr
        saved_to = f"credentials saved to {credentials}"
        assert done.stdout == f"token rotated (rotation {rotation}); {saved_to}\n"
        (line,) = done.stderr.splitlines()
        assert "the credentials file can be read by others" in line
        if log_format == "json":
            assert json.loads(line)["level"] == "warning"
        else:
            assert not line.startswith("{"), line
            assert "[warning  ]" in line


def test_with_postgresql_the_new_token_is_sealed_into_the_store(
    tmp_path: Path, service_url: str, postgres_url: str
) -> None:
    shared = {"STORE": postgres_url, "CREDENTIALS_KEY": Fernet.generate_key().decode()}
    done = rotate_alone(tmp_path, service_url, tmp_path / "unused.json", CREDENTIALS_FILE="",
                        **shared)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "token rotated (rotation 1); credentials saved to the store, sealed with "
        "RECOVERYD_CREDENTIALS_KEY\n"
    )
    assert check_token(service_url, TOKEN) == 401
