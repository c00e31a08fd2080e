"""The emulator's in-memory model: DLQ entries, URL Groups and workflow runs. No I/O here."""

from __future__ import annotations

import base64
import binascii
import itertools
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, model_validator

from daemon.emulator.errors import BadRequest, NotFound
from daemon.emulator.headers import HeaderMap, HeaderNames, as_lists, first_value, with_header
from daemon.emulator.overrides import Overrides, is_http_url

FailureFunctionState = Literal[
    "CALLBACK_INPROGRESS", "CALLBACK_SUCCESS", "CALLBACK_FAIL", "CALLBACK_CANCELED"
]
FAILURE_FUNCTION_STATES: frozenset[str] = frozenset(get_args(FailureFunctionState))
RunMode = Literal["resume", "restart"]
RunStatus = Literal["pending", "delivering", "succeeded", "failed"]

# QStash's rule for URL Group names.
_GROUP_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def split_labels(value: str | None) -> tuple[str, ...]:
    """`a, b` -> ("a", "b"): the comma-separated form of the `<Prefix>-Label` header."""
    if not value:
        return ()
    return tuple(label.strip() for label in value.split(",") if label.strip())


def _is_base64(value: str) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


class SeedMessage(BaseModel):
    """A DLQ message to put in the DLQ (spec 2.1), with defaults for what is left out.

    Besides the spec's fields: `labels` and `flowControlKey` (real DLQ messages carry them;
    each is also set as its `<Prefix>-*` header), and the workflow fields. `workflowRunId`
    makes the entry a workflow run's (the `<Prefix>-Workflow-RunId` header is added); a
    `header` that already carries that header does the same. `workflowUrl` defaults to `url`,
    `workflowCreatedAt` to `createdAt`.
    """

    model_config = ConfigDict(extra="forbid")

    messageId: str | None = None
    topicName: str | None = None
    endpointName: str | None = None
    url: str
    method: str = "POST"
    header: dict[str, list[str] | str] | None = None
    body: str | None = None
    bodyBase64: str | None = None
    maxRetries: int = 3
    notBefore: int = 0
    createdAt: int | None = None
    callback: str | None = None
    failureCallback: str | None = None
    scheduleId: str | None = None
    callerIP: str = "127.0.0.1"
    dlqId: str | None = None
    queueName: str | None = None
    responseStatus: int = 500
    responseHeader: dict[str, list[str] | str] | None = None
    responseBody: str | None = None
    responseBodyBase64: str | None = None
    labels: list[str] | None = None
    flowControlKey: str | None = None
    workflowRunId: str | None = None
    workflowUrl: str | None = None
    workflowCreatedAt: int | None = None
    failureFunctionState: FailureFunctionState | None = None

    @model_validator(mode="after")
    def _one_body_form(self) -> SeedMessage:
        for text, encoded in (("body", "bodyBase64"), ("responseBody", "responseBodyBase64")):
            if getattr(self, text) is not None and getattr(self, encoded) is not None:
                raise ValueError(f"give {text} or {encoded}, not both")
            if getattr(self, encoded) is not None and not _is_base64(getattr(self, encoded)):
                raise ValueError(f"{encoded} is not base64")
        return self


# Spec 2.1's fields in its order, then the extra fields real DLQ messages carry.
_WIRE_FIELDS = (
    "messageId", "topicName", "endpointName", "url", "method", "header", "body", "bodyBase64",
    "maxRetries", "notBefore", "createdAt", "callback", "failureCallback", "scheduleId",
    "callerIP", "dlqId", "queueName", "responseStatus", "responseHeader", "responseBody",
    "responseBodyBase64", "labels", "flowControlKey",
)  # fmt: skip


@dataclass(frozen=True)
class WorkflowRef:
    """The workflow run a DLQ entry (or a delivery) belongs to."""

    run_id: str
    url: str
    created_at: int
    failure_function_state: str | None = None


@dataclass(frozen=True)
class DlqEntry:
    """A message in the DLQ: its wire form plus what the bulk filters look at.

    `seq` is the order of arrival in the DLQ; bulk calls process entries in that order and
    cursors point into it.
    """

    seq: int
    dlq_id: str
    message: Mapping[str, Any]
    workflow: WorkflowRef | None
    labels: tuple[str, ...]
    flow_control_key: str | None

    @property
    def created_at(self) -> int:
        return int(self.message["createdAt"])

    @property
    def caller_ip(self) -> str:
        return str(self.message["callerIP"])

    @property
    def header(self) -> HeaderMap:
        return {name: list(values) for name, values in self.message.get("header", {}).items()}

    @property
    def body(self) -> bytes:
        if "bodyBase64" in self.message:
            return base64.b64decode(self.message["bodyBase64"])
        return str(self.message.get("body", "")).encode("utf-8")

    def to_wire(self) -> dict[str, Any]:
        """The message as `GET /v2/dlq/{dlqId}` answers it: the stored fields, `label` (the
        first of `labels`, which the SDKs read) and, for a workflow run's message, the
        run's `workflowRunId`, `workflowUrl` and `workflowCreatedAt` beside its headers."""
        wire = dict(self.message)
        if self.labels:
            wire["label"] = self.labels[0]
        if self.workflow is not None:
            wire["workflowRunId"] = self.workflow.run_id
            wire["workflowUrl"] = self.workflow.url
            wire["workflowCreatedAt"] = self.workflow.created_at
        return wire

    def to_listed(self) -> dict[str, Any]:
        """The message as the DLQ listings answer it: the wire form plus, when known, the
        state of the workflow's failure function."""
        listed = self.to_wire()
        if self.workflow is not None and self.workflow.failure_function_state is not None:
            listed["failureFunctionState"] = self.workflow.failure_function_state
        return listed

    def to_seed(self) -> dict[str, Any]:
        """What `POST /_emulator/dlq` would take to put this entry back as it is."""
        seed = self.to_listed()
        seed.pop("label", None)  # derived from `labels`
        return seed


def build_entry(seed: SeedMessage, *, seq: int, now_ms: int, names: HeaderNames) -> DlqEntry:
    """The DLQ entry for `seed`, its defaults filled in and its derived headers set."""
    created_at = now_ms if seed.createdAt is None else seed.createdAt
    header = as_lists(seed.header or {})
    run_id = seed.workflowRunId or first_value(header, names.workflow_run_id)
    labels = split_labels(first_value(header, names.label))
    if seed.labels is not None:
        labels = tuple(seed.labels)
    flow_control_key = seed.flowControlKey or first_value(header, names.flow_control_key)
    # Set the derived headers only from explicit fields: a header given as such is kept as is.
    if seed.workflowRunId:
        header = with_header(header, names.workflow_run_id, seed.workflowRunId)
    if seed.labels is not None:
        header = with_header(header, names.label, ",".join(labels) or None)
    if seed.flowControlKey:
        header = with_header(header, names.flow_control_key, seed.flowControlKey)
    values = seed.model_dump()
    values.update(
        messageId=seed.messageId or "msg_" + random_id(),
        header=header or None,
        createdAt=created_at,
        dlqId=seed.dlqId or f"{now_ms}-{seq}",
        responseHeader=as_lists(seed.responseHeader) if seed.responseHeader else None,
    )
    workflow = None
    if run_id:
        workflow = WorkflowRef(
            run_id=run_id,
            url=seed.workflowUrl or seed.url,
            created_at=created_at if seed.workflowCreatedAt is None else seed.workflowCreatedAt,
            failure_function_state=seed.failureFunctionState,
        )
    # Absent optional fields are left out, never null (the official SDKs choke on null).
    message = {key: values[key] for key in _WIRE_FIELDS if values[key] is not None}
    return DlqEntry(seq, message["dlqId"], message, workflow, labels, flow_control_key)


def random_id() -> str:
    """Letters and digits only, like the ids QStash hands out."""
    return secrets.token_hex(14)


@dataclass
class Endpoint:
    url: str
    name: str | None = None

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "url": self.url} if self.name else {"url": self.url}


@dataclass(frozen=True)
class EndpointRef:
    """An endpoint named in a request body (spec 2.3): by name, by url, or both."""

    name: str | None = None
    url: str | None = None

    def matches(self, endpoint: Endpoint) -> bool:
        """True for an endpoint with this name, or with this url (QStash matches either)."""
        by_name = self.name is not None and endpoint.name == self.name
        by_url = self.url is not None and endpoint.url == self.url
        return by_name or by_url


@dataclass
class UrlGroup:
    name: str
    created_at: int
    updated_at: int
    endpoints: list[Endpoint] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """QStash's URL Group record: name, createdAt, updatedAt, endpoints."""
        return {
            "name": self.name,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
            "endpoints": [endpoint.to_json() for endpoint in self.endpoints],
        }


def parse_endpoint_refs(payload: object, *, url_required: bool) -> list[EndpointRef]:
    """The `endpoints` of a request body; 400 for anything but a non-empty list of refs."""
    if not isinstance(payload, dict) or not isinstance(payload.get("endpoints"), list):
        raise BadRequest("the body must be a JSON object with an `endpoints` list")
    items: list[Any] = payload["endpoints"]
    if not items:
        raise BadRequest("`endpoints` must not be empty")
    return [_endpoint_ref(index, item, url_required) for index, item in enumerate(items)]


def _endpoint_ref(index: int, item: Any, url_required: bool) -> EndpointRef:
    where = f"endpoints[{index}]"
    if not isinstance(item, dict):
        raise BadRequest(f"{where} must be an object with a name or a url")
    name, url = item.get("name") or None, item.get("url") or None
    for key, value in (("name", name), ("url", url)):
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"{where}.{key} must be a string")
    if url_required and url is None:
        raise BadRequest(f"{where} needs a url")
    if name is None and url is None:
        raise BadRequest(f"{where} needs a name or a url")
    if url is not None and url_required and not is_http_url(url):
        raise BadRequest(f"{where}.url must be an absolute http(s) URL")
    return EndpointRef(name=name, url=url)


def without_endpoints(endpoints: Iterable[Endpoint], refs: Iterable[EndpointRef]) -> list[Endpoint]:
    """The endpoints that no ref matches. A ref matching nothing is ignored, as by QStash."""
    refs = list(refs)
    return [endpoint for endpoint in endpoints if not any(ref.matches(endpoint) for ref in refs)]


def with_endpoints(endpoints: Iterable[Endpoint], refs: Iterable[EndpointRef]) -> list[Endpoint]:
    """Upsert: each ref replaces the endpoints with its name or url, else is appended."""
    result = list(endpoints)
    for ref in refs:
        assert ref.url is not None  # parse_endpoint_refs(url_required=True) saw to it
        new = Endpoint(url=ref.url, name=ref.name)
        positions = [i for i, endpoint in enumerate(result) if ref.matches(endpoint)]
        if positions:
            result = [e for i, e in enumerate(result) if i not in positions[1:]]
            result[positions[0]] = new
        else:
            result.append(new)
    return result


@dataclass
class Run:
    """A workflow run created by a bulk resume or restart, and what became of it."""

    workflow_run_id: str
    workflow_created_at: int
    mode: RunMode
    source_dlq_id: str
    previous_workflow_run_id: str
    workflow_url: str
    overrides: Overrides
    retries: int
    failure_callback: str | None
    labels: tuple[str, ...]
    delay_seconds: float
    status: RunStatus = "pending"
    delivery_id: str | None = None
    result_dlq_id: str | None = None

    def reference(self) -> dict[str, Any]:
        """The run as the bulk calls list it (spec 2.4)."""
        return {
            "workflowRunId": self.workflow_run_id,
            "workflowCreatedAt": self.workflow_created_at,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.reference(),
            "mode": self.mode,
            "sourceDlqId": self.source_dlq_id,
            "previousWorkflowRunId": self.previous_workflow_run_id,
            "workflowUrl": self.workflow_url,
            "overrides": self.overrides.to_json(),
            "rawHeaders": dict(self.overrides.raw_headers),
            "retries": self.retries,
            "failureCallback": self.failure_callback,
            "labels": list(self.labels),
            "delaySeconds": self.delay_seconds,
            "status": self.status,
            "deliveryId": self.delivery_id,
            "resultDlqId": self.result_dlq_id,
        }


class Store:
    """The DLQ, the URL Groups and the runs of one emulator."""

    def __init__(self) -> None:
        self.dlq: dict[str, DlqEntry] = {}  # insertion order == seq order
        self.groups: dict[str, UrlGroup] = {}
        self.runs: list[Run] = []
        self._seq = itertools.count()
        self.last_seq = -1

    def next_seq(self) -> int:
        """A new DLQ sequence number; never reused, not even after `clear`, so old cursors
        cannot land on new entries."""
        self.last_seq = next(self._seq)
        return self.last_seq

    def add(self, entry: DlqEntry) -> None:
        if entry.dlq_id in self.dlq:
            raise BadRequest(f"dlqId {entry.dlq_id} is already in the DLQ")
        self.dlq[entry.dlq_id] = entry

    def entries(self) -> list[DlqEntry]:
        return list(self.dlq.values())

    def clear(self) -> None:
        self.dlq.clear()
        self.groups.clear()
        self.runs.clear()

    def group(self, name: str) -> UrlGroup:
        group = self.groups.get(name)
        if group is None:
            raise NotFound(f"URL Group {name} not found")
        return group

    def put_group(self, name: str, endpoints: list[Endpoint], now_ms: int) -> UrlGroup:
        """Create or replace a group (an empty endpoint list deletes it, as removal would)."""
        if not _GROUP_NAME.match(name):
            raise BadRequest("a URL Group name may hold only letters, digits, `-`, `_` and `.`")
        old = self.groups.get(name)
        group = UrlGroup(name, old.created_at if old else now_ms, now_ms, endpoints)
        if endpoints:
            self.groups[name] = group
        else:
            self.groups.pop(name, None)
        return group

    def delete_group(self, name: str) -> None:
        self.group(name)  # 404 when there is none
        del self.groups[name]

    def add_endpoints(self, name: str, refs: list[EndpointRef], now_ms: int) -> UrlGroup:
        current = self.groups[name].endpoints if name in self.groups else []
        return self.put_group(name, with_endpoints(current, refs), now_ms)

    def remove_endpoints(self, name: str, refs: list[EndpointRef], now_ms: int) -> None:
        """Remove the matching endpoints; with none left, the group is deleted (spec 4.3)."""
        group = self.group(name)
        self.put_group(name, without_endpoints(group.endpoints, refs), now_ms)
