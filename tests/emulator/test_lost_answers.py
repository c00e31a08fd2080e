"""The `lost_answer` fault (the service acts, its answer never arrives) and the switch that
refuses a bulk call naming dlqIds not in the DLQ, as a stricter service does."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.emulator.support import seed, workflow

RESUME = "/v2/workflows/dlq/resume"


async def lose(client: httpx.AsyncClient, **spec: Any) -> None:
    fault = {"kind": "lost_answer", "paths": [RESUME], **spec}
    response = await client.post("/_emulator/faults", json=fault)
    assert response.status_code == 200, response.text


async def journal(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = (await client.get("/_emulator/journal")).json()
    return calls


async def test_a_lost_answer_is_a_504_after_the_service_acted(client: httpx.AsyncClient) -> None:
    """The resume happened (run made, entry gone); the client reads a 504, and the journal
    says the call was carried out."""
    [dlq_id] = await seed(client, workflow("wfr_1"))
    await lose(client, status=504)
    response = await client.post(RESUME, params={"dlqIds": dlq_id})
    assert response.status_code == 504
    assert set(response.json()) == {"error"}
    assert (await client.get("/_emulator/dlq")).json() == []
    [run] = (await client.get("/_emulator/runs")).json()
    assert run["sourceDlqId"] == dlq_id
    [call] = await journal(client)
    assert (call["status"], call["fault"], call["carriedOut"]) == (504, "lost_answer", True)


async def test_a_lost_answer_resets_a_real_connection(served: httpx.AsyncClient) -> None:
    """With `reset` the connection closes without an answer, after the service acted."""
    [dlq_id] = await seed(served, workflow("wfr_1"))
    await lose(served, reset=True)
    with pytest.raises(httpx.RemoteProtocolError):
        await served.post(RESUME, params={"dlqIds": dlq_id})
    assert (await served.get("/_emulator/dlq")).json() == []
    assert len((await served.get("/_emulator/runs")).json()) == 1
    [call] = await journal(served)
    assert (call["status"], call["carriedOut"]) == (0, True)


async def test_a_lost_answer_resets_in_process(client: httpx.AsyncClient) -> None:
    """Through ASGITransport the reset is the same protocol error."""
    await seed(client, workflow("wfr_1"))
    await lose(client, reset=True)
    with pytest.raises(httpx.RemoteProtocolError):
        await client.post(RESUME)
    assert len((await client.get("/_emulator/runs")).json()) == 1


async def test_gone_dlq_ids_are_skipped_by_default(client: httpx.AsyncClient) -> None:
    """Off (the default): the dlqIds still there are recovered, the others passed over."""
    [dlq_id] = await seed(client, workflow("wfr_1"))
    assert (await client.get("/_emulator/behaviour")).json() == {"refuseGoneDlqIds": False}
    response = await client.post(RESUME, params=[("dlqIds", dlq_id), ("dlqIds", "1-404")])
    assert response.status_code == 200
    assert len(response.json()["workflowRuns"]) == 1


async def test_the_switch_refuses_a_call_naming_a_gone_dlq_id(client: httpx.AsyncClient) -> None:
    """On: a 400 naming the missing dlqId, and nothing recovered, not even the one there."""
    [dlq_id] = await seed(client, workflow("wfr_1"))
    switched = await client.post("/_emulator/behaviour", json={"refuseGoneDlqIds": True})
    assert switched.json() == {"refuseGoneDlqIds": True}
    response = await client.post(RESUME, params=[("dlqIds", dlq_id), ("dlqIds", "1-404")])
    assert response.status_code == 400
    assert "1-404" in response.json()["error"]
    assert [m["dlqId"] for m in (await client.get("/_emulator/dlq")).json()] == [dlq_id]
    assert (await client.get("/_emulator/runs")).json() == []
    assert (await client.post(RESUME, params={"dlqIds": dlq_id})).status_code == 200


async def test_reset_turns_the_switch_off_again(client: httpx.AsyncClient) -> None:
    await client.post("/_emulator/behaviour", json={"refuseGoneDlqIds": True})
    await client.post("/_emulator/reset")
    assert (await client.get("/_emulator/behaviour")).json() == {"refuseGoneDlqIds": False}
