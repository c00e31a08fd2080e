"""`recoveryd set-token` as a separate process, against the emulator: a token from the
service's console ends a running daemon's lockout (the credentials file with SQLite, the
store's sealed row with PostgreSQL), a token the service refuses is not saved, nor is
any while a rotation is under way, and no secret is ever printed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
from cryptography.fernet import Fernet

from daemon.account import CredentialsFileError
from daemon.account.vault import StoreVault
from daemon.store import open_store
from tests.account.support import RESET, emulator, send_callbacks, served_settings, status
from tests.processes import Served, environ, free_port, serving
from tests.support import PASSWORD, TOKEN, USERNAME, wait_for, workflows


def set_token(
    tmp_path: Path, given: str, *args: str, **settings: str
) -> subprocess.CompletedProcess[str]:
    """`recoveryd set-token --from - ARGS`, `given` on its standard input."""
    return subprocess.run(
        [sys.executable, "-m", "daemon", "set-token", "--from", "-", *args],
        env=environ(tmp_path, **settings),
        input=given,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def admin_of(served: Served) -> str:
    return f"127.0.0.1:{urlsplit(served.admin_url).port}"


def reset_elsewhere(control: httpx.Client) -> dict[str, str]:
    """The token reset in the service's console: recoveryd's token is revoked."""
    reset = control.post(RESET, auth=(USERNAME, PASSWORD))
    reset.raise_for_status()
    answer: dict[str, str] = reset.json()
    return answer


def lock_out(served: Served, control: httpx.Client, count: int, *others: Served) -> None:
    """Dead letters, sent to `served`, whose fetches are refused: a replica that fetches
    one (`served`, or one of `others` sharing its store) locks out."""
    dlq_ids = control.post("/_emulator/dlq", json={"messages": workflows(count)}).json()
    send_callbacks(served, dlq_ids["dlqIds"])
    replicas = (served, *others)
    wait_for(lambda: any(status(s)["token"]["lockedOut"] for s in replicas), what="a lockout")


def test_a_token_from_the_console_ends_a_running_daemons_lockout(tmp_path: Path) -> None:
    credentials = tmp_path / "credentials.json"
    with emulator() as (service_url, control, _):
        settings = served_settings(tmp_path, service_url, credentials)
        with serving(tmp_path, **settings) as served:
            new = reset_elsewhere(control)
            lock_out(served, control, 5)
            done = set_token(
                tmp_path, new["token"] + "\n", **settings, ADMIN_LISTEN=admin_of(served)
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.splitlines() == [
                f"token saved to {credentials}",
                f"the daemon at {served.admin_url} took it up",
            ]
            # Taken up at once, not at the lockout's next look at the file (30 s).
            answer = status(served)
            assert answer["token"]["lockedOut"] is False
            assert answer["token"]["problems"] == []
            wait_for(lambda: status(served)["states"]["done"] == 5, what="the work, done")
            _, logs = served.stop()
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    saved = json.loads(credentials.read_text())
    assert saved["token"] == new["token"]
    assert "rotation" not in saved  # an operator's token, not a rotation's
    for secret in (TOKEN, PASSWORD, new["token"], new["password"]):
        assert secret not in done.stdout + done.stderr + logs


def test_the_json_form_sets_the_password_too_and_keeps_the_limits(tmp_path: Path) -> None:
    """After a lockout the reset has replaced the password as well: given as the
    credentials file's JSON, it is saved with the token; what was saved before and is
    not given again (the username, the account's limits) stays."""
    credentials = tmp_path / "credentials.json"
    before = {"token": TOKEN, "username": USERNAME, "limits": {"max_requests_per_second": 7}}
    credentials.write_text(json.dumps(before))
    with emulator() as (service_url, control, _):
        new = reset_elsewhere(control)
        given = json.dumps({"token": new["token"], "password": new["password"]})
        settings = {"SERVICE_URL": service_url, "CREDENTIALS_FILE": str(credentials)}
        done = set_token(tmp_path, given, **settings, ADMIN_LISTEN=f"127.0.0.1:{free_port()}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith("no daemon answers at http://127.0.0.1:")
    saved = json.loads(credentials.read_text())
    assert saved == {
        "token": new["token"],
        "password": new["password"],
        "username": USERNAME,
        "limits": {"max_requests_per_second": 7},
    }


def test_a_token_the_service_refuses_is_not_saved(tmp_path: Path) -> None:
    credentials = tmp_path / "credentials.json"
    with emulator() as (service_url, _, _):
        settings = {"SERVICE_URL": service_url, "CREDENTIALS_FILE": str(credentials)}
        done = set_token(tmp_path, "tok_not_the_accounts", **settings)
    assert done.returncode == 1
    assert "the service refuses this token; not saved" in done.stderr
    assert not credentials.exists()
    assert "tok_not_the_accounts" not in done.stdout + done.stderr


def test_no_token_is_saved_while_a_rotation_is_under_way(tmp_path: Path) -> None:
    """The rotation's reset would revoke it, and its save would overwrite it (or be
    overwritten by a token the service no longer takes)."""
    credentials = tmp_path / "credentials.json"
    database = tmp_path / "recoveryd.db"

    async def begin_rotation() -> None:
        async with open_store(f"sqlite:///{database}") as store:
            assert await store.begin_rotation(1_800_000_000.0) == 1

    asyncio.run(begin_rotation())
    with emulator() as (service_url, _, _):
        settings = {"SERVICE_URL": service_url, "CREDENTIALS_FILE": str(credentials)}
        done = set_token(tmp_path, TOKEN, **settings)
    assert done.returncode == 1
    assert "a token rotation is under way; not saved" in done.stderr
    assert not credentials.exists()
    with contextlib.closing(sqlite3.connect(database)) as connection:
        assert connection.execute("SELECT result FROM rotations").fetchall() == [(None,)]


def test_malformed_input_is_refused_without_showing_it(tmp_path: Path) -> None:
    settings = {"CREDENTIALS_FILE": str(tmp_path / "c.json")}
    for given, said in (
        ("", "standard input is empty"),
        ("tok_one tok_two\n", "holds more than one word"),
        ('{"password": "pw_only_secret"}', "'token' must be a non-empty string"),
    ):
        done = set_token(tmp_path, given, "--no-check", **settings)
        assert done.returncode == 1, given
        assert said in done.stderr
        assert "tok_one" not in done.stderr
        assert "pw_only_secret" not in done.stderr
    assert not (tmp_path / "c.json").exists()


def test_without_from_the_token_comes_from_the_token_file(tmp_path: Path) -> None:
    """As PRODUCT.md has it: RECOVERYD_TOKEN_FILE (a Secret's mounted file, updated with
    the new token) is read when no --from is given."""
    credentials, token_file = tmp_path / "credentials.json", tmp_path / "token"
    token_file.write_text("tok_from_the_secret\n")
    done = subprocess.run(
        [sys.executable, "-m", "daemon", "set-token", "--no-check"],
        env=environ(
            tmp_path, TOKEN="", TOKEN_FILE=str(token_file), CREDENTIALS_FILE=str(credentials)
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(credentials.read_text())["token"] == "tok_from_the_secret"
    assert "tok_from_the_secret" not in done.stdout + done.stderr


def test_nowhere_to_save_it_is_said(tmp_path: Path) -> None:
    done = set_token(tmp_path, TOKEN, "--no-check")
    assert done.returncode == 1
    assert done.stderr == (
        "Error: RECOVERYD_CREDENTIALS_FILE: required, or RECOVERYD_CREDENTIALS_KEY: where the "
        "new token is kept (the key seals it into a PostgreSQL store)\n"
    )


def test_with_postgresql_the_token_is_sealed_and_every_replica_takes_it_up(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two replicas locked out; the command, run beside one of them, seals the token
    into the store: the one it asks takes it up at once, the other follows."""
    key = Fernet.generate_key().decode()
    with emulator() as (service_url, control, _):
        settings = served_settings(tmp_path, service_url, tmp_path / "unused.json")
        del settings["CREDENTIALS_FILE"]
        settings |= {"STORE": postgres_url, "CREDENTIALS_KEY": key}
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        with (
            serving(tmp_path / "a", **settings) as first,
            serving(tmp_path / "b", **settings) as second,
        ):
            new = reset_elsewhere(control)
            lock_out(first, control, 3, second)
            done = set_token(tmp_path, new["token"], **settings, ADMIN_LISTEN=admin_of(first))
            assert done.returncode == 0, done.stderr
            # The one asked takes it up, unless its own look at the store (a locked-out
            # daemon re-reads it) came first, as it may on a loaded machine.
            saved, asked = done.stdout.splitlines()
            assert saved == "token saved to the store, sealed with RECOVERYD_CREDENTIALS_KEY"
            assert asked in (
                f"the daemon at {first.admin_url} took it up",
                f"the daemon at {first.admin_url} already had this token",
            )
            assert status(first)["token"]["lockedOut"] is False
            wait_for(lambda: not status(second)["token"]["lockedOut"], what="the other replica")
            wait_for(lambda: status(first)["states"]["done"] == 3, what="the work, done")
            logs = first.stop()[1] + second.stop()[1]
    with psycopg.connect(postgres_url) as connection:
        [(sealed, rotation)] = connection.execute("SELECT sealed, rotation FROM credentials")
    assert rotation is None
    assert new["token"].encode() not in bytes(sealed)

    async def read() -> str:
        async with open_store(postgres_url) as store:
            saved = await StoreVault(store, key).read()
            assert saved is not None
            return saved.credentials.token

    assert asyncio.run(read()) == new["token"]
    for secret in (TOKEN, PASSWORD, new["token"], key):
        assert secret not in done.stdout + done.stderr + logs


def test_with_postgresql_none_is_saved_while_a_rotation_is_under_way(
    tmp_path: Path, postgres_url: str
) -> None:
    key = Fernet.generate_key().decode()

    async def begin_rotation_then_read() -> None:
        async with open_store(postgres_url) as store:
            assert await store.begin_rotation(1_800_000_000.0) is not None

    asyncio.run(begin_rotation_then_read())
    settings = {"STORE": postgres_url, "CREDENTIALS_KEY": key}
    done = set_token(tmp_path, TOKEN, "--no-check", **settings)
    assert done.returncode == 1
    assert "a token rotation is under way; not saved" in done.stderr
    with psycopg.connect(postgres_url) as connection:
        assert connection.execute("SELECT count(*) FROM credentials").fetchone() == (0,)


def test_a_store_sealed_under_a_lost_key_is_mended_by_a_new_token(
    tmp_path: Path, postgres_url: str
) -> None:
    """The key is lost: nothing opens the saved row and no replica starts. set-token with
    a new key and --replace-unreadable replaces the row (the password it held is gone
    with the key); without it, it refuses (the key given may be the wrong one)."""
    lost, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()

    async def seal_under_lost() -> None:
        async with open_store(postgres_url) as store:
            from daemon.account import Saved
            from daemon.upstream import Credentials

            await StoreVault(store, lost).write(Saved(Credentials("tok_lost_key")))

    asyncio.run(seal_under_lost())
    with psycopg.connect(postgres_url) as connection:
        [(before,)] = connection.execute("SELECT sealed FROM credentials")
    settings = {"STORE": postgres_url, "CREDENTIALS_KEY": new_key}
    # A key that opens nothing may be a mistake here, not a lost key: refused by default.
    refused = set_token(tmp_path, TOKEN, "--no-check", **settings)
    assert refused.returncode == 1
    assert "--replace-unreadable replaces them" in refused.stderr
    with psycopg.connect(postgres_url) as connection:
        assert connection.execute("SELECT sealed FROM credentials").fetchall() == [(before,)]
    done = set_token(tmp_path, TOKEN, "--no-check", "--replace-unreadable", **settings)
    assert done.returncode == 0, done.stderr
    assert "could not be read and are replaced" in done.stdout

    async def read(key: str) -> str:
        async with open_store(postgres_url) as store:
            saved = await StoreVault(store, key).read()
            assert saved is not None
            return saved.credentials.token

    assert asyncio.run(read(new_key)) == TOKEN
    try:
        asyncio.run(read(lost))
    except CredentialsFileError:
        pass
    else:
        raise AssertionError("the lost key still opens the row")
