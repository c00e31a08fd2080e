"""Listing the failed workflow runs (QStash's GET /v2/workflows/dlq): the bulk calls'
filters, pages of at most 100 with a cursor, and nothing changed."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.emulator.support import seed, workflow

LIST = "/v2/workflows/dlq"
RESTART = "/v2/workflows/dlq/restart"


def listed(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [message["workflowRunId"] for message in response.json()["messages"]]


async def test_selects_what_a_bulk_call_with_the_same_filters_would(
    client: httpx.AsyncClient,
) -> None:
    """Labels OR-ed, other filters AND-ed, dates inclusive, workflow entries only: the
    listing and then a restart with the same filters name the same runs."""
    await seed(
        client,
        workflow("wfr_a", labels=["a"], createdAt=1000, callerIP="1.1.1.1"),
        workflow("wfr_b", labels=["b"], createdAt=2000, callerIP="1.1.1.1"),
        workflow("wfr_c", labels=["c"], createdAt=1500, callerIP="1.1.1.1"),
        workflow("wfr_early", labels=["a"], createdAt=999, callerIP="1.1.1.1"),
        workflow("wfr_late", labels=["b"], createdAt=2001, callerIP="1.1.1.1"),
        workflow("wfr_ip", labels=["a"], createdAt=1500, callerIP="2.2.2.2"),
        {"url": "https://app.example.com/plain", "labels": ["a"], "createdAt": 1500},
    )
    params: list[tuple[str, Any]] = [
        ("label", "a"), ("label", "b"), ("fromDate", 1000), ("toDate", 2000),
        ("callerIp", "1.1.1.1"),
    ]  # fmt: skip
    assert listed(await client.get(LIST, params=params)) == ["wfr_a", "wfr_b"]
    restarted = (await client.post(RESTART, params=params)).json()["workflowRuns"]
    runs = (await client.get("/_emulator/runs")).json()
    assert len(restarted) == 2
    assert sorted(run["previousWorkflowRunId"] for run in runs) == ["wfr_a", "wfr_b"]


async def test_pages_of_one_hundred_then_no_cursor(client: httpx.AsyncClient) -> None:
    """230 runs list as 100, 100 and 30; the last page carries no cursor."""
    await seed(client, *(workflow(f"wfr_{i}") for i in range(230)))
    sizes, seen, cursor = [], [], None
    while True:
        response = await client.get(LIST, params={"cursor": cursor} if cursor else {})
        seen += listed(response)
        sizes.append(len(response.json()["messages"]))
        cursor = response.json().get("cursor")
        if not cursor:
            break
    assert sizes == [100, 100, 30]
    assert seen == [f"wfr_{i}" for i in range(230)]


async def test_count_bounds_a_page(client: httpx.AsyncClient) -> None:
    """count=3 lists three and leaves a cursor for the rest."""
    await seed(client, *(workflow(f"wfr_{i}") for i in range(5)))
    response = await client.get(LIST, params={"count": 3})
    assert listed(response) == ["wfr_0", "wfr_1", "wfr_2"]
    rest = await client.get(LIST, params={"cursor": response.json()["cursor"]})
    assert listed(rest) == ["wfr_3", "wfr_4"]
    assert "cursor" not in rest.json()


async def test_messages_carry_the_workflow_fields(client: httpx.AsyncClient) -> None:
    """Each message is the DLQ message plus the run's id, url, creation time and the
    failure function's state."""
    [dlq_id] = await seed(
        client,
        workflow(
            "wfr_1",
            workflowUrl="https://app.example.com/wf/start",
            workflowCreatedAt=1234,
            failureFunctionState="CALLBACK_FAIL",
        ),
    )
    [message] = (await client.get(LIST)).json()["messages"]
    assert message["dlqId"] == dlq_id
    assert (message["workflowRunId"], message["workflowUrl"], message["workflowCreatedAt"]) == (
        "wfr_1",
        "https://app.example.com/wf/start",
        1234,
    )
    assert message["failureFunctionState"] == "CALLBACK_FAIL"
    assert message["url"] == "https://app.example.com/wf"


async def test_listing_changes_nothing(client: httpx.AsyncClient) -> None:
    """The entries listed stay in the DLQ and no run is made."""
    await seed(client, workflow("wfr_1"), workflow("wfr_2"))
    assert listed(await client.get(LIST)) == ["wfr_1", "wfr_2"]
    assert len((await client.get("/_emulator/dlq")).json()) == 2
    assert (await client.get("/_emulator/runs")).json() == []


@pytest.mark.parametrize(
    "params",
    [{"count": "101"}, {"count": "0"}, {"dlqIds": "1-2"}, {"labels": "x"}, {"cursor": "nope"}],
)
async def test_bad_parameters_are_400(client: httpx.AsyncClient, params: dict[str, str]) -> None:
    """count above 100, dlqIds (not a filter of the listing), a misspelt filter or a bad
    cursor is a 400 with an error body."""
    response = await client.get(LIST, params=params)
    assert response.status_code == 400
    assert set(response.json()) == {"error"}


async def test_needs_the_token(anonymous: httpx.AsyncClient) -> None:
    """Like every message operation, the listing takes the bearer token."""
    assert (await anonymous.get(LIST)).status_code == 401
