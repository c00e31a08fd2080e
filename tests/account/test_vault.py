"""Rotated credentials kept in the PostgreSQL store, sealed with RECOVERYD_CREDENTIALS_KEY:
every replica reads back what one saved, the table holds no secret in clear, and another
key cannot open them."""

from __future__ import annotations

import psycopg
import pytest
from cryptography.fernet import Fernet

from daemon.account import CredentialsFileError, Saved
from daemon.account.vault import StoreVault
from daemon.store import open_store
from daemon.upstream import Credentials

TOKEN = "tok_sealed_0123456789"
PASSWORD = "pw_sealed_0123456789"
SAVED = Saved(
    Credentials(TOKEN, "acct", PASSWORD), rotation=7, rotated_at=1_800_000_000.0,
    limits={"max_requests_per_second": 100},
)  # fmt: skip


async def test_what_one_replica_saves_another_reads(postgres_url: str) -> None:
    key = Fernet.generate_key().decode()
    async with open_store(postgres_url) as first, open_store(postgres_url) as second:
        assert await StoreVault(second, key).read() is None  # before the first rotation
        await StoreVault(first, key).write(SAVED)
        assert await StoreVault(second, key).read() == SAVED


async def test_the_store_holds_no_secret_in_clear(postgres_url: str) -> None:
    async with open_store(postgres_url) as store:
        await StoreVault(store, Fernet.generate_key().decode()).write(SAVED)
    with psycopg.connect(postgres_url) as connection:
        rows = connection.execute("SELECT sealed, rotation FROM credentials").fetchall()
    [(sealed, rotation)] = rows
    assert rotation == 7
    for secret in (TOKEN, PASSWORD, "acct"):
        assert secret.encode() not in bytes(sealed)


async def test_another_key_cannot_open_them_and_says_so(postgres_url: str) -> None:
    async with open_store(postgres_url) as store:
        await StoreVault(store, Fernet.generate_key().decode()).write(SAVED)
        other = Fernet.generate_key().decode()
        with pytest.raises(CredentialsFileError) as refused:
            await StoreVault(store, other).read()
    message = str(refused.value)
    assert "RECOVERYD_CREDENTIALS_KEY" in message
    assert TOKEN not in message
    assert other not in message
