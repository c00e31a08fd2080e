"""The service API as the spec shows it (4.1-4.7), plus QStash's read and add of URL Groups.

Choices where the spec says "not shown", following QStash:

* errors are `{"error": "<message>"}`; a missing or wrong credential is a 401;
* removing endpoints answers 200 with an empty body, as QStash does; endpoints named in the
  request that are not in the group are ignored; a request item matches an endpoint by its
  name or by its url;
* adding endpoints (QStash) creates the group when it is missing and replaces an endpoint
  with the same name or url; 200 with an empty body;
* the bulk calls ignore any request body; see `bulk` for how filters combine;
* QStash's listing of failed workflow runs (`GET /v2/workflows/dlq`) takes the bulk
  calls' filters; see `listing`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from daemon.emulator.account import parse_basic, parse_bearer
from daemon.emulator.bulk import parse_bulk_query
from daemon.emulator.emulator import Emulator
from daemon.emulator.errors import BadRequest, Unauthorized
from daemon.emulator.gate import ACCOUNT_PATH
from daemon.emulator.listing import list_page, parse_list_query
from daemon.emulator.overrides import parse_overrides
from daemon.emulator.state import RunMode, parse_endpoint_refs


def get_emulator(request: Request) -> Emulator:
    emulator: Emulator = request.app.state.emulator
    return emulator


EmulatorDep = Annotated[Emulator, Depends(get_emulator)]


def require_token(request: Request, emulator: EmulatorDep) -> None:
    """Bearer auth of the message operations (spec 5)."""
    token = parse_bearer(request.headers.get("authorization", ""))
    if token is None:
        raise Unauthorized("missing bearer token")
    if not emulator.account.token_is(token):
        raise Unauthorized("invalid token")


messages = APIRouter(prefix="/v2", dependencies=[Depends(require_token)])
account = APIRouter()


@messages.get("/dlq/{dlq_id}")
async def get_dlq_message(dlq_id: str, emulator: EmulatorDep) -> JSONResponse:
    """4.1: the DLQ message, or 404 once it has left the DLQ."""
    return JSONResponse(emulator.dlq_message(dlq_id).to_wire())


@messages.get("/topics/{name}")
async def get_url_group(name: str, emulator: EmulatorDep) -> JSONResponse:
    """QStash's read of a URL Group: name, createdAt, updatedAt, endpoints."""
    return JSONResponse(emulator.store.group(name).to_json())


@messages.post("/topics/{name}/endpoints")
async def add_endpoints(name: str, request: Request, emulator: EmulatorDep) -> Response:
    """QStash's add: each item needs a url; the group is created when missing."""
    refs = parse_endpoint_refs(await _json_body(request), url_required=True)
    emulator.store.add_endpoints(name, refs, emulator.now_ms())
    return Response(status_code=200)


@messages.delete("/topics/{name}/endpoints")
async def remove_endpoints(name: str, request: Request, emulator: EmulatorDep) -> Response:
    """4.3: remove by name or url; the last endpoint gone, the group is deleted."""
    refs = parse_endpoint_refs(await _json_body(request), url_required=False)
    emulator.store.remove_endpoints(name, refs, emulator.now_ms())
    return Response(status_code=200)


@messages.get("/workflows/dlq")
async def list_failed_workflow_runs(request: Request, emulator: EmulatorDep) -> JSONResponse:
    """QStash's listing: the failed workflow runs the filters select, a page at a time."""
    query = parse_list_query(request.query_params.multi_items())
    entries = emulator.store.entries()
    return JSONResponse(list_page(entries, query, newest_seq=emulator.store.last_seq))


@messages.post("/workflows/dlq/resume")
async def resume(request: Request, emulator: EmulatorDep) -> JSONResponse:
    """4.4: resume the selected workflow runs."""
    return _bulk("resume", request, emulator)


@messages.post("/workflows/dlq/restart")
async def restart(request: Request, emulator: EmulatorDep) -> JSONResponse:
    """4.5: restart the selected workflow runs."""
    return _bulk("restart", request, emulator)


def _bulk(mode: RunMode, request: Request, emulator: Emulator) -> JSONResponse:
    query = parse_bulk_query(request.query_params.multi_items())
    overrides = parse_overrides(request.headers.items(), emulator.config.header_prefix)
    runs, cursor = emulator.recover(mode, query, overrides)
    return JSONResponse({"workflowRuns": [run.reference() for run in runs], "cursor": cursor})


@account.post(ACCOUNT_PATH)
async def rotate_token(request: Request, emulator: EmulatorDep) -> JSONResponse:
    """4.2: with basic auth, new token and password; the old ones are refused from now on."""
    credentials = parse_basic(request.headers.get("authorization", ""))
    if credentials is None or not emulator.account.credentials_are(*credentials):
        raise Unauthorized("invalid credentials", headers={"WWW-Authenticate": "Basic"})
    emulator.account.rotate()
    return JSONResponse(emulator.account.record(emulator.max_requests_per_second))


async def _json_body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest("the body must be JSON") from exc
