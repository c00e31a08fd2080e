"""The control API: seeding, listing, reset and idle."""

from __future__ import annotations

import httpx

from daemon.emulator import Emulator
from tests.emulator.support import PASSWORD, START, TOKEN, USERNAME, basic, seed, workflow


async def test_seed_fills_in_defaults(client: httpx.AsyncClient) -> None:
    """dlqId is `<ms>-<seq>`, createdAt is now by the emulator clock."""
    [dlq_id] = await seed(client, {"url": "https://a.example.com"})
    message = (await client.get(f"/v2/dlq/{dlq_id}")).json()
    assert dlq_id == f"{int(START * 1000)}-0"
    assert message["createdAt"] == int(START * 1000)
    assert message["messageId"].startswith("msg_")


async def test_dlq_listing_round_trips_into_a_seed(client: httpx.AsyncClient) -> None:
    """GET /_emulator/dlq lists entries in the form POST /_emulator/dlq takes."""
    await seed(client, workflow("wfr_1", workflowCreatedAt=5, failureFunctionState="CALLBACK_FAIL"))
    [listed] = (await client.get("/_emulator/dlq")).json()
    assert (listed["workflowRunId"], listed["workflowCreatedAt"]) == ("wfr_1", 5)
    assert listed["failureFunctionState"] == "CALLBACK_FAIL"
    await client.post("/_emulator/reset")
    await seed(client, listed)
    assert (await client.get("/_emulator/dlq")).json() == [listed]


async def test_seeding_a_dlq_id_twice_is_400(client: httpx.AsyncClient) -> None:
    """dlqIds are unique in the DLQ; a failed seed adds nothing."""
    await seed(client, {"url": "https://a", "dlqId": "1-0"})
    response = await client.post(
        "/_emulator/dlq",
        json={
            "messages": [{"url": "https://b", "dlqId": "2-0"}, {"url": "https://c", "dlqId": "1-0"}]
        },
    )
    assert response.status_code == 400
    assert len((await client.get("/_emulator/dlq")).json()) == 1


async def test_seed_with_an_unknown_field_is_400(client: httpx.AsyncClient) -> None:
    """A misspelt field is reported rather than dropped."""
    response = await client.post("/_emulator/dlq", json={"messages": [{"url": "x", "lables": []}]})
    assert response.status_code == 400
    assert "lables" in response.json()["error"]


async def test_reset_clears_state_and_restores_the_credentials(
    anonymous: httpx.AsyncClient, emulator: Emulator
) -> None:
    """After a reset the DLQ, journal and runs are empty and the config's token works again."""
    await seed(anonymous, workflow("wfr_1"))
    await anonymous.post("/service/user/rotatetoken", headers=basic(USERNAME, PASSWORD))
    assert (await anonymous.post("/_emulator/reset")).status_code == 200
    assert (await anonymous.get("/_emulator/dlq")).json() == []
    assert (await anonymous.get("/_emulator/journal")).json() == []
    assert emulator.account.token == TOKEN
    response = await anonymous.get("/v2/dlq/1-0", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 404


async def test_url_groups_are_seeded_and_listed(client: httpx.AsyncClient) -> None:
    """POST /_emulator/url-groups creates a group GET lists."""
    group = {"name": "g", "endpoints": [{"url": "https://a.example.com"}]}
    assert (await client.post("/_emulator/url-groups", json=group)).status_code == 200
    [listed] = (await client.get("/_emulator/url-groups")).json()
    assert (listed["name"], listed["endpoints"]) == ("g", group["endpoints"])


async def test_idle_answers_at_once_when_nothing_runs(client: httpx.AsyncClient) -> None:
    """POST /_emulator/idle with nothing in flight."""
    response = await client.post("/_emulator/idle")
    assert response.json() == {"idle": True}


async def test_account_settings_show_no_credential(client: httpx.AsyncClient) -> None:
    """GET /_emulator/account never serves the token or password."""
    text = (await client.get("/_emulator/account")).text
    assert TOKEN not in text
    assert PASSWORD not in text
