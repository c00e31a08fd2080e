"""QStash's DLQ routes beyond the spec's read of one message, as the SDKs call them:
`GET /v2/dlq`, `DELETE /v2/dlq/{dlqId}`, `DELETE /v2/dlq`, and the resume and restart
of one workflow run; and the fields a DLQ message carries beside its headers."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.emulator.support import seed, workflow

# Query parameters in order, repeats included (httpx's own alias is not exported).
Params = list[tuple[str, str | int | float | bool | None]]
WF_A, WF_X = "https://a.example.com/wf", "https://b.example.com/wf/x"
PLAIN = {"url": "https://a.example.com/hook", "callerIP": "10.0.0.1", "responseStatus": 500}


async def dlq_ids(client: httpx.AsyncClient) -> list[str]:
    return [m["dlqId"] for m in (await client.get("/_emulator/dlq")).json()]


def listed(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [m["dlqId"] for m in response.json()["messages"]]


async def test_a_message_carries_its_first_label_and_its_runs_fields(
    client: httpx.AsyncClient,
) -> None:
    """`label` (what the SDKs read) is the first of `labels`; a workflow run's message has
    `workflowRunId`, `workflowUrl` and `workflowCreatedAt` beside its headers."""
    [dlq_id] = await seed(
        client,
        workflow(
            "wfr_1", labels=["billing", "eu"], workflowUrl="https://app.example.com/wf/pay",
            workflowCreatedAt=1_700_000_000_000,
        ),
    )  # fmt: skip
    message = (await client.get(f"/v2/dlq/{dlq_id}")).json()
    assert message["labels"] == ["billing", "eu"]
    assert message["label"] == "billing"
    assert message["workflowRunId"] == "wfr_1"
    assert message["workflowUrl"] == "https://app.example.com/wf/pay"
    assert message["workflowCreatedAt"] == 1_700_000_000_000


async def test_a_plain_message_has_no_workflow_fields_and_no_label(
    client: httpx.AsyncClient,
) -> None:
    [dlq_id] = await seed(client, PLAIN)
    message = (await client.get(f"/v2/dlq/{dlq_id}")).json()
    assert not {"label", "workflowRunId", "workflowUrl", "workflowCreatedAt"} & set(message)


async def test_the_dlq_lists_every_message_and_workflow_runs_with_source(
    client: httpx.AsyncClient,
) -> None:
    """Plain messages too; `source=workflow` (the workflow SDK's) keeps workflow runs."""
    ids = await seed(client, PLAIN, workflow("wfr_1"), PLAIN)
    assert listed(await client.get("/v2/dlq")) == ids
    assert listed(await client.get("/v2/dlq", params={"source": "workflow"})) == [ids[1]]
    assert (await client.get("/v2/dlq", params={"source": "qstash"})).status_code == 400


@pytest.mark.parametrize(
    ("params", "picked"),
    [
        ([("url", "https://b.example.com/hook")], [1]),
        ([("url", "https://b.example.com/hook"), ("url", "https://c.example.com/hook")], [1, 2]),
        ([("responseStatus", "404"), ("responseStatus", "502")], [1, 2]),
        ([("responseStatus", "404")], [1]),
        ([("callerIp", "10.0.0.2"), ("callerIp", "10.0.0.3")], [1, 2]),
        ([("topicName", "orders")], [2]),
        ([("callerIp", "10.0.0.1"), ("url", "https://b.example.com/hook")], []),
        ([("dlqIds", "ID2"), ("url", "https://no.example.com")], [2]),
    ],
)
async def test_the_dlq_listing_filters_or_within_a_filter_and_across_them(
    client: httpx.AsyncClient, params: Params, picked: list[int]
) -> None:
    ids = await seed(
        client,
        PLAIN,
        {
            **PLAIN,
            "url": "https://b.example.com/hook",
            "callerIP": "10.0.0.2",
            "responseStatus": 404,
        },
        {
            **PLAIN, "url": "https://c.example.com/hook", "topicName": "orders",
            "callerIP": "10.0.0.3", "responseStatus": 502, "dlqId": "ID2",
        },
    )  # fmt: skip
    assert listed(await client.get("/v2/dlq", params=params)) == [ids[i] for i in picked]


async def test_the_dlq_listing_pages_with_count_and_cursor(client: httpx.AsyncClient) -> None:
    ids = await seed(client, *[PLAIN] * 5)
    first = await client.get("/v2/dlq", params={"count": 2})
    second = await client.get("/v2/dlq", params={"count": 2, "cursor": first.json()["cursor"]})
    last = await client.get("/v2/dlq", params={"count": 2, "cursor": second.json()["cursor"]})
    assert listed(first) + listed(second) + listed(last) == ids
    assert "cursor" not in last.json()
    assert await dlq_ids(client) == ids  # a listing changes nothing
    assert (await client.get("/v2/dlq", params={"count": 101})).status_code == 400


async def test_deleting_a_message_takes_it_out_once(client: httpx.AsyncClient) -> None:
    [dlq_id, kept] = await seed(client, PLAIN, PLAIN)
    response = await client.delete(f"/v2/dlq/{dlq_id}")
    assert response.status_code == 200
    assert response.content == b""
    assert (await client.get(f"/v2/dlq/{dlq_id}")).status_code == 404
    again = await client.delete(f"/v2/dlq/{dlq_id}")
    assert again.status_code == 404
    assert set(again.json()) == {"error"}
    assert await dlq_ids(client) == [kept]


async def test_bulk_delete_by_ids_in_the_body_counts_what_it_deleted(
    client: httpx.AsyncClient,
) -> None:
    """The Python SDK's `delete_many`: ids not in the DLQ are skipped, not counted."""
    ids = await seed(client, PLAIN, PLAIN, PLAIN)
    response = await client.request("DELETE", "/v2/dlq", json={"dlqIds": [ids[0], ids[2], "9-9"]})
    assert response.json() == {"deleted": 2}
    assert await dlq_ids(client) == [ids[1]]
    empty = await client.request("DELETE", "/v2/dlq", json={"dlqIds": []})
    assert empty.json() == {"deleted": 0}
    assert await dlq_ids(client) == [ids[1]]


async def test_bulk_delete_takes_every_id_it_names_past_a_page(
    client: httpx.AsyncClient,
) -> None:
    ids = await seed(client, *[PLAIN] * 130)
    response = await client.request("DELETE", "/v2/dlq", json={"dlqIds": ids[:120]})
    assert response.json() == {"deleted": 120}
    assert await dlq_ids(client) == ids[120:]


async def test_bulk_delete_by_filter_pages_with_a_cursor(client: httpx.AsyncClient) -> None:
    """The JavaScript SDK's: filters as parameters, `count` a page, a cursor for the rest."""
    ids = await seed(client, *[PLAIN] * 3, workflow("wfr_1"))
    params: dict[str, str | int] = {"callerIp": "10.0.0.1", "count": 2}
    first = await client.delete("/v2/dlq", params=params)
    assert first.json()["deleted"] == 2
    rest = await client.delete("/v2/dlq", params={**params, "cursor": first.json()["cursor"]})
    assert rest.json() == {"deleted": 1}
    assert await dlq_ids(client) == [ids[3]]


@pytest.mark.parametrize(
    ("params", "body"),
    [({}, None), ({"source": "nope"}, None), ({}, {"ids": ["1-0"]}), ({}, {"dlqIds": "1-0"})],
)
async def test_a_bulk_delete_that_names_nothing_or_is_malformed_deletes_nothing(
    client: httpx.AsyncClient, params: dict[str, str], body: Any
) -> None:
    """An empty DELETE /v2/dlq is a 400, not an emptied DLQ."""
    ids = await seed(client, PLAIN, PLAIN)
    response = await client.request("DELETE", "/v2/dlq", params=params, json=body)
    assert response.status_code == 400
    assert set(response.json()) == {"error"}
    assert await dlq_ids(client) == ids


@pytest.mark.parametrize("mode", ["resume", "restart"])
async def test_one_workflow_run_is_resumed_or_restarted_by_its_dlq_id(
    client: httpx.AsyncClient, mode: str
) -> None:
    ids = await seed(client, workflow("wfr_0"), workflow("wfr_1"))
    response = await client.post(
        f"/v2/workflows/dlq/{mode}/{ids[1]}", headers={"Service-Retries": "7"}
    )
    assert response.status_code == 200, response.text
    reference = response.json()
    assert set(reference) == {"workflowRunId", "workflowCreatedAt"}
    [run] = (await client.get("/_emulator/runs")).json()
    assert run["workflowRunId"] == reference["workflowRunId"]
    assert (run["mode"], run["sourceDlqId"], run["retries"]) == (mode, ids[1], 7)
    assert await dlq_ids(client) == [ids[0]]
    assert (await client.post(f"/v2/workflows/dlq/{mode}/{ids[1]}")).status_code == 404


async def test_a_plain_message_cannot_be_resumed_by_its_dlq_id(client: httpx.AsyncClient) -> None:
    [dlq_id] = await seed(client, PLAIN)
    response = await client.post(f"/v2/workflows/dlq/resume/{dlq_id}")
    assert response.status_code == 400
    assert "not a workflow run" in response.json()["error"]
    assert await dlq_ids(client) == [dlq_id]


@pytest.mark.parametrize(
    ("params", "picked"),
    [
        ([("workflowUrl", WF_A)], [0]),
        ([("workflowUrl", WF_A), ("workflowUrl", WF_X)], [0, 2]),
        ([("workflowUrl", WF_A), ("workflowUrlExactMatch", "true")], [0]),
        ([("workflowUrl", WF_A), ("workflowUrlExactMatch", "false")], [0, 1]),
        ([("callerIp", "10.0.0.1"), ("callerIp", "10.0.0.3")], [0, 2]),
        ([("flowControlKey", "k1"), ("flowControlKey", "k2")], [0, 1]),
        ([("flowControlKey", "k1"), ("callerIp", "10.0.0.2")], []),
    ],
)  # fmt: skip
async def test_a_bulk_filter_given_several_times_matches_any_of_its_values(
    client: httpx.AsyncClient, params: Params, picked: list[int]
) -> None:
    ids = await seed(
        client,
        workflow("wfr_0", workflowUrl=WF_A, callerIP="10.0.0.1", flowControlKey="k1"),
        workflow("wfr_1", workflowUrl=f"{WF_A}/v2", callerIP="10.0.0.2", flowControlKey="k2"),
        workflow("wfr_2", workflowUrl=WF_X, callerIP="10.0.0.3"),
    )
    response = await client.post("/v2/workflows/dlq/resume", params=params)
    assert response.status_code == 200, response.text
    runs = (await client.get("/_emulator/runs")).json()
    assert sorted(run["sourceDlqId"] for run in runs) == sorted(ids[i] for i in picked)


@pytest.mark.parametrize(
    "params",
    [
        [("workflowUrlExactMatch", "yes")],
        [("workflowRunId", "a"), ("workflowRunId", "b")],
        [("count", "1"), ("count", "2")],
        [("url", "https://a.example.com/hook")],  # a DLQ listing filter, not a bulk one
    ],
)
async def test_a_bulk_call_refuses_what_it_cannot_read(
    client: httpx.AsyncClient, params: Params
) -> None:
    await seed(client, workflow("wfr_0"))
    response = await client.post("/v2/workflows/dlq/resume", params=params)
    assert response.status_code == 400
    assert (await client.get("/_emulator/runs")).json() == []
