"""The public listener's OpenAPI document, served at `GET /openapi.json` (docs/api.md).

Written out here rather than generated: `/callbacks` is answered by the listener's
protocol or a plain ASGI app (see ingest/protocol.py, ingest/receiver.py) and the probes
are Starlette routes, so no framework knows their
answers. tests/api checks the document against the running listener.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from daemon import __version__
from daemon.http.errors import Error, with_listener_refusals
from daemon.settings import Settings
from daemon.upstream.models import MAX_DLQ_ID_LENGTH


class Stored(BaseModel):
    """The callback is committed to disk (or its dlqId already was)."""

    status: Literal["accepted", "duplicate"]
    dlqId: str


class Alive(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready"]


class NotReady(Error):
    reasons: list[str]


_MODELS: list[type[BaseModel]] = [Error, Stored, Alive, Ready, NotReady]


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_STRING = _nullable({"type": "string"})
_INTEGER = _nullable({"type": "integer"})
# Milliseconds since the epoch; QStash's documentation prints them as numeric strings.
_TIMESTAMP = _nullable(
    {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^-?[0-9]+$"}]}
)
# Header name -> its values; a single string is taken as a list of one.
_HEADERS = _nullable(
    {
        "type": "object",
        "additionalProperties": {
            "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]
        },
    }
)

# The failure callback (docs/api.md#post-callbacks) as ingest/callback.py parses it: only
# `dlqId` is required, and unknown fields are kept.
CALLBACK: dict[str, Any] = {
    "type": "object",
    "required": ["dlqId"],
    "additionalProperties": True,
    "properties": {
        "dlqId": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_DLQ_ID_LENGTH,
            # Usable as a URL path segment: no control characters, not `.` or `..`.
            "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]+$",
            "not": {"enum": [".", ".."]},
        },
        "status": _INTEGER,
        "header": _HEADERS,
        "body": _STRING,
        "retried": _INTEGER,
        "maxRetries": _INTEGER,
        "sourceMessageId": _STRING,
        "topicName": _STRING,
        "endpointName": _STRING,
        "url": _STRING,
        "method": _STRING,
        "sourceHeader": _HEADERS,
        "sourceBody": _STRING,
        "notBefore": _TIMESTAMP,
        "createdAt": _TIMESTAMP,
        "scheduleId": _STRING,
        "callerIP": _STRING,
        "workflowRunId": _STRING,
        "workflowCreatedAt": _TIMESTAMP,
    },
}


def _answer(description: str, model: type[BaseModel] = Error) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def document(settings: Settings) -> dict[str, Any]:
    """The document of a daemon with `settings`: they name the signature header, and say
    whether it is required (unless unsigned callbacks are allowed)."""
    _, definitions = models_json_schema(
        [(model, "serialization") for model in _MODELS],
        ref_template="#/components/schemas/{model}",
    )
    signature = {
        "name": f"{settings.HEADER_PREFIX}-Signature",
        "in": "header",
        "required": not settings.ALLOW_UNSIGNED,
        "description": "The service's JWT (HS256) over the body: see docs/api.md.",
        "schema": {"type": "string"},
    }
    callbacks = {
        "summary": "A failure callback from the service",
        "description": "Answered 2xx only once the callback is committed to disk.",
        "operationId": "callback",
        "parameters": [signature],
        "requestBody": {"required": True, "content": {"application/json": {"schema": CALLBACK}}},
        "responses": {
            "200": _answer("Stored, or stored already (`duplicate`).", Stored),
            "400": _answer("Not a failure callback; `field` names what is wrong."),
            "401": _answer("The signature is missing or wrong."),
            "413": _answer("The body is over RECOVERYD_MAX_BODY_BYTES."),
            "415": _answer("The content type is not JSON."),
            "500": _answer("recoveryd failed on it, a defect it logs (the service will retry)."),
            "503": _answer("The store cannot take it now (the service will retry)."),
        },
    }
    return with_listener_refusals(
        {
            "openapi": "3.1.0",
            "info": {"title": "recoveryd public listener", "version": __version__},
            "paths": {
                "/callbacks": {"post": callbacks},
                "/healthz": {
                    "get": {
                        "summary": "Liveness",
                        "operationId": "healthz",
                        "responses": {"200": _answer("The process serves.", Alive)},
                    }
                },
                "/readyz": {
                    "get": {
                        "summary": "Readiness",
                        "operationId": "readyz",
                        "responses": {
                            "200": _answer("Ready.", Ready),
                            "503": _answer("Not ready; `reasons` lists every reason.", NotReady),
                        },
                    }
                },
            },
            "components": {"schemas": definitions["$defs"]},
        }
    )


def openapi_route(served: dict[str, Any]) -> Route:
    """`GET /openapi.json`, answering `served`."""

    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(served)

    return Route("/openapi.json", openapi)
