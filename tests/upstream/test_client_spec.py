"""Every rule of the service spec, checked by running the client against the emulator.

Each test runs twice: in-process through httpx.ASGITransport and over a real socket.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from daemon.emulator import create_app
from daemon.upstream import (
    MAX_BULK,
    BulkFilter,
    Credentials,
    CredentialsHolder,
    EndpointRef,
    FlowControl,
    NotFound,
    Overrides,
    ServiceClient,
    Unauthorized,
)
from tests.support import PASSWORD, TOKEN, USERNAME, Service, emulator_config, workflows


async def test_get_returns_the_dead_lettered_message(service: Service) -> None:
    """GET /v2/dlq/{dlqId} answers the message with the fields the service always sends."""
    [dlq_id] = await service.seed({"url": "https://a.example.com/x", "responseStatus": 503})
    message = await service.client.get_dlq_message(dlq_id)
    assert message.dlq_id == dlq_id
    assert message.url == "https://a.example.com/x"
    assert message.response_status == 503
    assert message.method is not None
    assert message.max_retries is not None
    assert message.not_before is not None


async def test_unknown_dlq_id_is_not_found(service: Service) -> None:
    """A dlqId that was never in the DLQ is a 404, raised as NotFound and not retried."""
    with pytest.raises(NotFound):
        await service.client.get_dlq_message("1700000000000-0")
    assert len(await service.journal()) == 1


async def test_message_is_not_found_after_removal(service: Service) -> None:
    """Once a message leaves the DLQ (here: resumed), reading it is a 404."""
    [dlq_id] = await service.seed(*workflows(1))
    await service.client.get_dlq_message(dlq_id)
    await service.client.bulk("resume", dlq_ids=[dlq_id])
    with pytest.raises(NotFound):
        await service.client.get_dlq_message(dlq_id)


async def test_removing_the_last_endpoint_deletes_the_group(service: Service) -> None:
    """Endpoints go by name or by url; with the last one gone, the group is gone."""
    group = {
        "name": "orders",
        "endpoints": [
            {"name": "fulfilment", "url": "https://f.example.com/hook"},
            {"url": "https://legacy.example.com/hook"},
        ],
    }
    (await service.control.post("/_emulator/url-groups", json=group)).raise_for_status()
    await service.client.remove_endpoints("orders", [EndpointRef(name="fulfilment")])
    remaining = await service.client.get_url_group("orders")
    assert [e.url for e in remaining.endpoints] == ["https://legacy.example.com/hook"]
    await service.client.remove_endpoints(
        "orders", [EndpointRef(url="https://legacy.example.com/hook")]
    )
    with pytest.raises(NotFound):
        await service.client.get_url_group("orders")


async def test_added_endpoint_creates_the_group(service: Service) -> None:
    """QStash's add-endpoints creates a missing group; the read shows name and url."""
    await service.client.add_endpoints("new", [EndpointRef(name="a", url="https://a.example.com")])
    group = await service.client.get_url_group("new")
    assert group.name == "new"
    assert group.endpoints == (EndpointRef(name="a", url="https://a.example.com"),)


async def test_dlq_ids_override_every_other_filter(service: Service) -> None:
    """With dlqIds, a filter that matches nothing is ignored by the service.

    Sent raw: the client refuses to send both, precisely because of this rule.
    """
    ids = await service.seed(*workflows(3, labels=["billing"]))
    async with service.http(headers={"Authorization": f"Bearer {TOKEN}"}) as raw:
        response = await raw.post(
            "/v2/workflows/dlq/resume",
            params=[("dlqIds", ids[1]), ("label", "no-such-label"), ("callerIp", "10.9.9.9")],
        )
    assert response.status_code == 200
    assert [r["workflowRunId"] for r in response.json()["workflowRuns"]] != []
    assert len(response.json()["workflowRuns"]) == 1
    with pytest.raises(NotFound):
        await service.client.get_dlq_message(ids[1])
    assert (await service.client.get_dlq_message(ids[0])).dlq_id == ids[0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"dlq_ids": ["1-0"], "filter": BulkFilter(label=("a",))}, "exclude each other"),
        ({"dlq_ids": [f"{i}-0" for i in range(MAX_BULK + 1)]}, "at most 50 dlqIds"),
        ({"filter": BulkFilter(), "count": 0}, "count must be at least 1"),
    ],
    ids=["dlqIds with a filter", "over 50 dlqIds", "count of 0"],
)
async def test_bulk_calls_the_service_would_misread_are_refused(
    service: Service, call: dict[str, Any], message: str
) -> None:
    """Arguments the service would ignore or cap are refused before any call."""
    with pytest.raises(ValueError, match=message):
        await service.client.bulk("resume", **call)
    assert await service.journal() == []


async def test_label_filters_are_ored(service: Service) -> None:
    """A run matches when it has any one of the labels asked for."""
    await service.seed(
        {**workflows(1)[0], "workflowRunId": "wfr_a", "labels": ["a"]},
        {**workflows(1)[0], "workflowRunId": "wfr_b", "labels": ["b", "x"]},
        {**workflows(1)[0], "workflowRunId": "wfr_c", "labels": ["c"]},
    )
    await service.client.bulk("restart", filter=BulkFilter(label=("a", "b")))
    runs = (await service.control.get("/_emulator/runs")).json()
    assert sorted(run["previousWorkflowRunId"] for run in runs) == ["wfr_a", "wfr_b"]


async def test_arrays_go_on_the_wire_as_repeated_parameters(service: Service) -> None:
    """dlqIds and label are sent as dlqIds=a&dlqIds=b, never comma-joined."""
    ids = await service.seed(*workflows(2))
    await service.client.bulk("resume", dlq_ids=ids)
    await service.client.bulk("resume", filter=BulkFilter(label=("a", "b")), count=5)
    first, second = [call["query"] for call in await service.journal()]
    assert first == [["dlqIds", ids[0]], ["dlqIds", ids[1]]]
    assert second == [["label", "a"], ["label", "b"], ["count", "5"]]


async def test_the_service_caps_a_call_at_fifty(service: Service) -> None:
    """Without count, one call processes 50 runs and hands back a cursor."""
    await service.seed(*workflows(60))
    result = await service.client.bulk("restart", filter=BulkFilter())
    assert len(result.workflow_runs) == MAX_BULK
    assert not result.done


async def test_other_filters_are_anded(service: Service) -> None:
    """Every filter other than label must hold at once."""
    await service.seed(
        *workflows(1, callerIP="1.1.1.1", url="https://x.example.com/wf"),
        *workflows(1, callerIP="1.1.1.1", url="https://y.example.com/wf"),
        *workflows(1, callerIP="2.2.2.2", url="https://x.example.com/wf"),
    )
    only = BulkFilter(caller_ip="1.1.1.1", workflow_url="https://x.example.com/wf")
    result = await service.client.bulk("resume", filter=only)
    assert len(result.workflow_runs) == 1


async def test_date_filters_are_inclusive(service: Service) -> None:
    """fromDate and toDate include their own millisecond."""
    await service.seed(
        *workflows(1, createdAt=1000), *workflows(1, createdAt=2000), *workflows(1, createdAt=3000)
    )
    result = await service.client.bulk("resume", filter=BulkFilter(from_date=1000, to_date=2000))
    assert len(result.workflow_runs) == 2


async def test_count_bounds_one_call(service: Service) -> None:
    """count caps the runs processed by a call; the cursor says more remain."""
    await service.seed(*workflows(10))
    result = await service.client.bulk("resume", filter=BulkFilter(), count=3)
    assert len(result.workflow_runs) == 3
    assert not result.done


async def test_fifty_per_call_and_the_cursor_to_the_end(service: Service) -> None:
    """At most 50 runs a call; following the cursor reaches all, ending with cursor ""."""
    await service.seed(*workflows(120))
    pages = [page async for page in service.client.bulk_pages("restart", filter=BulkFilter())]
    assert [len(p.workflow_runs) for p in pages] == [MAX_BULK, MAX_BULK, 20]
    assert [p.cursor == "" for p in pages] == [False, False, True]
    run_ids = {r.workflow_run_id for p in pages for r in p.workflow_runs}
    assert len(run_ids) == 120
    calls = [c for c in await service.journal() if c["path"] == "/v2/workflows/dlq/restart"]
    assert len(calls) == 3


async def test_pager_stops_at_its_limit(service: Service) -> None:
    """A sweep with maxPerRun processes no more than that, asking the service with count."""
    await service.seed(*workflows(80))
    pages = [p async for p in service.client.bulk_pages("resume", filter=BulkFilter(), limit=60)]
    assert [len(p.workflow_runs) for p in pages] == [50, 10]


async def test_finished_call_has_an_empty_cursor(service: Service) -> None:
    """When nothing matching remains, the cursor is the empty string."""
    await service.seed(*workflows(2))
    result = await service.client.bulk("resume", filter=BulkFilter())
    assert result.cursor == ""
    assert all(isinstance(r.workflow_created_at, int) for r in result.workflow_runs)


async def test_override_headers_are_recorded_on_the_new_runs(service: Service) -> None:
    """The runs a resume creates carry exactly the override headers the client sent."""
    ids = await service.seed(*workflows(2))
    overrides = Overrides(
        retries=5,
        delay="30s",
        retry_delay="pow(2, retried) * 1000",
        flow_control=FlowControl(key="billing", parallelism=5, rate=10, period="1m"),
        labels=("auto-resumed", "billing"),
        failure_callback="https://hooks.example.com/again",
    )
    result = await service.client.bulk("resume", dlq_ids=ids, overrides=overrides)
    runs = (await service.control.get("/_emulator/runs")).json()
    assert {r["workflowRunId"] for r in runs} == {r.workflow_run_id for r in result.workflow_runs}
    for run in runs:
        assert run["mode"] == "resume"
        recorded = {k.lower(): v for k, v in run["rawHeaders"].items()}
        assert recorded == {k.lower(): v for k, v in overrides.headers("Service").items()}


async def test_upstash_prefix_end_to_end() -> None:
    """Against a service speaking QStash's prefix, overrides travel as Upstash-* headers
    and are applied to the new runs."""
    app = create_app(emulator_config(header_prefix="Upstash", execute_runs=False))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(base_url="http://qstash.test", transport=transport) as http:
        client = ServiceClient(
            http,
            base_url="http://qstash.test",
            credentials=CredentialsHolder(Credentials(TOKEN)),
            header_prefix="Upstash",
        )
        seeded = await http.post("/_emulator/dlq", json={"messages": workflows(1)})
        [dlq_id] = seeded.json()["dlqIds"]
        message = await client.get_dlq_message(dlq_id)
        assert message.header_values("Upstash-Workflow-RunId") == ("wfr_0",)
        await client.bulk("resume", dlq_ids=[dlq_id], overrides=Overrides(retries=1))
        [run] = (await http.get("/_emulator/runs")).json()
    assert run["overrides"]["retries"] == 1


async def test_reset_returns_new_credentials_and_refuses_the_old(service: Service) -> None:
    """After the reset the old token and the old password are refused with 401."""
    record = await service.client.rotate_token()
    assert record.token is not None
    assert record.password is not None
    new_token = record.token.get_secret_value()
    new_password = record.password.get_secret_value()
    assert new_token != TOKEN
    assert new_password != PASSWORD
    with pytest.raises(Unauthorized):
        await service.client.get_dlq_message("1-0")  # still holding the old token
    with pytest.raises(Unauthorized):
        await service.client.rotate_token()  # still holding the old password
    service.credentials.replace(Credentials(new_token, USERNAME, new_password))
    with pytest.raises(NotFound):
        await service.client.get_dlq_message("1-0")  # authorised now: the id is just unknown


async def test_wrong_basic_credentials_are_unauthorized(service: Service) -> None:
    """A token reset with a wrong password is a 401, and is not retried."""
    service.credentials.replace(Credentials(TOKEN, USERNAME, "wrong"))
    with pytest.raises(Unauthorized):
        await service.client.rotate_token()
    assert [c["status"] for c in await service.journal()] == [401]


async def test_wrong_bearer_token_is_unauthorized(service: Service) -> None:
    """A bad token is a 401 on message operations, and is not retried."""
    service.credentials.replace(Credentials("not-the-token"))
    with pytest.raises(Unauthorized):
        await service.client.get_dlq_message("1-0")
    assert [c["status"] for c in await service.journal()] == [401]


async def test_journal_never_holds_a_secret(service: Service) -> None:
    """Neither token nor password reaches the emulator's journal."""
    await service.client.rotate_token()
    journal = str(await service.journal())
    assert TOKEN not in journal
    assert PASSWORD not in journal
