"""The control API under `/_emulator/`: seed state, read back what happened, inject faults.

No auth and no rate limit: it is for tests and local development, never to be exposed.
Lists are answered as plain JSON arrays.

* `POST /_emulator/dlq` `{"messages": [SeedMessage, ...]}` -> `{"dlqIds": [...]}`. Seeds DLQ
  entries (fields of spec 2.1 with defaults, plus `labels`, `flowControlKey`, `workflowRunId`,
  `workflowUrl`, `workflowCreatedAt`, `failureFunctionState`; see `state.SeedMessage`).
* `GET /_emulator/dlq` -> `[message, ...]`: the DLQ in order, each as seeded (wire form plus
  the workflow fields).
* `POST /_emulator/url-groups` `{"name", "endpoints": [{"name"?, "url"}]}` -> the group;
  creates or replaces it. `GET /_emulator/url-groups` -> `[group, ...]`.
* `GET /_emulator/journal` -> `[{"method", "path", "query": [[k, v]], "headers", "status",
  "at", "body"?, "fault"?}, ...]`: every service call in the order answered; credentials
  redacted. `DELETE /_emulator/journal` clears it.
* `GET /_emulator/runs` -> `[run, ...]`: runs made by resume/restart (`workflowRunId`,
  `workflowCreatedAt`, `mode`, `sourceDlqId`, `previousWorkflowRunId`, `workflowUrl`,
  `overrides`, `rawHeaders`, `retries`, `failureCallback`, `labels`, `delaySeconds`,
  `status` pending|delivering|succeeded|failed, `deliveryId`, `resultDlqId`).
* `GET /_emulator/workflows` -> `[run, ...]`: the runs of the workflow protocol, started by
  an Init message or by resume/restart (`workflowRunId`, `workflowUrl`,
  `workflowCreatedAt`, `status` running|completed|cancelled|failed, `steps` taken,
  `sourceDlqId`).
* `POST /_emulator/faults` `FaultSpec` -> the armed faults; `GET` lists them; `DELETE` clears.
  `{"kind", "times": 1, "paths": [], ...}`, kinds `status` (`status`: 503, `retryAfter`?),
  `latency` (`seconds`: 0.5), `drop`, `rate_limit` (`limit`?, `retryAfter`?, `headers`: true;
  false sends no `Burst-RateLimit-*` header at all), `malformed`, `corrupt_gzip`
  (`carriedOut`: true), `lost_answer` (`status`, or `reset`: true; see
  `faults.FaultSpec`). A `corrupt_gzip` or `lost_answer` call is journaled with
  `"carriedOut"`: whether the service acted on it.
* `POST /_emulator/outage` `{"mode": "503"|"drop"|"hang" = "503", "seconds"?: S,
  "retryAfter"?: S}` -> the outage: every service call (account endpoint included) is
  answered 503 `{"error"}`, or has its connection closed without an answer (httpx:
  `RemoteProtocolError`), or is held unanswered until the outage ends, then dropped (a
  client with a timeout times out). For `seconds` of the emulator clock, else until
  `DELETE /_emulator/outage`; a new POST replaces the outage in force. Nothing behind the
  outage sees those calls (no DLQ change, no rate-limit count, no fault used up); they
  are journaled with `"outage": mode` and status 503, or 0 when dropped or held.
  `GET`/`DELETE` -> `{"active", "mode", "seconds", "remaining", "retryAfter", "calls",
  "held"}`: `calls` met by the outage switched on last, `held` being held right now.
* `GET /_emulator/account` / `POST /_emulator/account` `{"max_requests_per_second"?: N|null,
  "max_requests_per_day"?: N|null, "rate_limit_headers"?: "always"|"on_429",
  "rate_limit_window"?: "fixed"|"sliding"}` (a field left out is kept; null lifts the
  limit; `on_429`: only a 429 carries `Burst-RateLimit-*`; `sliding`: the per-second
  limit counts the second before each arrival, not fixed windows) ->
  `{"max_requests_per_second", "max_requests_per_day", "rate_limit_headers",
  "rate_limit_window", "username", "rotations"}` (never a credential).
* `GET /_emulator/behaviour` / `POST /_emulator/behaviour` `{"refuseGoneDlqIds"?: bool}`
  -> `{"refuseGoneDlqIds"}`: whether a bulk resume/restart naming a dlqId that is not in
  the DLQ is refused with 400 (a stricter service than QStash) rather than the dlqId
  skipped silently (the default, `EmulatorConfig.refuse_gone_dlq_ids`).
* `GET /_emulator/stats` -> `{"rate_limited", "daily_used", "max_requests_in_window",
  "calls"}`: 429s sent, calls spent of today's budget, most rate-limited calls that arrived
  in one window, and those calls in all.
* `POST /_emulator/publish[?wait=true&timeout=S]` `PublishRequest` -> `{"messageId",
  "deliveries": [id, ...]}` at once (`messageId` is the first delivery's; a URL Group gets one
  message per endpoint); with `wait`, once every delivery is final, plus `"outcomes":
  [delivery, ...]` (state, attempts, lastStatus, dlqId...).
* `GET /_emulator/deliveries` -> `[delivery, ...]`; `GET /_emulator/callbacks` ->
  `[{"id", "kind" failure|callback, "url", "messageId", "dlqId", "state", "attempts",
  "status"}, ...]`.
* `POST /_emulator/idle[?timeout=S]` -> `{"idle": true}` once no delivery, run or callback is
  in flight; 503 `{"error"}` after the timeout (default 10 s).
* `POST /_emulator/reset` -> `{}`: everything cleared (outage too), back to the config's
  credentials.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from daemon.emulator.emulator import Emulator, PublishRequest
from daemon.emulator.errors import error_response
from daemon.emulator.faults import FaultSpec
from daemon.emulator.outage import OutageSpec
from daemon.emulator.ratelimit import Announce, Counting
from daemon.emulator.service_api import get_emulator
from daemon.emulator.state import Endpoint, EndpointRef, SeedMessage, parse_endpoint_refs

EmulatorDep = Annotated[Emulator, Depends(get_emulator)]
# Seconds to wait, as `?timeout=`.
WaitSeconds = Annotated[float, Query(alias="timeout", gt=0, le=300)]

control = APIRouter(prefix="/_emulator")


class SeedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[SeedMessage]


class GroupRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    endpoints: list[dict[str, Any]] = Field(min_length=1)


class AccountSettings(BaseModel):
    """The limits to enforce from now on; a field left out keeps its value, null lifts it."""

    model_config = ConfigDict(extra="forbid")
    max_requests_per_second: int | None = Field(None, ge=1)
    max_requests_per_day: int | None = Field(None, ge=1)
    rate_limit_headers: Announce = "always"
    rate_limit_window: Counting = "fixed"


@control.post("/dlq")
async def seed_dlq(body: SeedRequest, emulator: EmulatorDep) -> JSONResponse:
    entries = emulator.seed(body.messages)
    return JSONResponse({"dlqIds": [entry.dlq_id for entry in entries]})


@control.get("/dlq")
async def list_dlq(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse([entry.to_seed() for entry in emulator.store.entries()])


@control.post("/url-groups")
async def put_url_group(body: GroupRequest, emulator: EmulatorDep) -> JSONResponse:
    refs = parse_endpoint_refs({"endpoints": body.endpoints}, url_required=True)
    group = emulator.store.put_group(body.name, _endpoints(refs), emulator.now_ms())
    return JSONResponse(group.to_json())


def _endpoints(refs: list[EndpointRef]) -> list[Endpoint]:
    return [Endpoint(url=ref.url or "", name=ref.name) for ref in refs]


@control.get("/url-groups")
async def list_url_groups(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse([group.to_json() for group in emulator.store.groups.values()])


@control.get("/journal")
async def read_journal(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse(emulator.journal.to_json())


@control.delete("/journal")
async def clear_journal(emulator: EmulatorDep) -> JSONResponse:
    emulator.journal.clear()
    return JSONResponse({})


@control.get("/runs")
async def list_runs(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse([run.to_json() for run in emulator.store.runs])


@control.get("/workflows")
async def list_workflow_runs(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse([run.to_json() for run in emulator.workflows.values()])


@control.post("/faults")
async def add_fault(fault: FaultSpec, emulator: EmulatorDep) -> JSONResponse:
    emulator.faults.add(fault)
    return JSONResponse(emulator.faults.to_json())


@control.get("/faults")
async def list_faults(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse(emulator.faults.to_json())


@control.delete("/faults")
async def clear_faults(emulator: EmulatorDep) -> JSONResponse:
    emulator.faults.clear()
    return JSONResponse({})


@control.post("/outage")
async def start_outage(outage: OutageSpec, emulator: EmulatorDep) -> JSONResponse:
    emulator.outage.start(outage, emulator.clock())
    return JSONResponse(emulator.outage.to_json(emulator.clock()))


@control.get("/outage")
async def read_outage(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse(emulator.outage.to_json(emulator.clock()))


@control.delete("/outage")
async def end_outage(emulator: EmulatorDep) -> JSONResponse:
    emulator.outage.end()
    return JSONResponse(emulator.outage.to_json(emulator.clock()))


def _account_settings(emulator: Emulator) -> dict[str, Any]:
    return {
        **emulator.enforced_limits(),
        "rate_limit_headers": emulator.rate_limit_headers,
        "rate_limit_window": emulator.rate_limit_window,
        "username": emulator.account.username,
        "rotations": emulator.account.rotations,
    }


@control.get("/account")
async def read_account(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse(_account_settings(emulator))


@control.post("/account")
async def set_account(body: AccountSettings, emulator: EmulatorDep) -> JSONResponse:
    for name in body.model_fields_set:
        setattr(emulator, name, getattr(body, name))
    return JSONResponse(_account_settings(emulator))


class Behaviour(BaseModel):
    """How strict the service is; a field left out keeps its value."""

    model_config = ConfigDict(extra="forbid")
    refuseGoneDlqIds: bool = False  # the control API spells it so


def _behaviour(emulator: Emulator) -> dict[str, Any]:
    return {"refuseGoneDlqIds": emulator.refuse_gone_dlq_ids}


@control.get("/behaviour")
async def read_behaviour(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse(_behaviour(emulator))


@control.post("/behaviour")
async def set_behaviour(body: Behaviour, emulator: EmulatorDep) -> JSONResponse:
    if "refuseGoneDlqIds" in body.model_fields_set:
        emulator.refuse_gone_dlq_ids = body.refuseGoneDlqIds
    return JSONResponse(_behaviour(emulator))


@control.get("/stats")
async def read_stats(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse(emulator.stats())


@control.post("/publish")
async def publish(
    body: PublishRequest, emulator: EmulatorDep, wait: bool = False, seconds: WaitSeconds = 30.0
) -> JSONResponse:
    started = emulator.publish(body)
    answer: dict[str, Any] = {
        "messageId": started[0][0].id if started else None,
        "deliveries": [delivery.id for delivery, _ in started],
    }
    if wait:
        tasks = [task for _, task in started]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=seconds)
            if pending:
                return error_response(503, f"deliveries still running after {seconds:g}s")
        answer["outcomes"] = [delivery.to_json() for delivery, _ in started]
    return JSONResponse(answer)


@control.get("/deliveries")
async def list_deliveries(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse([delivery.to_json() for delivery in emulator.courier.deliveries.values()])


@control.get("/callbacks")
async def list_callbacks(emulator: EmulatorDep) -> JSONResponse:
    return JSONResponse([record.to_json() for record in emulator.courier.callbacks])


@control.post("/idle")
async def wait_idle(emulator: EmulatorDep, seconds: WaitSeconds = 10.0) -> JSONResponse:
    try:
        async with asyncio.timeout(seconds):
            await emulator.background.idle()
    except TimeoutError:
        return error_response(503, f"still busy after {seconds:g}s")
    return JSONResponse({"idle": True})


@control.post("/reset")
async def reset(emulator: EmulatorDep) -> JSONResponse:
    await emulator.reset()
    return JSONResponse({})
