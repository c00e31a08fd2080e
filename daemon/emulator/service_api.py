"""The service API as the spec shows it (4.1-4.7), plus QStash's read and add of URL Groups.

Choices where the spec says "not shown", following QStash:

* errors are `{"error": "<message>"}`; a missing or wrong credential is a 401;
* removing endpoints answers 200 with an empty body, as QStash does; endpoints named in the
  request that are not in the group are ignored; a request item matches an endpoint by its
  name or by its url;
* adding endpoints (QStash) creates the group when it is missing and replaces an endpoint
  with the same name or url; 200 with an empty body; QStash's list of groups
  (`GET /v2/topics`) and delete of one (`DELETE /v2/topics/{name}`, 200 with an empty
  body, 404 when there is none) are served for the SDKs;
* the bulk calls ignore any request body; see `bulk` for how filters combine;
* QStash's listings (`GET /v2/workflows/dlq`, `GET /v2/dlq`) take the bulk calls'
  filters; see `listing`;
* QStash's delete of one message (`DELETE /v2/dlq/{dlqId}`) answers 200 with an empty
  body, 404 when it is not in the DLQ; its bulk delete (`DELETE /v2/dlq`) takes the ids
  as `{"dlqIds": [...]}` in the body (the Python SDK) or as `dlqIds` parameters, or the
  listing's filters with `count` and `cursor` (the JavaScript SDK), and answers
  `{"deleted": n}` plus the `cursor` of the rest when some is left. A bulk delete that
  names nothing at all is a 400: the SDKs send `count` even to delete "all", so an
  empty one is a mistake, not a wish to empty the DLQ;
* QStash's single resume and restart (`POST /v2/workflows/dlq/{resume,restart}/{dlqId}`)
  take the bulk calls' override headers and answer the new run's reference; 404 when the
  message is not in the DLQ, 400 when it is not a workflow run's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from daemon.emulator.account import parse_basic, parse_bearer
from daemon.emulator.bulk import DLQ_PARAMS, parse_bulk_query
from daemon.emulator.emulator import Emulator
from daemon.emulator.errors import BadRequest, Unauthorized
from daemon.emulator.gate import ACCOUNT_PATH
from daemon.emulator.headers import header_map
from daemon.emulator.listing import list_page, parse_list_query
from daemon.emulator.overrides import is_http_url, parse_overrides
from daemon.emulator.state import RunMode, parse_endpoint_refs
from daemon.emulator.workflow import Inbound, parse_batch


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


@messages.get("/dlq")
async def list_dlq(request: Request, emulator: EmulatorDep) -> JSONResponse:
    """QStash's listing of the DLQ, a page at a time."""
    query = parse_list_query(request.query_params.multi_items(), DLQ_PARAMS)
    return JSONResponse(
        list_page(emulator.store.entries(), query, newest_seq=emulator.store.last_seq)
    )


@messages.delete("/dlq/{dlq_id}")
async def delete_dlq_message(dlq_id: str, emulator: EmulatorDep) -> Response:
    """QStash's delete of one message; 404 when it is not in the DLQ."""
    emulator.delete(dlq_id)
    return Response(status_code=200)


@messages.delete("/dlq")
async def delete_dlq_messages(request: Request, emulator: EmulatorDep) -> JSONResponse:
    """QStash's bulk delete: by ids (body or query), or a page of what the filters select."""
    query = parse_bulk_query(request.query_params.multi_items(), DLQ_PARAMS)
    if (await request.body()).strip():
        ids = _body_ids(await _json_body(request))
        if not ids and not query.names_anything:
            return JSONResponse({"deleted": 0})  # an empty list deletes nothing
        query = replace(query, dlq_ids=tuple(dict.fromkeys((*query.dlq_ids, *ids))))
    if not query.names_anything:
        raise BadRequest("name the messages to delete: dlqIds, a filter, or a count")
    deleted, cursor = emulator.delete_selected(query)
    answer: dict[str, Any] = {"deleted": deleted}
    if cursor:
        answer["cursor"] = cursor
    return JSONResponse(answer)


@messages.get("/topics")
async def list_url_groups(emulator: EmulatorDep) -> JSONResponse:
    """QStash's list of URL Groups: each as `GET /v2/topics/{name}` answers it."""
    return JSONResponse([group.to_json() for group in emulator.store.groups.values()])


@messages.delete("/topics/{name}")
async def delete_url_group(name: str, emulator: EmulatorDep) -> Response:
    """QStash's delete of a URL Group with its endpoints; 404 when there is none."""
    emulator.store.delete_group(name)
    return Response(status_code=200)


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


@messages.post("/batch")
async def batch(request: Request, emulator: EmulatorDep) -> JSONResponse:
    """QStash's batch publish: an answer per message, in order (see `workflow`)."""
    return JSONResponse(emulator.accept(parse_batch(await _json_body(request))))


@messages.post("/publish/{destination:path}")
async def publish(destination: str, request: Request, emulator: EmulatorDep) -> JSONResponse:
    """QStash's publish of one message, its headers and body those of the call."""
    if request.url.query:
        destination += "?" + request.url.query
    if not is_http_url(destination):
        raise BadRequest("the destination must be an absolute http(s) URL")
    header = header_map(request.headers.items())
    message = Inbound(destination, header, await request.body())
    [answer] = emulator.accept([message])
    answer.pop("deduplicated", None)
    return JSONResponse(answer)


@messages.delete("/workflows/runs/{run_id}")
async def end_workflow_run(run_id: str, request: Request, emulator: EmulatorDep) -> Response:
    """The SDKs' end of a run: completed, or with `cancel=true` cancelled."""
    cancel = request.query_params.get("cancel", "false").lower() == "true"
    emulator.end_run(run_id, cancel=cancel)
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


@messages.post("/workflows/dlq/resume/{dlq_id}")
async def resume_one(dlq_id: str, request: Request, emulator: EmulatorDep) -> JSONResponse:
    """QStash's resume of one workflow run from the DLQ."""
    return _single("resume", dlq_id, request, emulator)


@messages.post("/workflows/dlq/restart/{dlq_id}")
async def restart_one(dlq_id: str, request: Request, emulator: EmulatorDep) -> JSONResponse:
    """QStash's restart of one workflow run from the DLQ."""
    return _single("restart", dlq_id, request, emulator)


def _single(mode: RunMode, dlq_id: str, request: Request, emulator: Emulator) -> JSONResponse:
    overrides = parse_overrides(request.headers.items(), emulator.config.header_prefix)
    return JSONResponse(emulator.recover_one(mode, dlq_id, overrides).reference())


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
    return JSONResponse(emulator.account.record(emulator.enforced_limits()))


async def _json_body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest("the body must be JSON") from exc


def _body_ids(payload: Any) -> tuple[str, ...]:
    """The ids of a `{"dlqIds": [...]}` body (the Python SDK's bulk delete)."""
    ids = payload.get("dlqIds") if isinstance(payload, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise BadRequest('the body must be {"dlqIds": [...]}, a list of DLQ ids')
    return tuple(ids)
