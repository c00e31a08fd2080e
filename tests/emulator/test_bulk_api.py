"""Bulk resume and restart over HTTP (spec 4.4-4.7): selection, paging, overrides, runs."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.emulator.support import START, Sink, idle, seed, workflow

RESUME = "/v2/workflows/dlq/resume"
RESTART = "/v2/workflows/dlq/restart"


def runs_of(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    runs: list[dict[str, Any]] = response.json()["workflowRuns"]
    return runs


async def remaining(client: httpx.AsyncClient) -> list[str]:
    return [m["workflowRunId"] for m in (await client.get("/_emulator/dlq")).json()]


async def test_resume_answers_new_runs_and_an_empty_cursor(client: httpx.AsyncClient) -> None:
    """Each resumed run gets a new id and an integer creation time; "" ends the walk."""
    await seed(client, workflow("wfr_a"), workflow("wfr_b"))
    response = await client.post(RESUME)
    runs = runs_of(response)
    assert response.json()["cursor"] == ""
    assert len(runs) == 2
    assert not {r["workflowRunId"] for r in runs} & {"wfr_a", "wfr_b"}
    assert all(r["workflowCreatedAt"] == int(START * 1000) for r in runs)


async def test_dlq_ids_override_every_other_filter(client: httpx.AsyncClient) -> None:
    """dlqIds selects its entries even with filters that match nothing."""
    ids = await seed(client, workflow("wfr_0"), workflow("wfr_1"))
    params = [("dlqIds", ids[1]), ("label", "no-such-label"), ("callerIp", "10.9.9.9")]
    runs = runs_of(await client.post(RESTART, params=params))
    assert len(runs) == 1
    assert await remaining(client) == ["wfr_0"]


async def test_dlq_ids_come_comma_separated_too(client: httpx.AsyncClient) -> None:
    """dlqIds=a,b is dlqIds=a&dlqIds=b."""
    ids = await seed(client, workflow("wfr_0"), workflow("wfr_1"), workflow("wfr_2"))
    runs = runs_of(await client.post(RESUME, params={"dlqIds": f"{ids[0]},{ids[2]}"}))
    assert len(runs) == 2
    assert await remaining(client) == ["wfr_1"]


async def test_unknown_dlq_ids_are_skipped(client: httpx.AsyncClient) -> None:
    """An id that is not in the DLQ is no error; it just selects nothing."""
    assert runs_of(await client.post(RESUME, params={"dlqIds": "1-404"})) == []


async def test_label_filters_are_ored(client: httpx.AsyncClient) -> None:
    """label=a&label=b selects runs with a or with b."""
    await seed(
        client,
        workflow("wfr_a", labels=["a"]),
        workflow("wfr_b", labels=["b"]),
        workflow("wfr_c", labels=["c"]),
    )
    runs = runs_of(await client.post(RESTART, params=[("label", "a"), ("label", "b")]))
    assert len(runs) == 2
    assert await remaining(client) == ["wfr_c"]


async def test_other_filters_are_anded(client: httpx.AsyncClient) -> None:
    """callerIp and workflowUrl must both hold."""
    await seed(
        client,
        workflow("wfr_xy", callerIP="1.1.1.1", url="https://x.example.com/wf"),
        workflow("wfr_x", callerIP="1.1.1.1", url="https://y.example.com/wf"),
        workflow("wfr_y", callerIP="2.2.2.2", url="https://x.example.com/wf"),
    )
    params = {"callerIp": "1.1.1.1", "workflowUrl": "https://x.example.com/wf"}
    assert len(runs_of(await client.post(RESUME, params=params))) == 1
    assert await remaining(client) == ["wfr_x", "wfr_y"]


async def test_date_filters_are_inclusive(client: httpx.AsyncClient) -> None:
    """fromDate and toDate include their own millisecond."""
    await seed(
        client,
        workflow("wfr_999", createdAt=999),
        workflow("wfr_1000", createdAt=1000),
        workflow("wfr_2000", createdAt=2000),
        workflow("wfr_2001", createdAt=2001),
    )
    runs = runs_of(await client.post(RESUME, params={"fromDate": 1000, "toDate": 2000}))
    assert len(runs) == 2
    assert await remaining(client) == ["wfr_999", "wfr_2001"]


async def test_plain_messages_are_not_candidates(client: httpx.AsyncClient) -> None:
    """Only entries of workflow runs are resumed."""
    await seed(client, {"url": "https://a.example.com"}, workflow("wfr_1"))
    assert len(runs_of(await client.post(RESUME))) == 1
    assert len((await client.get("/_emulator/dlq")).json()) == 1


async def test_fifty_per_call_then_the_cursor_to_the_end(client: httpx.AsyncClient) -> None:
    """120 runs take three calls of 50, 50 and 20; the last cursor is ""."""
    await seed(client, *(workflow(f"wfr_{i}") for i in range(120)))
    sizes, cursors, cursor = [], [], None
    while cursor != "":
        response = await client.post(RESTART, params={"cursor": cursor} if cursor else {})
        sizes.append(len(runs_of(response)))
        cursor = response.json()["cursor"]
        cursors.append(cursor)
    assert sizes == [50, 50, 20]
    assert [c == "" for c in cursors] == [False, False, True]


async def test_count_bounds_one_call(client: httpx.AsyncClient) -> None:
    """count=3 processes three and leaves a cursor for the rest."""
    await seed(client, *(workflow(f"wfr_{i}") for i in range(10)))
    response = await client.post(RESUME, params={"count": 3})
    assert len(runs_of(response)) == 3
    assert response.json()["cursor"] != ""


@pytest.mark.parametrize(
    "params",
    [
        {"count": "0"},
        {"count": "x"},
        {"fromDate": "yesterday"},
        {"workflowCreatedAt": "1.5"},
        {"failureFunctionState": "CALLBACK_MAYBE"},
        {"cursor": "not-a-cursor"},
        {"labels": "misspelt"},
    ],
)
async def test_malformed_query_is_400(client: httpx.AsyncClient, params: dict[str, str]) -> None:
    """A malformed parameter is a 400 with an error body, and nothing is processed."""
    await seed(client, workflow("wfr_1"))
    response = await client.post(RESUME, params=params)
    assert response.status_code == 400
    assert set(response.json()) == {"error"}
    assert await remaining(client) == ["wfr_1"]


async def test_failure_function_state_filters(client: httpx.AsyncClient) -> None:
    """failureFunctionState selects runs whose failure function ended that way."""
    await seed(
        client,
        workflow("wfr_fail", failureFunctionState="CALLBACK_FAIL"),
        workflow("wfr_ok", failureFunctionState="CALLBACK_SUCCESS"),
    )
    runs_of(await client.post(RESUME, params={"failureFunctionState": "CALLBACK_FAIL"}))
    assert await remaining(client) == ["wfr_ok"]


async def test_overrides_are_recorded_on_the_runs(client: httpx.AsyncClient) -> None:
    """Each run records the override headers as received and as parsed."""
    await seed(client, workflow("wfr_1"))
    headers = {
        "Service-Retries": "5",
        "Service-Delay": "30s",
        "Service-Retry-Delay": "pow(2, retried) * 1000",
        "Service-Flow-Control-Key": "billing",
        "Service-Flow-Control-Value": "parallelism=5, rate=10, period=1m",
        "Service-Label": "auto-resumed,billing",
        "Service-Failure-Callback": "https://hooks.example.com/again",
    }
    runs_of(await client.post(RESUME, headers=headers))
    [run] = (await client.get("/_emulator/runs")).json()
    assert run["rawHeaders"] == headers
    assert run["overrides"] == {
        "retries": 5,
        "delay": "30s",
        "retryDelay": "pow(2, retried) * 1000",
        "flowControlKey": "billing",
        "flowControlValue": {"parallelism": 5, "rate": 10, "period": "1m"},
        "labels": ["auto-resumed", "billing"],
        "failureCallback": "https://hooks.example.com/again",
    }


async def test_malformed_override_is_400_naming_the_header(client: httpx.AsyncClient) -> None:
    """A bad override header refuses the whole call."""
    await seed(client, workflow("wfr_1"))
    response = await client.post(RESUME, headers={"Service-Delay": "soon"})
    assert response.status_code == 400
    assert "Service-Delay" in response.json()["error"]
    assert await remaining(client) == ["wfr_1"]


async def test_restart_records_mode_source_and_previous_run(client: httpx.AsyncClient) -> None:
    """A run knows how it was made and from which DLQ entry and run."""
    [dlq_id] = await seed(client, workflow("wfr_old"))
    [reference] = runs_of(await client.post(RESTART))
    [run] = (await client.get("/_emulator/runs")).json()
    assert run["workflowRunId"] == reference["workflowRunId"]
    assert (run["mode"], run["sourceDlqId"], run["previousWorkflowRunId"]) == (
        "restart",
        dlq_id,
        "wfr_old",
    )


async def test_resumed_run_is_delivered_with_its_new_id_and_labels(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    """The run goes to its workflow URL carrying the new run id and the override labels."""
    await seed(client, workflow("wfr_old", workflowUrl="https://app.example.com/flow", body="{}"))
    [run] = runs_of(await client.post(RESUME, headers={"Service-Label": "again"}))
    await idle(client)
    [request] = sink.at("/flow")
    assert request.headers["service-workflow-runid"] == run["workflowRunId"]
    assert request.headers["service-label"] == "again"
    assert request.body == b"{}"
    [record] = (await client.get("/_emulator/runs")).json()
    assert record["status"] == "succeeded"


async def test_retries_override_sets_the_attempts(client: httpx.AsyncClient, sink: Sink) -> None:
    """Service-Retries: 1 gives the re-run two attempts before it fails again."""
    sink.statuses["/wf"] = 500
    await seed(client, workflow("wfr_old", maxRetries=5))
    runs_of(await client.post(RESUME, headers={"Service-Retries": "1"}))
    await idle(client)
    assert len(sink.at("/wf")) == 2
    [run] = (await client.get("/_emulator/runs")).json()
    assert run["status"] == "failed"
    assert run["resultDlqId"] is not None


async def test_a_walk_does_not_pick_up_its_own_failed_runs(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    """Runs failing back into the DLQ during a paged walk are left for the next walk."""
    sink.statuses["/wf"] = 500
    await seed(client, *(workflow(f"wfr_{i}", maxRetries=0) for i in range(3)))
    first = await client.post(RESUME, params={"count": 2})
    await idle(client)  # both runs failed again: two new DLQ entries
    second = await client.post(RESUME, params={"cursor": first.json()["cursor"]})
    assert len(runs_of(second)) == 1
    assert second.json()["cursor"] == ""
    await idle(client)
    assert len(await remaining(client)) == 3  # every run failed once more, none twice
