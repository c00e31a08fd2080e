"""The emulator itself: its state and the operations both of its APIs act through."""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from daemon.emulator.account import Account
from daemon.emulator.bulk import BulkQuery, select_batch
from daemon.emulator.config import EmulatorConfig
from daemon.emulator.delivery import Courier, Delivery, Message
from daemon.emulator.errors import BadRequest, NotFound
from daemon.emulator.faults import FaultBook
from daemon.emulator.headers import HeaderNames, as_lists, canonical, with_header
from daemon.emulator.journal import Journal
from daemon.emulator.outage import Outage
from daemon.emulator.overrides import Overrides, is_http_url
from daemon.emulator.ratelimit import Announce, BurstLimit, Counting, DailyBudget
from daemon.emulator.state import (
    DlqEntry,
    FailureFunctionState,
    Run,
    RunMode,
    SeedMessage,
    Store,
    WorkflowRef,
    build_entry,
    random_id,
)
from daemon.emulator.tasks import Background
from daemon.emulator.workflow import DEFAULT_RETRIES, Inbound, Protocol, Settings, Step, WorkflowRun

# The most messages one bulk delete takes out, as the SDKs' default `count` is.
MAX_DELETED = 100

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class PublishRequest(BaseModel):
    """A message to deliver now (`POST /_emulator/publish`): to `url`, or to every endpoint
    of the URL Group `topic`. The workflow fields make it a workflow run's message."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    topic: str | None = None
    body: str | None = None
    bodyBase64: str | None = None
    method: str = "POST"
    headers: dict[str, str | list[str]] = Field(default_factory=dict)
    maxRetries: int = Field(3, ge=0, le=100)
    callback: str | None = None
    failureCallback: str | None = None
    scheduleId: str | None = None
    queueName: str | None = None
    callerIP: str = "127.0.0.1"
    notBefore: int = 0
    labels: list[str] | None = None
    flowControlKey: str | None = None
    workflowRunId: str | None = None
    workflowUrl: str | None = None
    workflowCreatedAt: int | None = None

    @model_validator(mode="after")
    def _valid(self) -> PublishRequest:
        if (self.url is None) == (self.topic is None):
            raise ValueError("give url or topic, one of them")
        for name in ("url", "callback", "failureCallback"):
            value = getattr(self, name)
            if value is not None and not is_http_url(value):
                raise ValueError(f"{name} must be an absolute http(s) URL")
        if self.body is not None and self.bodyBase64 is not None:
            raise ValueError("give body or bodyBase64, not both")
        return self

    def body_bytes(self) -> bytes:
        if self.bodyBase64 is None:
            return (self.body or "").encode("utf-8")
        try:
            return base64.b64decode(self.bodyBase64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadRequest("bodyBase64 is not base64") from exc


class Emulator:
    """One emulated service account: DLQ, URL Groups, runs, journal, limits, faults, outage.

    Outbound requests (deliveries, callbacks) use `http_client` when given (its owner closes
    it), else a client of the emulator's own, made on first use and closed by `aclose`.
    """

    def __init__(
        self,
        config: EmulatorConfig,
        *,
        http_client: httpx.AsyncClient | None = None,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.config = config
        self.clock = clock
        self.sleep = sleep
        self.names = HeaderNames(config.header_prefix)
        self.protocol = Protocol(self.names)
        self.workflows: dict[str, WorkflowRun] = {}  # the runs of the workflow protocol
        self.account = self._new_account()
        self.store = Store()
        self.journal = Journal()
        self.limiter = BurstLimit(
            config.max_requests_per_second,
            counting=config.rate_limit_window,
            announce=config.rate_limit_headers,
        )
        self.daily = DailyBudget(config.max_requests_per_day)
        self.faults = FaultBook()
        self.outage = Outage()
        self.background = Background()
        self.rate_limited = 0
        # Refuse (400) a bulk call naming dlqIds not in the DLQ, as a stricter service
        # would; off, they are skipped silently.
        self.refuse_gone_dlq_ids = config.refuse_gone_dlq_ids
        self._given_client = http_client
        self._own_client: httpx.AsyncClient | None = None
        self.courier = Courier(
            config,
            client=self.http_client,
            dead_letter=self._dead_letter,
            failure_state=self._failure_state,
            spawn=self.background.spawn,
            sleep=sleep,
        )

    def _new_account(self) -> Account:
        return Account(
            username=self.config.username,
            token=self.config.token,
            password=self.config.password,
            created_at=self.clock(),
        )

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def max_requests_per_second(self) -> int | None:
        return self.limiter.limit

    @max_requests_per_second.setter
    def max_requests_per_second(self, limit: int | None) -> None:
        self.limiter.limit = limit

    @property
    def rate_limit_headers(self) -> Announce:
        return self.limiter.announce

    @rate_limit_headers.setter
    def rate_limit_headers(self, announce: Announce) -> None:
        self.limiter.announce = announce

    @property
    def rate_limit_window(self) -> Counting:
        return self.limiter.counting

    @rate_limit_window.setter
    def rate_limit_window(self, counting: Counting) -> None:
        self.limiter.counting = counting

    @property
    def max_requests_per_day(self) -> int | None:
        return self.daily.limit

    @max_requests_per_day.setter
    def max_requests_per_day(self, limit: int | None) -> None:
        self.daily.limit = limit

    def enforced_limits(self) -> dict[str, int | None]:
        """The account's limits the emulator enforces now; None: not enforced."""
        return {
            "max_requests_per_second": self.max_requests_per_second,
            "max_requests_per_day": self.max_requests_per_day,
        }

    def http_client(self) -> httpx.AsyncClient:
        if self._given_client is not None:
            return self._given_client
        if self._own_client is None:
            self._own_client = httpx.AsyncClient(timeout=self.config.delivery_timeout)
        return self._own_client

    async def aclose(self) -> None:
        """End background work and close the emulator's own client."""
        await self.background.cancel()
        if self._own_client is not None:
            await self._own_client.aclose()
            self._own_client = None

    async def reset(self) -> None:
        """Back to a fresh start with the same config (initial credentials and limit too)."""
        await self.background.cancel()
        self.store.clear()
        self.workflows.clear()
        self.journal.clear()
        self.faults.clear()
        self.outage.clear()
        self.courier.clear()
        self.limiter.reset(
            self.config.max_requests_per_second,
            counting=self.config.rate_limit_window,
            announce=self.config.rate_limit_headers,
        )
        self.daily.reset(self.config.max_requests_per_day)
        self.rate_limited = 0
        self.refuse_gone_dlq_ids = self.config.refuse_gone_dlq_ids
        self.account = self._new_account()

    def stats(self) -> dict[str, int]:
        return {
            "rate_limited": self.rate_limited,
            "daily_used": self.daily.used,
            "max_requests_in_window": self.limiter.max_in_window,
            "calls": self.limiter.calls,
        }

    # The DLQ.

    def seed(self, seeds: list[SeedMessage]) -> list[DlqEntry]:
        """Put messages in the DLQ, all or none."""
        now = self.now_ms()
        entries = [
            build_entry(seed, seq=self.store.next_seq(), now_ms=now, names=self.names)
            for seed in seeds
        ]
        seen = set(self.store.dlq)
        for entry in entries:
            if entry.dlq_id in seen:
                raise BadRequest(f"dlqId {entry.dlq_id} is already in the DLQ")
            seen.add(entry.dlq_id)
        for entry in entries:
            self.store.add(entry)
        return entries

    def dlq_message(self, dlq_id: str) -> DlqEntry:
        entry = self.store.dlq.get(dlq_id)
        if entry is None:
            raise NotFound(f"message {dlq_id} not found in the DLQ")
        return entry

    def _dead_letter(self, seed: SeedMessage) -> DlqEntry:
        [entry] = self.seed([seed])
        run = self.workflows.get(seed.workflowRunId or "")
        if run is not None and run.status == "running":
            run.status = "failed"
        return entry

    def _failure_state(self, dlq_id: str, state: FailureFunctionState) -> None:
        """Record how a dead letter's failure function took its callback (if still there)."""
        entry = self.store.dlq.get(dlq_id)
        if entry is not None and entry.workflow is not None:
            workflow = replace(entry.workflow, failure_function_state=state)
            self.store.dlq[dlq_id] = replace(entry, workflow=workflow)

    def delete(self, dlq_id: str) -> None:
        """Take one message out of the DLQ (QStash's `DELETE /v2/dlq/{dlqId}`)."""
        self.dlq_message(dlq_id)  # 404 when it is not there
        del self.store.dlq[dlq_id]

    def delete_selected(self, query: BulkQuery) -> tuple[int, str]:
        """Take a page of the selected messages out of the DLQ (QStash's bulk delete): how
        many, and the cursor of the rest ("" when none is left). Ids named are all taken."""
        page = max(MAX_DELETED, len(query.dlq_ids))
        batch = select_batch(
            self.store.entries(), query, newest_seq=self.store.last_seq, page_size=page
        )
        for entry in batch.entries:
            del self.store.dlq[entry.dlq_id]
        return len(batch.entries), batch.cursor

    # Resume and restart.

    def recover(
        self, mode: RunMode, query: BulkQuery, overrides: Overrides
    ) -> tuple[list[Run], str]:
        """Take the selected entries out of the DLQ and start a new run for each.

        No await in here: two concurrent bulk calls can never take the same entry. With
        `refuse_gone_dlq_ids`, a call naming a dlqId that is not in the DLQ is refused
        (400) and changes nothing.
        """
        if self.refuse_gone_dlq_ids:
            gone = [dlq_id for dlq_id in query.dlq_ids if dlq_id not in self.store.dlq]
            if gone:
                raise BadRequest(f"dlqIds not in the DLQ: {', '.join(gone[:10])}")
        batch = select_batch(self.store.entries(), query, newest_seq=self.store.last_seq)
        now = self.now_ms()
        runs = [self._start_run(entry, mode, overrides, now) for entry in batch.entries]
        return runs, batch.cursor

    def recover_one(self, mode: RunMode, dlq_id: str, overrides: Overrides) -> Run:
        """Resume or restart the workflow run of one DLQ message (QStash's single routes):
        404 when it is not in the DLQ, 400 when it is not a workflow run's."""
        entry = self.dlq_message(dlq_id)
        if entry.workflow is None:
            raise BadRequest(f"message {dlq_id} is not a workflow run's: nothing to {mode}")
        return self._start_run(entry, mode, overrides, self.now_ms())

    def _start_run(self, entry: DlqEntry, mode: RunMode, overrides: Overrides, now: int) -> Run:
        del self.store.dlq[entry.dlq_id]
        source = self._protocol_run(entry)
        if source is None:
            run, message = self._new_run(entry, mode, overrides, now)
        else:
            run, message = self._continue_run(source, entry, mode, overrides, now)
        delivery = self.courier.register(message)
        run.delivery_id = delivery.id
        self.store.runs.append(run)
        if self.config.execute_runs:
            self.background.spawn(self._execute(run, delivery), f"run {run.workflow_run_id}")
        return run

    def _new_run(
        self, entry: DlqEntry, mode: RunMode, overrides: Overrides, now: int
    ) -> tuple[Run, Message]:
        # Both modes give the run a new id, as the service does; restart vs resume only
        # matters to the workflow's own steps, which the emulator does not model.
        assert entry.workflow is not None  # only workflow entries are resumed or restarted
        retries = overrides.retries
        run = Run(
            workflow_run_id="wfr_" + random_id(),
            workflow_created_at=now,
            mode=mode,
            source_dlq_id=entry.dlq_id,
            previous_workflow_run_id=entry.workflow.run_id,
            workflow_url=entry.workflow.url,
            overrides=overrides,
            retries=int(entry.message["maxRetries"]) if retries is None else retries,
            failure_callback=overrides.failure_callback or entry.message.get("failureCallback"),
            labels=entry.labels if overrides.labels is None else overrides.labels,
            delay_seconds=overrides.delay_seconds,
        )
        flow_control_key = overrides.flow_control_key or entry.flow_control_key
        header = with_header(entry.header, self.names.workflow_run_id, run.workflow_run_id)
        header = with_header(header, self.names.label, ",".join(run.labels) or None)
        header = with_header(header, self.names.flow_control_key, flow_control_key)
        message = Message(
            message_id="msg_" + random_id(),
            url=run.workflow_url,
            method=str(entry.message["method"]) or "POST",
            header=header,
            body=entry.body,
            max_retries=run.retries,
            created_at=now,
            caller_ip=entry.caller_ip,
            not_before=now + int(run.delay_seconds * 1000) if run.delay_seconds else 0,
            callback=entry.message.get("callback"),
            failure_callback=run.failure_callback,
            workflow=WorkflowRef(run.workflow_run_id, run.workflow_url, run.workflow_created_at),
            labels=run.labels or None,
            flow_control_key=flow_control_key,
            retry_delay=overrides.retry_delay,
        )
        return run, message

    def _protocol_run(self, entry: DlqEntry) -> WorkflowRun | None:
        """The protocol run whose step `entry` is, or None (a seeded or plain entry)."""
        if entry.workflow is None:
            return None
        run = self.workflows.get(entry.workflow.run_id)
        if run is None or run.index_of(str(entry.message["messageId"])) is None:
            return None
        return run

    def _continue_run(
        self, source: WorkflowRun, entry: DlqEntry, mode: RunMode, overrides: Overrides, now: int
    ) -> tuple[Run, Message]:
        """A new protocol run from a dead letter of `source`: for resume, its history up to
        the failed step, which is delivered again; for restart, its initial payload only."""
        failed = source.index_of(str(entry.message["messageId"]))
        upto = failed if mode == "resume" and failed is not None else 0
        history = list(source.history[: upto + 1])
        history[upto] = replace(history[upto], message_id="msg_" + random_id())
        new = WorkflowRun(
            run_id="wfr_" + random_id(),
            url=source.url,
            created_at=now,
            settings=source.settings,
            history=history,
            overrides=Settings.of_overrides(overrides),
            source_dlq_id=entry.dlq_id,
        )
        self.workflows[new.run_id] = new
        message = self._step_message(new, upto)
        run = Run(
            workflow_run_id=new.run_id,
            workflow_created_at=now,
            mode=mode,
            source_dlq_id=entry.dlq_id,
            previous_workflow_run_id=source.run_id,
            workflow_url=new.url,
            overrides=overrides,
            retries=message.max_retries,
            failure_callback=message.failure_callback,
            labels=message.labels or (),
            delay_seconds=overrides.delay_seconds,
        )
        return run, message

    async def _execute(self, run: Run, delivery: Delivery) -> None:
        if run.delay_seconds > 0:
            await self.sleep(min(run.delay_seconds, self.config.max_delay_seconds))
        run.status = "delivering"
        await self.courier.deliver(delivery)
        run.status = "succeeded" if delivery.state == "delivered" else "failed"
        run.result_dlq_id = delivery.dlq_id

    # The workflow protocol: messages published by apps (`/v2/batch`, `/v2/publish`).

    def accept(self, messages: list[Inbound]) -> list[dict[str, Any]]:
        """Take published messages and start their deliveries; the answer of each. The
        headers of all are checked first: a malformed one (400) takes none of them."""
        waits = []
        for message in messages:
            self.protocol.settings(message.header)
            waits.append(self.protocol.wait_seconds(message.header, self.clock()))
        return [self._accept(message, wait) for message, wait in zip(messages, waits, strict=True)]

    def _accept(self, message: Inbound, wait: float) -> dict[str, Any]:
        run_id = self.protocol.run_id(message)
        message_id = "msg_" + random_id()
        answer = {"messageId": message_id, "url": message.destination, "deduplicated": False}
        step = Step(message_id, message.destination, message.header, message.body)
        if run_id is None:
            self._deliver(self._plain_message(step), wait)
            return answer
        run = self.workflows.get(run_id)
        if self.protocol.is_init(message):
            if run is not None:  # the SDKs read this as "the run already exists"
                return {**answer, "deduplicated": True}
            url = self.protocol.get(message.header, "Workflow-Url") or message.destination
            settings = self.protocol.settings(message.header)
            run = WorkflowRun(run_id, url, self.now_ms(), settings, [step])
            self.workflows[run_id] = run
        elif run is None or run.status != "running":
            # The SDKs take a 400 for "the run has ended or was cancelled".
            state = "not found" if run is None else run.status
            raise BadRequest(f"workflow run {run_id} is {state}")
        else:
            run.history.append(step)
        self._deliver(self._step_message(run, len(run.history) - 1), wait)
        return answer

    def end_run(self, run_id: str, *, cancel: bool) -> None:
        """The SDK's end of a run (`DELETE /v2/workflows/runs/{id}`); 404 for an unknown one."""
        run = self.workflows.get(run_id)
        if run is None:
            raise NotFound(f"workflow run {run_id} not found")
        if run.status == "running":
            run.status = "cancelled" if cancel else "completed"

    def _plain_message(self, step: Step) -> Message:
        inbound = Inbound(step.destination, step.header, step.body)
        settings = self.protocol.settings(step.header)
        return Message(
            message_id=step.message_id,
            url=step.destination,
            method=self.protocol.get(step.header, "Method") or "POST",
            header=self.protocol.delivery_header(inbound, None),
            body=step.body,
            max_retries=DEFAULT_RETRIES if settings.retries is None else settings.retries,
            created_at=self.now_ms(),
            caller_ip="127.0.0.1",
            callback=self.protocol.get(step.header, "Callback"),
            failure_callback=settings.failure_callback,
            failure_header=settings.failure_header or {},
            labels=settings.labels or None,
            flow_control_key=settings.flow_control_key,
            retry_delay=settings.retry_delay,
        )

    def _step_message(self, run: WorkflowRun, index: int) -> Message:
        """The delivery of history entry `index` of `run`: the history up to it as body,
        with the overrides over the step's own settings over the run's."""
        step = run.history[index]
        settings = run.overrides.over(self.protocol.settings(step.header).over(run.settings))
        inbound = Inbound(step.destination, step.header, step.body)
        header = self.protocol.delivery_header(inbound, run)
        if settings.labels:
            header[self.names.label] = [",".join(settings.labels)]
        return Message(
            message_id=step.message_id,
            url=step.destination,
            method=self.protocol.get(step.header, "Method") or "POST",
            header=header,
            body=run.history_body(index),
            max_retries=DEFAULT_RETRIES if settings.retries is None else settings.retries,
            created_at=self.now_ms(),
            caller_ip="127.0.0.1",
            failure_callback=settings.failure_callback,
            workflow=WorkflowRef(run.run_id, run.url, run.created_at),
            labels=settings.labels or None,
            flow_control_key=settings.flow_control_key,
            retry_delay=settings.retry_delay,
            step_body=step.body,
            initial_body=run.initial_body,
            failure_header=self.protocol.failure_header(settings, run),
        )

    def _deliver(self, message: Message, wait: float) -> None:
        delivery = self.courier.register(message)

        async def later() -> None:
            if wait > 0:  # capped, as the delays of resumed runs are
                await self.sleep(min(wait, self.config.max_delay_seconds))
            await self.courier.deliver(delivery)

        self.background.spawn(later(), f"deliver {delivery.id}")

    # Publishing.

    def publish(self, request: PublishRequest) -> list[tuple[Delivery, asyncio.Task[None]]]:
        """Start delivering a message; one delivery per destination."""
        started = []
        for message in self._messages(request):
            delivery = self.courier.register(message)
            task = self.background.spawn(self.courier.deliver(delivery), f"deliver {delivery.id}")
            started.append((delivery, task))
        return started

    def _messages(self, request: PublishRequest) -> list[Message]:
        destinations: list[tuple[str, str | None, str | None]]
        if request.topic is not None:
            group = self.store.group(request.topic)
            destinations = [(e.url, request.topic, e.name) for e in group.endpoints]
        else:
            assert request.url is not None  # PublishRequest saw to it
            destinations = [(request.url, None, None)]
        now = self.now_ms()
        header = {canonical(name): values for name, values in as_lists(request.headers).items()}
        workflow = None
        if request.workflowRunId:
            header = with_header(header, self.names.workflow_run_id, request.workflowRunId)
            workflow = WorkflowRef(
                run_id=request.workflowRunId,
                url=request.workflowUrl or request.url or destinations[0][0],
                created_at=request.workflowCreatedAt or now,
            )
        if request.labels:
            header = with_header(header, self.names.label, ",".join(request.labels))
        if request.flowControlKey:
            header = with_header(header, self.names.flow_control_key, request.flowControlKey)
        common: dict[str, Any] = {
            "method": request.method.upper(),
            "header": header,
            "body": request.body_bytes(),
            "max_retries": request.maxRetries,
            "created_at": now,
            "caller_ip": request.callerIP,
            "not_before": request.notBefore,
            "callback": request.callback,
            "failure_callback": request.failureCallback,
            "schedule_id": request.scheduleId,
            "queue_name": request.queueName,
            "workflow": workflow,
            "labels": tuple(request.labels) if request.labels else None,
            "flow_control_key": request.flowControlKey,
        }
        return [
            Message(
                message_id="msg_" + random_id(),
                url=url,
                topic_name=topic,
                endpoint_name=endpoint,
                **common,
            )
            for url, topic, endpoint in destinations
        ]
