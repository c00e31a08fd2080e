"""The service's official Python SDK (`qstash`) pointed at the emulator over a real socket:
its DLQ, URL Group and error handling work as against the service, its HTTP layer drives
the workflow resume and restart it has no methods for, and its `Receiver` verifies what
the emulator signs."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from qstash import QStash, Receiver
from qstash.errors import (
    DailyMessageLimitExceededError,
    QStashError,
    RateLimitExceededError,
    SignatureError,
)
from qstash.receiver import verify_with_key

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from tests.emulator.support import Sink
from tests.support import SIGNING_KEY_CURRENT, SIGNING_KEY_NEXT, TOKEN, emulator_config

APP = "https://app.example.com/wf"
OTHER = "https://other.example.com/wf"
WORKFLOW_DLQ = "/v2/workflows/dlq"
MODES = pytest.mark.parametrize("mode", ["resume", "restart"])


@dataclass
class Control:
    """The emulator's control API: seed state, read back what happened."""

    http: httpx.Client

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, f"/_emulator{path}", **kwargs)
        assert response.status_code == 200, response.text
        return response.json()

    def seed(self, *messages: dict[str, Any]) -> list[str]:
        ids: list[str] = self._json("POST", "/dlq", json={"messages": list(messages)})["dlqIds"]
        return ids

    def dlq_ids(self) -> list[str]:
        return [message["dlqId"] for message in self._json("GET", "/dlq")]

    def runs(self) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = self._json("GET", "/runs")
        return runs

    def url_group(self, name: str, *endpoints: dict[str, str]) -> None:
        self._json("POST", "/url-groups", json={"name": name, "endpoints": list(endpoints)})

    def limit(self, **limits: int) -> None:
        self._json("POST", "/account", json=limits)

    def publish(self, **message: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self._json(
            "POST", "/publish", params={"wait": "true", "timeout": 5}, json=message
        )
        return answer


@pytest.fixture(scope="module")
def service_url() -> Iterator[str]:
    """The emulator as a user would run it for the SDK: `Upstash-*` headers. Resumed runs
    are only recorded, so the DLQ afterwards shows exactly what a call took out."""
    config = emulator_config(
        header_prefix="Upstash", execute_runs=False, delivery_retry_delay=0.001
    )
    with serve_in_thread(create_app(config)) as url:
        yield url


@pytest.fixture(scope="module")
def control_http(service_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service_url, timeout=10) as http:
        yield http


@pytest.fixture(scope="module")
def sdk(service_url: str) -> Iterator[QStash]:
    # One client for the module: making one (its TLS context) costs more than most tests.
    client = QStash(TOKEN, base_url=service_url, retry=False)
    yield client
    client.http._client.close()


@pytest.fixture
def control(control_http: httpx.Client) -> Control:
    """The control API, the emulator reset first."""
    control_http.post("/_emulator/reset").raise_for_status()
    return Control(control_http)


@pytest.fixture
def client(sdk: QStash, control: Control) -> QStash:
    """The SDK's client, to an emulator reset first."""
    return sdk


def post(
    client: QStash,
    path: str,
    params: list[tuple[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """POST through the SDK's own HTTP layer; the parsed JSON answer."""
    # The SDK types `params` as a dict, but httpx takes pairs, which can repeat a filter.
    params_arg: Any = params or []
    answer: dict[str, Any] = client.http.request(
        path=path, method="POST", params=params_arg, headers=headers
    )
    return answer


# The DLQ.

MESSAGES = [
    {"messageId": "msg_1", "url": f"{APP}/orders", "topicName": "orders",
     "queueName": "q-orders", "scheduleId": "scd_1", "createdAt": 1_000,
     "responseStatus": 500, "callerIP": "10.0.0.1", "labels": ["billing"],
     "flowControlKey": "fk-1"},
    {"messageId": "msg_2", "url": f"{APP}/invoices", "topicName": "invoices",
     "queueName": "q-invoices", "scheduleId": "scd_2", "createdAt": 2_000,
     "responseStatus": 503, "callerIP": "10.0.0.2", "labels": ["shipping"],
     "flowControlKey": "fk-2"},
    {"messageId": "msg_3", "url": f"{APP}/orders", "createdAt": 3_000, "responseStatus": 404,
     "callerIP": "10.0.0.1", "labels": ["eu", "billing"]},
    {"messageId": "msg_4", "url": OTHER, "workflowRunId": "wfr_4", "createdAt": 4_000,
     "responseStatus": 500, "callerIP": "10.0.0.3", "flowControlKey": "fk-3"},
]  # fmt: skip


def test_dlq_get_parses_the_message(client: QStash, control: Control) -> None:
    """Every field the SDK reads comes through, `label` being the first of the labels."""
    [dlq_id] = control.seed(
        {"url": f"{APP}/orders", "topicName": "orders", "endpointName": "primary",
         "queueName": "q-orders", "body": '{"order": 42}', "maxRetries": 5,
         "header": {"Content-Type": "application/json"}, "createdAt": 1_700_000_000_000,
         "callerIP": "10.0.0.1", "failureCallback": "https://app.example.com/failed",
         "responseStatus": 503, "responseBody": "down", "responseHeader": {"Retry-After": "30"},
         "labels": ["billing", "eu"], "flowControlKey": "fk-1"}
    )  # fmt: skip
    message = client.dlq.get(dlq_id)
    assert (message.dlq_id, message.url, message.method) == (dlq_id, f"{APP}/orders", "POST")
    assert (message.url_group, message.endpoint, message.queue) == ("orders", "primary", "q-orders")
    assert (message.body, message.max_retries) == ('{"order": 42}', 5)
    assert (message.created_at, message.caller_ip) == (1_700_000_000_000, "10.0.0.1")
    assert message.failure_callback == "https://app.example.com/failed"
    assert (message.response_status, message.response_body) == (503, "down")
    assert message.response_headers == {"Retry-After": ["30"]}
    assert message.label == "billing"
    assert message.flow_control is not None
    assert message.flow_control.key == "fk-1"
    assert message.headers is not None
    assert message.headers["Upstash-Label"] == ["billing,eu"]


def test_a_workflow_messages_run_is_in_its_raw_json(client: QStash, control: Control) -> None:
    """The SDK's dataclass drops them, but the answer carries the run's id, URL and start."""
    [dlq_id] = control.seed(
        {"url": f"{APP}/orders?step=3", "workflowRunId": "wfr_1", "workflowUrl": f"{APP}/orders",
         "workflowCreatedAt": 1_000, "createdAt": 2_000}
    )  # fmt: skip
    raw = client.http.request(path=f"/v2/dlq/{dlq_id}", method="GET")
    assert (raw["workflowRunId"], raw["workflowUrl"]) == ("wfr_1", f"{APP}/orders")
    assert (raw["workflowCreatedAt"], raw["createdAt"]) == (1_000, 2_000)
    assert client.dlq.get(dlq_id).headers == {"Upstash-Workflow-Runid": ["wfr_1"]}


@pytest.mark.parametrize(
    ("dlq_filter", "expected"),
    [
        pytest.param({}, ["msg_1", "msg_2", "msg_3", "msg_4"], id="none"),
        pytest.param({"message_id": "msg_2"}, ["msg_2"], id="message_id"),
        pytest.param({"url": f"{APP}/orders"}, ["msg_1", "msg_3"], id="url"),
        pytest.param({"url_group": "orders"}, ["msg_1"], id="url_group"),
        pytest.param({"queue": "q-invoices"}, ["msg_2"], id="queue"),
        pytest.param({"schedule_id": "scd_1"}, ["msg_1"], id="schedule_id"),
        pytest.param({"from_time": 2_000, "to_time": 3_000}, ["msg_2", "msg_3"], id="time"),
        pytest.param({"response_status": 500}, ["msg_1", "msg_4"], id="response_status"),
        pytest.param({"caller_ip": "10.0.0.1"}, ["msg_1", "msg_3"], id="caller_ip"),
        pytest.param({"label": "billing"}, ["msg_1", "msg_3"], id="label"),
        pytest.param({"label": "eu"}, ["msg_3"], id="second-label"),
        pytest.param({"url": f"{APP}/orders", "response_status": 404}, ["msg_3"], id="anded"),
    ],
)
def test_dlq_list_filters(
    client: QStash, control: Control, dlq_filter: Any, expected: list[str]
) -> None:
    """Each filter of the SDK selects its messages, in DLQ order, in one page."""
    control.seed(*MESSAGES)
    page = client.dlq.list(filter=dlq_filter)
    assert [message.message_id for message in page.messages] == expected
    assert page.cursor is None


def test_dlq_list_takes_repeated_filters_the_sdk_lacks(client: QStash, control: Control) -> None:
    """Through the SDK's HTTP layer: flowControlKey twice is either key."""
    control.seed(*MESSAGES)
    params: Any = [("flowControlKey", "fk-1"), ("flowControlKey", "fk-3")]
    answer = client.http.request(path="/v2/dlq", method="GET", params=params)
    assert [message["messageId"] for message in answer["messages"]] == ["msg_1", "msg_4"]


def test_dlq_list_walks_the_whole_dlq_with_count_and_cursor(
    client: QStash, control: Control
) -> None:
    """Pages of `count` until the cursor is left out."""
    ids = control.seed(*({"url": APP} for _ in range(7)))
    pages: list[list[str]] = []
    cursor = None
    for _ in range(len(ids)):
        page = client.dlq.list(count=3, cursor=cursor)
        pages.append([message.dlq_id for message in page.messages])
        cursor = page.cursor
        if cursor is None:
            break
    assert pages == [ids[:3], ids[3:6], ids[6:]]


def test_dlq_list_answers_at_most_100_a_page(client: QStash, control: Control) -> None:
    """Without `count`, a page of 100 and a cursor for the rest."""
    ids = control.seed(*({"url": APP} for _ in range(101)))
    first = client.dlq.list()
    assert [message.dlq_id for message in first.messages] == ids[:100]
    rest = client.dlq.list(cursor=first.cursor)
    assert ([message.dlq_id for message in rest.messages], rest.cursor) == (ids[100:], None)


def test_dlq_delete_takes_the_message_out(client: QStash, control: Control) -> None:
    """The deleted message is gone; the others stay."""
    ids = control.seed({"url": APP}, {"url": APP})
    client.dlq.delete(ids[0])
    assert control.dlq_ids() == ids[1:]


def test_dlq_delete_many_counts_what_it_deleted(client: QStash, control: Control) -> None:
    """An id not in the DLQ is skipped and not counted."""
    ids = control.seed({"url": APP}, {"url": APP}, {"url": APP})
    assert client.dlq.delete_many([ids[0], ids[2], "1-404"]) == 2
    assert control.dlq_ids() == [ids[1]]


# URL Groups.

PRIMARY = {"name": "primary", "url": "https://a.example.com/hook"}
BACKUP = {"name": "backup", "url": "https://b.example.com/hook"}
SPARE = {"url": "https://c.example.com/hook"}


def test_url_group_get_lists_its_endpoints(client: QStash, control: Control) -> None:
    """Name, times and endpoints, an unnamed one with name None."""
    control.url_group("orders", PRIMARY, SPARE)
    group = client.url_group.get("orders")
    assert group.name == "orders"
    assert [(e.name, e.url) for e in group.endpoints] == [
        ("primary", PRIMARY["url"]),
        (None, SPARE["url"]),
    ]
    assert 0 < group.created_at <= group.updated_at


def test_url_group_remove_endpoints_by_name_and_by_url(client: QStash, control: Control) -> None:
    """An endpoint is removed by its name, or by its url."""
    control.url_group("orders", PRIMARY, BACKUP, SPARE)
    client.url_group.remove_endpoints("orders", [{"name": "primary"}])
    client.url_group.remove_endpoints("orders", [{"url": SPARE["url"]}])
    endpoints = client.url_group.get("orders").endpoints
    assert [(e.name, e.url) for e in endpoints] == [("backup", BACKUP["url"])]


def test_url_group_is_gone_with_its_last_endpoint(client: QStash, control: Control) -> None:
    """Removing every endpoint deletes the group: then a 404."""
    control.url_group("orders", PRIMARY, BACKUP)
    client.url_group.remove_endpoints("orders", [{"name": "primary"}, {"url": BACKUP["url"]}])
    with pytest.raises(QStashError, match="status: 404"):
        client.url_group.get("orders")


def test_url_group_upsert_endpoints_creates_and_replaces(client: QStash) -> None:
    """Upsert creates the group, then replaces the endpoint of the same name."""
    client.url_group.upsert_endpoints("orders", [{"name": "primary", "url": PRIMARY["url"]}])
    client.url_group.upsert_endpoints("orders", [{"name": "primary", "url": SPARE["url"]}])
    endpoints = client.url_group.get("orders").endpoints
    assert [(e.name, e.url) for e in endpoints] == [("primary", SPARE["url"])]


def test_url_group_list_and_delete(client: QStash, control: Control) -> None:
    """The SDK lists the groups; a deleted group is gone with its endpoints."""
    control.url_group("orders", {"name": "a", "url": f"{APP}/a"})
    control.url_group("invoices", {"url": f"{APP}/b"})
    assert sorted(group.name for group in client.url_group.list()) == ["invoices", "orders"]
    client.url_group.delete("orders")
    assert [group.name for group in client.url_group.list()] == ["invoices"]
    with pytest.raises(QStashError, match="status: 404"):
        client.url_group.delete("orders")


# Workflow resume and restart, which the SDK has no methods for.

RUNS = {
    "a": {"url": f"{APP}/orders", "labels": ["billing"], "callerIP": "10.0.0.1",
          "flowControlKey": "fk-1", "createdAt": 1_000, "workflowCreatedAt": 900,
          "failureFunctionState": "CALLBACK_FAIL"},
    "b": {"url": f"{APP}/orders/v2", "labels": ["shipping"], "callerIP": "10.0.0.2",
          "flowControlKey": "fk-2", "createdAt": 2_000, "workflowCreatedAt": 1_900,
          "failureFunctionState": "CALLBACK_SUCCESS"},
    "c": {"url": f"{APP}/invoices", "labels": ["eu"], "callerIP": "10.0.0.3",
          "flowControlKey": "fk-3", "createdAt": 3_000, "workflowCreatedAt": 2_900},
    "d": {"url": OTHER, "callerIP": "10.0.0.1", "flowControlKey": "fk-1", "createdAt": 4_000,
          "workflowCreatedAt": 3_900, "failureFunctionState": "CALLBACK_INPROGRESS"},
}  # fmt: skip
# Matches most filters that select `a`, but is no workflow run's: never resumed.
PLAIN = {"dlqId": "dlq_plain", "url": f"{APP}/orders", "labels": ["billing"],
         "callerIP": "10.0.0.1", "flowControlKey": "fk-1", "createdAt": 1_500}  # fmt: skip


def seed_runs(control: Control) -> None:
    control.seed(
        PLAIN,
        *(
            {"dlqId": f"dlq_{key}", "workflowRunId": f"wfr_{key}", **run}
            for key, run in RUNS.items()
        ),
    )


@MODES
@pytest.mark.parametrize(
    ("params", "selected"),
    [
        pytest.param([], "abcd", id="none"),
        pytest.param([("dlqIds", "dlq_a"), ("dlqIds", "dlq_c")], "ac", id="dlqIds"),
        pytest.param(
            [("dlqIds", "dlq_b"), ("label", "billing"), ("callerIp", "10.9.9.9")],
            "b",
            id="dlqIds-override-filters",
        ),
        pytest.param(
            [("dlqIds", "dlq_plain"), ("dlqIds", "dlq_d"), ("dlqIds", "1-404")],
            "d",
            id="dlqIds-skip-others",
        ),
        pytest.param([("label", "billing"), ("label", "eu")], "ac", id="label"),
        pytest.param([("workflowUrl", f"{APP}/orders"), ("workflowUrl", OTHER)], "ad",
                     id="workflowUrl-exact-by-default"),
        pytest.param([("workflowUrl", f"{APP}/orders"), ("workflowUrlExactMatch", "true")], "a",
                     id="workflowUrl-exact"),
        pytest.param([("workflowUrl", f"{APP}/orders"), ("workflowUrlExactMatch", "false")], "ab",
                     id="workflowUrl-prefix"),
        pytest.param(
            [("workflowUrl", f"{APP}/inv"), ("workflowUrl", "https://other.example.com/"),
             ("workflowUrlExactMatch", "false")],
            "cd",
            id="workflowUrl-prefixes",
        ),
        pytest.param([("callerIp", "10.0.0.2"), ("callerIp", "10.0.0.3")], "bc", id="callerIp"),
        pytest.param([("flowControlKey", "fk-1"), ("flowControlKey", "fk-3")], "acd",
                     id="flowControlKey"),
        pytest.param([("workflowRunId", "wfr_b")], "b", id="workflowRunId"),
        pytest.param([("workflowCreatedAt", "2900")], "c", id="workflowCreatedAt"),
        pytest.param([("failureFunctionState", "CALLBACK_FAIL")], "a", id="failureFunctionState"),
        pytest.param([("fromDate", "2000"), ("toDate", "3000")], "bc", id="fromDate-toDate"),
        pytest.param([("fromDate", "3000")], "cd", id="fromDate"),
        pytest.param([("toDate", "1999")], "a", id="toDate"),
        pytest.param([("callerIp", "10.0.0.1"), ("flowControlKey", "fk-1"), ("label", "billing")],
                     "a", id="anded"),
        pytest.param([("count", "2")], "ab", id="count"),
    ],
)  # fmt: skip
def test_bulk_call_recovers_what_its_filters_select(
    client: QStash, control: Control, mode: str, params: list[tuple[str, str]], selected: str
) -> None:
    """Exactly the selected runs are recovered, in DLQ order; the rest stay in the DLQ."""
    seed_runs(control)
    answer = post(client, f"{WORKFLOW_DLQ}/{mode}", params)
    runs = control.runs()
    assert [run["sourceDlqId"] for run in runs] == [f"dlq_{key}" for key in selected]
    assert [run["previousWorkflowRunId"] for run in runs] == [f"wfr_{key}" for key in selected]
    assert all(run["mode"] == mode for run in runs)
    assert answer["workflowRuns"] == [
        {"workflowRunId": run["workflowRunId"], "workflowCreatedAt": run["workflowCreatedAt"]}
        for run in runs
    ]
    left = [f"dlq_{key}" for key in RUNS if key not in selected]
    assert control.dlq_ids() == ["dlq_plain", *left]


@MODES
def test_bulk_call_pages_with_count_and_cursor(client: QStash, control: Control, mode: str) -> None:
    """count=3 takes three runs and a cursor; the next call the last run and an empty one."""
    seed_runs(control)
    first = post(client, f"{WORKFLOW_DLQ}/{mode}", [("count", "3")])
    assert len(first["workflowRuns"]) == 3
    assert first["cursor"]
    last = post(client, f"{WORKFLOW_DLQ}/{mode}", [("count", "3"), ("cursor", first["cursor"])])
    assert (len(last["workflowRuns"]), last["cursor"]) == (1, "")
    assert [run["sourceDlqId"] for run in control.runs()] == ["dlq_a", "dlq_b", "dlq_c", "dlq_d"]
    assert control.dlq_ids() == ["dlq_plain"]


def test_bulk_call_takes_at_most_50_runs(client: QStash, control: Control) -> None:
    """51 runs in the DLQ: 50, then the last one with the cursor."""
    control.seed(*({"url": APP, "workflowRunId": f"wfr_{i}"} for i in range(51)))
    first = post(client, f"{WORKFLOW_DLQ}/resume")
    assert len(first["workflowRuns"]) == 50
    last = post(client, f"{WORKFLOW_DLQ}/resume", [("cursor", first["cursor"])])
    assert (len(last["workflowRuns"]), last["cursor"]) == (1, "")
    assert control.dlq_ids() == []


OVERRIDES = {
    "Upstash-Retries": "7",
    "Upstash-Delay": "30s",
    "Upstash-Flow-Control-Key": "fk-new",
    "Upstash-Flow-Control-Value": "parallelism=2,rate=10",
    "Upstash-Label": "retried",
    "Upstash-Failure-Callback": "https://app.example.com/failed",
}


@MODES
def test_bulk_call_records_the_override_headers(
    client: QStash, control: Control, mode: str
) -> None:
    """The `Upstash-*` override headers are parsed onto the new run."""
    seed_runs(control)
    post(client, f"{WORKFLOW_DLQ}/{mode}", [("workflowRunId", "wfr_a")], headers=OVERRIDES)
    [run] = control.runs()
    assert run["overrides"] == {
        "retries": 7,
        "delay": "30s",
        "flowControlKey": "fk-new",
        "flowControlValue": {"parallelism": 2, "rate": 10},
        "labels": ["retried"],
        "failureCallback": "https://app.example.com/failed",
    }
    assert (run["retries"], run["labels"], run["delaySeconds"]) == (7, ["retried"], 30.0)
    assert run["failureCallback"] == "https://app.example.com/failed"
    assert run["rawHeaders"] == OVERRIDES


@MODES
def test_single_call_recovers_that_message(client: QStash, control: Control, mode: str) -> None:
    """The new run's reference, its mode recorded, its message out of the DLQ."""
    seed_runs(control)
    answer = post(client, f"{WORKFLOW_DLQ}/{mode}/dlq_b", headers={"Upstash-Retries": "1"})
    [run] = control.runs()
    assert answer == {
        "workflowRunId": run["workflowRunId"],
        "workflowCreatedAt": run["workflowCreatedAt"],
    }
    assert run["workflowRunId"] not in {f"wfr_{key}" for key in RUNS}
    assert (run["mode"], run["sourceDlqId"]) == (mode, "dlq_b")
    assert (run["previousWorkflowRunId"], run["retries"]) == ("wfr_b", 1)
    assert "dlq_b" not in control.dlq_ids()


@MODES
def test_single_call_refuses_a_message_of_no_workflow_run(
    client: QStash, control: Control, mode: str
) -> None:
    """400, and the message stays in the DLQ."""
    seed_runs(control)
    with pytest.raises(QStashError, match="status: 400"):
        post(client, f"{WORKFLOW_DLQ}/{mode}/dlq_plain")
    assert "dlq_plain" in control.dlq_ids()
    assert control.runs() == []


# Errors as the SDK raises them.


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda client: client.dlq.get("1-404"), id="dlq.get"),
        pytest.param(lambda client: client.dlq.delete("1-404"), id="dlq.delete"),
        pytest.param(lambda client: client.url_group.get("missing"), id="url_group.get"),
        pytest.param(
            lambda client: client.url_group.remove_endpoints("missing", [{"name": "a"}]),
            id="url_group.remove_endpoints",
        ),
        pytest.param(lambda client: post(client, f"{WORKFLOW_DLQ}/resume/1-404"), id="resume-one"),
        pytest.param(
            lambda client: post(client, f"{WORKFLOW_DLQ}/restart/1-404"), id="restart-one"
        ),
    ],
)
def test_missing_things_are_404s(client: QStash, call: Callable[[QStash], object]) -> None:
    """A plain QStashError naming status 404 and carrying the emulator's error."""
    with pytest.raises(QStashError) as raised:
        call(client)
    assert type(raised.value) is QStashError
    assert str(raised.value).startswith("Request failed with status: 404, body: {")
    assert "error" in json.loads(str(raised.value).split("body: ", 1)[1])


def test_burst_limit_is_rate_limit_exceeded(client: QStash, control: Control) -> None:
    """Three calls at 1/s: the first goes through, one at least lands in a full window."""
    control.limit(max_requests_per_second=1)
    refused: list[RateLimitExceededError | None] = []
    for _ in range(3):
        try:
            client.dlq.list()
            refused.append(None)
        except RateLimitExceededError as error:
            refused.append(error)
    assert refused[0] is None
    [first, *_] = [error for error in refused if error is not None]
    assert (first.limit, first.remaining) == ("1", "0")
    assert first.reset is not None
    assert int(first.reset) >= int(time.time())


def test_daily_budget_spent_is_daily_message_limit_exceeded(
    client: QStash, control: Control
) -> None:
    """A budget of 2: two calls go through, the third is refused as the daily limit."""
    control.limit(max_requests_per_day=2)
    client.dlq.list()
    client.dlq.list()
    with pytest.raises(DailyMessageLimitExceededError) as raised:
        client.dlq.list()
    assert (raised.value.limit, raised.value.remaining) == ("2", "0")
    assert raised.value.reset is not None
    assert int(raised.value.reset) % 86_400 == 0
    assert int(raised.value.reset) > time.time()


def test_answers_count_down_the_daily_budget(client: QStash, control: Control) -> None:
    """Each answer's RateLimit-Remaining is one less than the last."""
    control.limit(max_requests_per_day=3)
    seen = []
    for _ in range(3):
        with contextlib.closing(client.http.stream(path="/v2/dlq", method="GET")) as response:
            seen.append(
                (response.headers["RateLimit-Limit"], response.headers["RateLimit-Remaining"])
            )
    assert seen == [("3", "2"), ("3", "1"), ("3", "0")]


# Signatures, checked by the SDK's Receiver.


@dataclass
class Failed:
    """A message that failed at `url` and was called back at `callback_url`."""

    sink: Sink
    url: str
    callback_url: str
    dlq_id: str

    @property
    def callback(self) -> tuple[str, str]:
        """The failure callback's signature and body."""
        [request] = self.sink.at("/callbacks")
        return request.headers["upstash-signature"], request.body.decode()


@pytest.fixture(scope="module")
def destination() -> Iterator[tuple[Sink, str]]:
    """A server answering 500 at /work, and taking failure callbacks at /callbacks."""
    sink = Sink(statuses={"/work": 500}, bodies={"/work": b"boom"})
    with serve_in_thread(sink) as url:
        yield sink, url


@pytest.fixture
def failed(control: Control, destination: tuple[Sink, str]) -> Failed:
    """A message that failed at the destination and was called back."""
    sink, base = destination
    sink.received.clear()
    url, callback_url = f"{base}/work", f"{base}/callbacks"
    answer = control.publish(
        url=url, body='{"order": 42}', maxRetries=0, failureCallback=callback_url
    )
    [outcome] = answer["outcomes"]
    return Failed(sink, url, callback_url, outcome["dlqId"])


RECEIVER = Receiver(current_signing_key=SIGNING_KEY_CURRENT, next_signing_key=SIGNING_KEY_NEXT)


def test_receiver_verifies_the_failure_callback(client: QStash, failed: Failed) -> None:
    """The callback is signed for its URL and body, and names the dead-lettered message."""
    signature, body = failed.callback
    RECEIVER.verify(signature=signature, body=body, url=failed.callback_url)
    assert json.loads(body)["dlqId"] == failed.dlq_id
    assert client.dlq.get(failed.dlq_id).response_body == "boom"


def test_receiver_rejects_a_tampered_callback_body(failed: Failed) -> None:
    """Another body does not match the signed hash."""
    signature, body = failed.callback
    tampered = body.replace(failed.dlq_id, "1-0")
    with pytest.raises(SignatureError):
        RECEIVER.verify(signature=signature, body=tampered, url=failed.callback_url)
    # The Receiver raises what the next key says (not that key); the current key says why.
    with pytest.raises(SignatureError, match="Invalid body hash"):
        verify_with_key(
            SIGNING_KEY_CURRENT, signature=signature, body=tampered, url=failed.callback_url
        )


def test_receiver_rejects_the_callback_at_another_url(failed: Failed) -> None:
    """The signature names the callback URL it was sent to."""
    signature, body = failed.callback
    with pytest.raises(SignatureError):
        RECEIVER.verify(signature=signature, body=body, url=failed.url)
    with pytest.raises(SignatureError, match="Invalid subject"):
        verify_with_key(SIGNING_KEY_CURRENT, signature=signature, body=body, url=failed.url)


def test_receiver_verifies_the_delivery(failed: Failed) -> None:
    """What the destination got is signed for it too."""
    [request] = failed.sink.at("/work")
    signature = request.headers["upstash-signature"]
    RECEIVER.verify(signature=signature, body=request.body.decode(), url=failed.url)
