"""The token reset (spec 4.2) with basic auth, and what it does to the old credentials."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from daemon.emulator import Emulator
from tests.emulator.support import PASSWORD, TOKEN, USERNAME, basic

ROTATE = "/service/user/rotatetoken"
SAMPLE = Path(__file__).parents[1] / "testdata" / "samples" / "account-record.json"


async def test_reset_returns_the_full_account_record(anonymous: httpx.AsyncClient) -> None:
    """Every field of the sample account record, with new credentials."""
    response = await anonymous.post(ROTATE, headers=basic(USERNAME, PASSWORD))
    assert response.status_code == 200
    record = response.json()
    assert set(record) == set(json.loads(SAMPLE.read_text()))
    assert record["token"] != TOKEN
    assert record["password"] != PASSWORD
    assert record["customer_id"] == USERNAME


async def test_old_token_is_refused_after_the_reset(anonymous: httpx.AsyncClient) -> None:
    """The token in force before the reset is a 401; the new one works."""
    record = (await anonymous.post(ROTATE, headers=basic(USERNAME, PASSWORD))).json()
    old = await anonymous.get("/v2/dlq/1-0", headers={"Authorization": f"Bearer {TOKEN}"})
    new = await anonymous.get("/v2/dlq/1-0", headers={"Authorization": f"Bearer {record['token']}"})
    assert (old.status_code, new.status_code) == (401, 404)


async def test_old_password_is_refused_after_the_reset(anonymous: httpx.AsyncClient) -> None:
    """A second reset with the old password is a 401; with the new one it succeeds."""
    record = (await anonymous.post(ROTATE, headers=basic(USERNAME, PASSWORD))).json()
    old = await anonymous.post(ROTATE, headers=basic(USERNAME, PASSWORD))
    new = await anonymous.post(ROTATE, headers=basic(USERNAME, record["password"]))
    assert (old.status_code, new.status_code) == (401, 200)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        basic(USERNAME, "wrong"),
        basic("someone@example.com", PASSWORD),
        {"Authorization": f"Bearer {TOKEN}"},
        {"Authorization": "Basic !!!not-base64"},
    ],
)
async def test_wrong_or_missing_basic_credentials_are_401(
    anonymous: httpx.AsyncClient, emulator: Emulator, headers: dict[str, str]
) -> None:
    """Only the account's username and password reset the token; nothing changes otherwise."""
    response = await anonymous.post(ROTATE, headers=headers)
    assert response.status_code == 401
    assert set(response.json()) == {"error"}
    assert emulator.account.token == TOKEN


async def test_record_reports_the_rate_limit_in_force(
    anonymous: httpx.AsyncClient, emulator: Emulator
) -> None:
    """max_requests_per_second in the record is the limit the emulator enforces."""
    emulator.max_requests_per_second = 37
    record = (await anonymous.post(ROTATE, headers=basic(USERNAME, PASSWORD))).json()
    assert record["max_requests_per_second"] == 37
