"""Several RECOVERYD_CREDENTIALS_KEY keys (the first seals, all open) and `recoveryd
reseal`, as a separate process on a real PostgreSQL store: a key is changed without a
moment where the saved credentials cannot be read, and no key is ever printed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from cryptography.fernet import Fernet

from daemon.account import CredentialsFileError, Saved
from daemon.account.vault import StoreVault
from daemon.store import open_store
from daemon.upstream import Credentials
from tests.processes import environ

SAVED = Saved(Credentials("tok_resealed_0123", "acct", "pw_resealed_4567"), rotation=3)


def reseal(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daemon", "reseal"],
        env=environ(tmp_path, **settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def write(url: str, keys: str) -> None:
    async with open_store(url) as store:
        await StoreVault(store, keys).write(SAVED)


async def read(url: str, keys: str) -> Saved | None:
    async with open_store(url) as store:
        return await StoreVault(store, keys).read()


def sealed_row(url: str) -> tuple[bytes, int | None]:
    with psycopg.connect(url) as connection:
        [(sealed, rotation)] = connection.execute("SELECT sealed, rotation FROM credentials")
    return bytes(sealed), rotation


async def test_the_first_key_seals_and_every_key_opens(postgres_url: str) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    await write(postgres_url, old)
    assert await read(postgres_url, f"{new},{old}") == SAVED  # the old key still opens
    await write(postgres_url, f"{new}, {old}")
    assert await read(postgres_url, new) == SAVED  # sealed under the first
    with pytest.raises(CredentialsFileError):
        await read(postgres_url, old)


def test_reseal_moves_the_row_to_the_first_key(tmp_path: Path, postgres_url: str) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    asyncio.run(write(postgres_url, old))
    before = sealed_row(postgres_url)
    done = reseal(tmp_path, STORE=postgres_url, CREDENTIALS_KEY=f"{new},{old}")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "the saved credentials are sealed under the first of RECOVERYD_CREDENTIALS_KEY's "
        "2 keys; the others may now leave the setting, on every replica\n"
    )
    after = sealed_row(postgres_url)
    assert after[0] != before[0]
    assert after[1] == 3  # the rotation that saved them, kept
    assert asyncio.run(read(postgres_url, new)) == SAVED
    with pytest.raises(CredentialsFileError):
        asyncio.run(read(postgres_url, old))
    for secret in (old, new, "tok_resealed_0123", "pw_resealed_4567"):
        assert secret not in done.stdout + done.stderr


async def made(url: str) -> None:
    """The store, as `serve` makes it at its first start."""
    async with open_store(url):
        pass


def test_reseal_with_nothing_saved_says_so(tmp_path: Path, postgres_url: str) -> None:
    asyncio.run(made(postgres_url))
    done = reseal(tmp_path, STORE=postgres_url, CREDENTIALS_KEY=Fernet.generate_key().decode())
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no credentials are saved in the store yet: nothing to reseal\n"


def test_reseal_refuses_a_database_serve_never_made_a_store(
    tmp_path: Path, postgres_url: str
) -> None:
    """A database without recoveryd's schema (RECOVERYD_STORE not as for serve) is not
    read as a store with nothing saved, and is left without one."""
    done = reseal(tmp_path, STORE=postgres_url, CREDENTIALS_KEY=Fernet.generate_key().decode())
    assert done.returncode == 1
    assert done.stderr.startswith("Error: no store in the PostgreSQL database postgresql://")
    assert done.stderr.endswith(": is RECOVERYD_STORE set as for serve?\n")
    with psycopg.connect(postgres_url) as connection:
        assert connection.execute("SELECT to_regclass('recoveryd_schema')").fetchone() == (None,)


def test_reseal_without_the_old_key_changes_nothing(tmp_path: Path, postgres_url: str) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    asyncio.run(write(postgres_url, old))
    before = sealed_row(postgres_url)
    done = reseal(tmp_path, STORE=postgres_url, CREDENTIALS_KEY=new)
    assert done.returncode == 1
    assert "open with none of RECOVERYD_CREDENTIALS_KEY's keys" in done.stderr
    assert sealed_row(postgres_url) == before
    assert new not in done.stderr


def test_reseal_needs_the_key(tmp_path: Path) -> None:
    done = reseal(tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("Error: RECOVERYD_CREDENTIALS_KEY: required: the keys the ")


def test_reseal_on_sqlite_says_once_that_it_needs_postgresql(tmp_path: Path) -> None:
    """A key with a SQLite store: one line, the store's, for the one cause."""
    done = reseal(
        tmp_path, STORE=f"sqlite:///{tmp_path}/x.db", CREDENTIALS_KEY=Fernet.generate_key().decode()
    )
    assert done.returncode == 1
    assert done.stderr == (
        "Error: RECOVERYD_STORE: must be a PostgreSQL store (postgresql://...): "
        "the saved credentials are sealed into it\n"
    )
