"""Real HTTP deliveries of messages, their retries, dead-lettering and signed callbacks."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from daemon.emulator.config import EmulatorConfig
from daemon.emulator.headers import HeaderMap, HeaderNames, first_value, header_map
from daemon.emulator.retry_delay import milliseconds
from daemon.emulator.signing import sign
from daemon.emulator.state import (
    DlqEntry,
    FailureFunctionState,
    SeedMessage,
    WorkflowRef,
    random_id,
)

DeliveryState = Literal["pending", "delivering", "delivered", "failed"]
CallbackKind = Literal["failure", "callback"]
Sleep = Callable[[float], Awaitable[None]]
Spawn = Callable[[Coroutine[Any, Any, object], str], object]


@dataclass(frozen=True)
class Message:
    """A message on its way to one destination (for a URL Group: one per endpoint)."""

    message_id: str
    url: str
    method: str
    header: HeaderMap
    body: bytes
    max_retries: int
    created_at: int
    caller_ip: str
    not_before: int = 0
    callback: str | None = None
    failure_callback: str | None = None
    schedule_id: str | None = None
    queue_name: str | None = None
    topic_name: str | None = None
    endpoint_name: str | None = None
    workflow: WorkflowRef | None = None
    labels: tuple[str, ...] | None = None
    flow_control_key: str | None = None
    retry_delay: str | None = None  # `Retry-Delay`: ms over `retried` (daemon.emulator.retry_delay)
    # A workflow step's delivery carries the run's history; the DLQ keeps the step's own
    # body, the failure callback's `sourceBody` is the run's initial payload, and the
    # callback carries the run's failure headers.
    step_body: bytes | None = None
    initial_body: bytes | None = None
    failure_header: HeaderMap = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """The answer to one attempt; status 0 when no answer came (connection error, timeout)."""

    status: int
    header: HeaderMap
    body: bytes
    error: str | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass
class Delivery:
    """One message's delivery, visible through the control API."""

    message: Message
    state: DeliveryState = "pending"
    attempts: int = 0
    last_status: int | None = None
    last_error: str | None = None
    dlq_id: str | None = None
    done: bool = False  # final: delivered, or dead-lettered with its failure callback sent

    @property
    def id(self) -> str:
        return self.message.message_id

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "messageId": self.message.message_id,
            "url": self.message.url,
            "topicName": self.message.topic_name,
            "endpointName": self.message.endpoint_name,
            "workflowRunId": self.message.workflow.run_id if self.message.workflow else None,
            "state": self.state,
            "attempts": self.attempts,
            "lastStatus": self.last_status,
            "lastError": self.last_error,
            "dlqId": self.dlq_id,
            "done": self.done,
        }


@dataclass
class CallbackRecord:
    """A callback (or failure callback) sent by the emulator, and how its attempts went."""

    kind: CallbackKind
    url: str
    message_id: str
    dlq_id: str | None
    id: str = field(default_factory=lambda: "cb_" + random_id())
    state: Literal["sending", "delivered", "failed"] = "sending"
    attempts: int = 0
    status: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "url": self.url,
            "messageId": self.message_id,
            "dlqId": self.dlq_id,
            "state": self.state,
            "attempts": self.attempts,
            "status": self.status,
        }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _body_fields(data: bytes, text_key: str, base64_key: str) -> dict[str, str]:
    """A body as the DLQ holds it: as text when it is UTF-8, else base64; left out if empty."""
    if not data:
        return {}
    try:
        return {text_key: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {base64_key: _b64(data)}


def dead_letter_seed(message: Message, outcome: Outcome) -> SeedMessage:
    """The DLQ message for a delivery that ran out of retries, with its last answer."""
    workflow = message.workflow
    fields: dict[str, Any] = {
        "messageId": message.message_id,
        "topicName": message.topic_name,
        "endpointName": message.endpoint_name,
        "url": message.url,
        "method": message.method,
        "header": message.header or None,
        **_body_fields(
            message.body if message.step_body is None else message.step_body, "body", "bodyBase64"
        ),
        "maxRetries": message.max_retries,
        "notBefore": message.not_before,
        "createdAt": message.created_at,
        "callback": message.callback,
        "failureCallback": message.failure_callback,
        "scheduleId": message.schedule_id,
        "callerIP": message.caller_ip,
        "queueName": message.queue_name,
        "responseStatus": outcome.status,
        "responseHeader": outcome.header or None,
        **_body_fields(outcome.body, "responseBody", "responseBodyBase64"),
        "labels": list(message.labels) if message.labels else None,
        "flowControlKey": message.flow_control_key,
        "workflowRunId": workflow.run_id if workflow else None,
        "workflowUrl": workflow.url if workflow else None,
        "workflowCreatedAt": workflow.created_at if workflow else None,
    }
    return SeedMessage.model_validate(fields)


def callback_body(
    message: Message, outcome: Outcome, *, retried: int, dlq_id: str | None
) -> dict[str, Any]:
    """The JSON of a (failure) callback, in QStash's shape (see samples/failure-callback*)."""
    body: dict[str, Any] = {
        "status": outcome.status,
        "header": outcome.header,
        "body": _b64(outcome.body),
        "retried": retried,
        "maxRetries": message.max_retries,
    }
    if dlq_id is not None:
        body["dlqId"] = dlq_id
    body["sourceMessageId"] = message.message_id
    optional = {"topicName": message.topic_name, "endpointName": message.endpoint_name}
    body.update({key: value for key, value in optional.items() if value is not None})
    body.update(
        url=message.url,
        method=message.method,
        sourceHeader=message.header,
        sourceBody=_b64(message.body if message.initial_body is None else message.initial_body),
        notBefore=message.not_before,
        createdAt=message.created_at,
    )
    if message.schedule_id is not None:
        body["scheduleId"] = message.schedule_id
    body["callerIP"] = message.caller_ip
    if message.workflow is not None:
        body["workflowRunId"] = message.workflow.run_id
        body["workflowCreatedAt"] = message.workflow.created_at
    return body


class Courier:
    """Sends messages and callbacks over real HTTP with the outbound client.

    Every request the service sends is signed with the current signing key. JWT times come
    from the wall clock, not the injected one: the receiver checks them against its own.
    """

    def __init__(
        self,
        config: EmulatorConfig,
        *,
        client: Callable[[], httpx.AsyncClient],
        dead_letter: Callable[[SeedMessage], DlqEntry],
        failure_state: Callable[[str, FailureFunctionState], None],
        spawn: Spawn,
        sleep: Sleep,
    ) -> None:
        self._config = config
        self._names = HeaderNames(config.header_prefix)
        self._client = client
        self._dead_letter = dead_letter
        self._failure_state = failure_state
        self._spawn = spawn
        self._sleep = sleep
        self.deliveries: dict[str, Delivery] = {}
        self.callbacks: list[CallbackRecord] = []

    def clear(self) -> None:
        self.deliveries.clear()
        self.callbacks.clear()

    def register(self, message: Message) -> Delivery:
        delivery = Delivery(message)
        self.deliveries[delivery.id] = delivery
        return delivery

    async def deliver(self, delivery: Delivery) -> None:
        """Attempt 1 + maxRetries times; when all fail, dead-letter and send the failure
        callback. Retries back off as delivery_retry_delay * 2**n."""
        message = delivery.message
        delivery.state = "delivering"
        outcome = Outcome(0, {}, b"", "not attempted")
        for retried in range(message.max_retries + 1):
            if retried:
                await self._sleep(self._retry_wait(message, outcome, retried))
            outcome = await self._attempt(message, retried)
            delivery.attempts += 1
            delivery.last_status, delivery.last_error = outcome.status, outcome.error
            if message.callback is not None:
                payload = callback_body(message, outcome, retried=retried, dlq_id=None)
                sending = self.send_callback("callback", message.callback, message, payload)
                self._spawn(sending, "callback")
            if outcome.ok:
                delivery.state, delivery.done = "delivered", True
                return
            if self._non_retryable(outcome):
                break
        entry = self._dead_letter(dead_letter_seed(message, outcome))
        delivery.state, delivery.dlq_id = "failed", entry.dlq_id
        retried = delivery.attempts - 1
        payload = callback_body(message, outcome, retried=retried, dlq_id=entry.dlq_id)
        extra = [(name, value) for name, vals in message.failure_header.items() for value in vals]
        failure_calls: list[Coroutine[Any, Any, object]] = []
        if message.failure_callback is not None:
            url = message.failure_callback
            failure_calls.append(self._failure_function(url, message, payload, extra))
        copy = self._config.failure_callback_copy
        if message.workflow is not None and copy is not None:
            # A run has one failure URL, usually the app's failure function; recoveryd
            # hears of the failure through this copy (docs/emulator.md, "Workflow runs").
            failure_calls.append(self.send_callback("failure", copy, message, payload))
        await asyncio.gather(*failure_calls)
        delivery.done = True

    async def _failure_function(
        self, url: str, message: Message, payload: dict[str, Any], extra: list[tuple[str, str]]
    ) -> None:
        """The failure callback; for a workflow run's dead letter its outcome becomes the
        entry's failureFunctionState, as the service's listings show it."""
        dlq_id = str(payload["dlqId"])
        if message.workflow is not None:
            self._failure_state(dlq_id, "CALLBACK_INPROGRESS")
        record = await self.send_callback("failure", url, message, payload, extra)
        if message.workflow is not None:
            delivered = record.state == "delivered"
            self._failure_state(dlq_id, "CALLBACK_SUCCESS" if delivered else "CALLBACK_FAIL")

    def _non_retryable(self, outcome: Outcome) -> bool:
        """A 489 with `<Prefix>-NonRetryable-Error: true`: the app says retrying is futile."""
        flag = first_value(outcome.header, self._names.name("NonRetryable-Error"))
        return outcome.status == 489 and (flag or "").lower() == "true"

    def _retry_wait(self, message: Message, outcome: Outcome, retried: int) -> float:
        """Seconds before attempt `retried`: a 429's `Retry-After` (seconds) as the app
        asked; else the message's `Retry-Delay` (capped at max_delay_seconds, as delays
        are); else the emulator's short backoff, delivery_retry_delay * 2**n."""
        retry_after = first_value(outcome.header, "Retry-After")
        if outcome.status == 429 and retry_after is not None and retry_after.strip().isdecimal():
            return float(retry_after.strip())
        if message.retry_delay is not None:
            delay = milliseconds(message.retry_delay, retried - 1)
            if delay is not None:
                return min(max(delay, 0.0) / 1000, self._config.max_delay_seconds)
        return float(self._config.delivery_retry_delay * 2 ** (retried - 1))

    async def _attempt(self, message: Message, retried: int) -> Outcome:
        headers = [(name, value) for name, values in message.header.items() for value in values]
        headers += [
            (self._names.message_id, message.message_id),
            (self._names.retried, str(retried)),
            (self._names.signature, self._signature(message.body, message.url)),
        ]
        return await self._send(message.method, message.url, headers, message.body)

    async def send_callback(
        self,
        kind: CallbackKind,
        url: str,
        message: Message,
        payload: dict[str, Any],
        extra: list[tuple[str, str]] | None = None,
    ) -> CallbackRecord:
        """POST a signed JSON callback, retried with the delivery backoff until a 2xx;
        its record."""
        record = CallbackRecord(kind, url, message.message_id, payload.get("dlqId"))
        self.callbacks.append(record)
        raw = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        for attempt in range(self._config.callback_retries + 1):
            if attempt:
                await self._sleep(self._config.delivery_retry_delay * 2 ** (attempt - 1))
            headers = [
                *(extra or []),
                ("Content-Type", "application/json"),
                (self._names.signature, self._signature(raw, url)),
            ]
            outcome = await self._send("POST", url, headers, raw)
            record.attempts, record.status = record.attempts + 1, outcome.status
            if outcome.ok:
                record.state = "delivered"
                return record
        record.state = "failed"
        return record

    def _signature(self, body: bytes, url: str) -> str:
        return sign(
            body,
            url=url,
            key=self._config.signing_key_current,
            issuer=self._config.header_prefix,
            now=time.time(),
        )

    async def _send(
        self, method: str, url: str, headers: list[tuple[str, str]], body: bytes
    ) -> Outcome:
        try:
            response = await self._client().request(
                method, url, headers=headers, content=body, timeout=self._config.delivery_timeout
            )
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return Outcome(0, {}, b"", type(exc).__name__)
        header = header_map(response.headers.multi_items())
        return Outcome(response.status_code, header, response.content)
