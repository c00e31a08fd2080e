"""The workflow protocol of the official SDKs: messages published to the service, the runs
they make up, and what each step delivery carries (docs/emulator.md, "Workflow runs")."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, replace
from typing import Literal

from daemon.emulator.errors import BadRequest
from daemon.emulator.headers import HeaderMap, HeaderNames, canonical, first_value
from daemon.emulator.overrides import Overrides, duration_seconds, is_count, is_http_url
from daemon.emulator.state import split_labels

DEFAULT_RETRIES = 3  # both SDKs leave `Retries` out when it is 3: the service's default
RunStatus = Literal["running", "completed", "cancelled", "failed"]

# Headers never passed on to a destination: hop-by-hop and length ones (the Python SDK
# forwards every header it received, `Host` and `Content-Length` included).
_HOP_BY_HOP = frozenset(
    {
        "host", "content-length", "connection", "keep-alive", "transfer-encoding", "te",
        "trailer", "upgrade", "proxy-connection", "accept-encoding",
    }
)  # fmt: skip
# The service's own headers: set on each delivery by the service, so a stale copy that an
# SDK forwards back (`Upstash-Forward-Upstash-Signature`) must not come through.
_SERVICE_SUFFIXES = (
    "Signature", "Message-Id", "Retried", "Workflow-Runid", "Workflow-Url",
    "Workflow-Createdat",
)  # fmt: skip


@dataclass(frozen=True)
class Inbound:
    """A message as published: its destination, headers (canonical names) and body."""

    destination: str
    header: HeaderMap
    body: bytes


@dataclass(frozen=True)
class Settings:
    """What a message (or a run, from its Init message) says about its delivery; None:
    not said, so the next source (message, then run, then the default) decides."""

    retries: int | None = None
    retry_delay: str | None = None
    failure_callback: str | None = None
    failure_header: HeaderMap | None = None
    flow_control_key: str | None = None
    flow_control_value: str | None = None
    labels: tuple[str, ...] | None = None

    def over(self, other: Settings) -> Settings:
        """These settings, with what they leave unsaid taken from `other`."""
        mine = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return replace(other, **{name: value for name, value in mine.items() if value is not None})

    @classmethod
    def of_overrides(cls, overrides: Overrides) -> Settings:
        value = next(
            (v for h, v in overrides.raw_headers.items() if h.endswith("-Flow-Control-Value")),
            None,
        )
        return cls(
            retries=overrides.retries,
            retry_delay=overrides.retry_delay,
            failure_callback=overrides.failure_callback,
            flow_control_key=overrides.flow_control_key,
            flow_control_value=value,
            labels=overrides.labels,
        )


@dataclass(frozen=True)
class Step:
    """One entry of a run's history: the message that brought it, as published."""

    message_id: str
    destination: str
    header: HeaderMap
    body: bytes

    def to_raw(self) -> dict[str, str]:
        """The history entry as the SDKs parse it (their `RawStep`)."""
        body = base64.b64encode(self.body).decode("ascii")
        return {"messageId": self.message_id, "body": body, "callType": "step"}


@dataclass
class WorkflowRun:
    """A run of a workflow endpoint: its Init settings, its history and its fate."""

    run_id: str
    url: str
    created_at: int  # ms
    settings: Settings
    history: list[Step]
    overrides: Settings = field(default_factory=Settings)
    status: RunStatus = "running"
    source_dlq_id: str | None = None  # for a resumed or restarted run: where it came from

    @property
    def initial_body(self) -> bytes:
        return self.history[0].body

    def history_body(self, upto: int) -> bytes:
        """The delivery body of history entry `upto`: every entry up to it, inclusive."""
        raw = [step.to_raw() for step in self.history[: upto + 1]]
        return json.dumps(raw, separators=(",", ":")).encode("ascii")

    def index_of(self, message_id: str) -> int | None:
        for index, step in enumerate(self.history):
            if step.message_id == message_id:
                return index
        return None

    def to_json(self) -> dict[str, object]:
        return {
            "workflowRunId": self.run_id,
            "workflowUrl": self.url,
            "workflowCreatedAt": self.created_at,
            "status": self.status,
            "steps": len(self.history) - 1,
            "sourceDlqId": self.source_dlq_id,
        }


class Protocol:
    """Reads and writes the protocol's headers, spelled with the emulator's prefix."""

    def __init__(self, names: HeaderNames) -> None:
        self.names = names
        lower = names.prefix.lower()
        self._forward = f"{lower}-forward-"
        self._failure_forward = f"{lower}-failure-callback-forward-"
        self._service = {names.name(suffix).lower() for suffix in _SERVICE_SUFFIXES}

    def get(self, header: HeaderMap, suffix: str) -> str | None:
        return first_value(header, self.names.name(suffix))

    def run_id(self, message: Inbound) -> str | None:
        return self.get(message.header, "Workflow-RunId")

    def is_init(self, message: Inbound) -> bool:
        return (self.get(message.header, "Workflow-Init") or "").lower() == "true"

    def forwarded(self, header: HeaderMap, prefix: str | None = None) -> HeaderMap:
        """`<Prefix>-Forward-X: v` as `X: v`, less the headers no destination gets."""
        start = prefix or self._forward
        result: HeaderMap = {}
        for name, values in header.items():
            if not name.lower().startswith(start):
                continue
            target = canonical(name[len(start) :])
            if target.lower() in _HOP_BY_HOP or target.lower() in self._service:
                continue
            result.setdefault(target, []).extend(values)
        return result

    def failure_forwarded(self, header: HeaderMap) -> HeaderMap:
        return self.forwarded(header, self._failure_forward)

    def settings(self, header: HeaderMap) -> Settings:
        """The delivery settings a message's headers give; 400 naming a malformed one."""
        retries = self.get(header, "Retries")
        if retries is not None and not is_count(retries.strip()):
            raise BadRequest(f"{self.names.name('Retries')} must be a non-negative integer")
        failure_callback = self.get(header, "Failure-Callback")
        if failure_callback is not None and not is_http_url(failure_callback):
            raise BadRequest(f"{self.names.name('Failure-Callback')} must be an http(s) URL")
        failure_header = self.failure_forwarded(header)
        label = self.get(header, "Label")
        return Settings(
            retries=None if retries is None else int(retries),
            retry_delay=self.get(header, "Retry-Delay"),
            failure_callback=failure_callback,
            failure_header=failure_header or None,
            flow_control_key=self.get(header, "Flow-Control-Key"),
            flow_control_value=self.get(header, "Flow-Control-Value"),
            labels=split_labels(label) if label is not None else None,
        )

    def wait_seconds(self, header: HeaderMap, now: float) -> float:
        """How long the message waits before its first delivery (`Delay`, `Not-Before`)."""
        delay = self.get(header, "Delay")
        not_before = self.get(header, "Not-Before")
        seconds = 0.0
        if delay is not None:
            text = delay.strip()
            try:
                seconds = float(text) if is_count(text) else float(duration_seconds(text))
            except ValueError as exc:
                raise BadRequest(f"{self.names.name('Delay')} must be like 10s or 1m") from exc
        if not_before is not None:
            if not is_count(not_before.strip()):
                raise BadRequest(f"{self.names.name('Not-Before')} must be a Unix time")
            seconds = max(seconds, int(not_before) - now)
        return seconds

    def delivery_header(self, message: Inbound, run: WorkflowRun | None) -> HeaderMap:
        """The headers a destination gets (the service adds Message-Id, Retried and the
        signature when it sends): the content type, the forwarded headers, and for a
        workflow run its id, URL and creation time."""
        header: HeaderMap = {}
        content_type = first_value(message.header, "Content-Type")
        if content_type is not None:
            header["Content-Type"] = [content_type]
        header.update(self.forwarded(message.header))
        if run is not None:
            header[self.names.workflow_run_id] = [run.run_id]
            header[self.names.name("Workflow-Url")] = [run.url]
            header[self.names.name("Workflow-CreatedAt")] = [str(run.created_at)]
        return header

    def failure_header(self, settings: Settings, run: WorkflowRun) -> HeaderMap:
        """The headers of a run's failure callback: its forwarded ones, the run's id and
        URL, never `Workflow-Sdk-Version` (the Python SDK would take it for a step) nor
        the `Content-Type` the SDKs forward (the body is the service's JSON, whose type
        the callback carries: two would read `application/json, application/json`)."""
        dropped = {self.names.name("Workflow-Sdk-Version").lower(), "content-type"}
        header = {
            name: values
            for name, values in (settings.failure_header or {}).items()
            if name.lower() not in dropped
        }
        header[self.names.workflow_run_id] = [run.run_id]
        header[self.names.name("Workflow-Url")] = [run.url]
        return header


def parse_batch(payload: object) -> list[Inbound]:
    """The items of a `POST /v2/batch` body; 400 for anything but a list of messages."""
    if not isinstance(payload, list) or not payload:
        raise BadRequest("the body must be a non-empty JSON array of messages")
    messages = []
    for index, item in enumerate(payload):
        where = f"item {index}"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object")
        destination = item.get("destination")
        if not isinstance(destination, str) or not is_http_url(destination):
            raise BadRequest(f"{where}: destination must be an absolute http(s) URL")
        raw_header = item.get("headers") or {}
        if not isinstance(raw_header, dict):
            raise BadRequest(f"{where}: headers must be an object")
        header: HeaderMap = {}
        for name, value in raw_header.items():
            if value is None:
                continue
            header.setdefault(canonical(str(name)), []).append(str(value))
        body = item.get("body")
        if body is not None and not isinstance(body, str):
            body = json.dumps(body, separators=(",", ":"))
        messages.append(Inbound(destination, header, (body or "").encode("utf-8")))
    return messages
