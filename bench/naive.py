"""The naive peer of bench.ingest: a failure callback receiver as one would first write it.

FastAPI, PyJWT to check the signature, pydantic to read the callback, and one SQLite
insert and commit per request (WAL, synchronous=FULL: as durable as recoveryd), made
right in the request's handler. bench.ingest serves it with uvicorn and the settings of
recoveryd's listener; it answers as recoveryd does, so the bench checks its answers and
its store alike. Configured by environment: BENCH_NAIVE_DB (the SQLite file),
BENCH_NAIVE_KEY (the signing key), BENCH_NAIVE_ISSUER.
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import os
import sqlite3
import time
from typing import Annotated

import jwt
from fastapi import FastAPI, Header, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

_KEY = os.environ.get("BENCH_NAIVE_KEY", "")
_ISSUER = os.environ.get("BENCH_NAIVE_ISSUER", "Service")
_connection = sqlite3.connect(os.environ.get("BENCH_NAIVE_DB", ":memory:"), isolation_level=None)
_connection.execute("PRAGMA journal_mode=WAL")
_connection.execute("PRAGMA synchronous=FULL")
_connection.execute(
    "CREATE TABLE IF NOT EXISTS callbacks (dlq_id TEXT PRIMARY KEY, body BLOB, received_at REAL)"
)
# Closed as the process exits (uvicorn runs it with --lifespan off), not left to the
# garbage collector, which Python 3.13 warns of.
atexit.register(_connection.close)

app = FastAPI()


class FailureCallback(BaseModel):
    model_config = ConfigDict(extra="allow")

    dlq_id: str = Field(alias="dlqId", min_length=1)
    status: int | None = None
    url: str | None = None


@app.post("/callbacks")
async def callbacks(
    request: Request, signature: Annotated[str, Header(alias=f"{_ISSUER}-Signature")]
) -> dict[str, str]:
    body = await request.body()
    try:
        claims = jwt.decode(signature, _KEY, algorithms=["HS256"], issuer=_ISSUER,
                            options={"require": ["exp", "iat", "nbf", "body"]})  # fmt: skip
    except jwt.InvalidTokenError as exc:
        raise HTTPException(401, f"bad signature: {exc}") from None
    digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
    if claims["body"].rstrip("=") != digest:
        raise HTTPException(401, "the body is not the one signed")
    callback = FailureCallback.model_validate_json(body)
    inserted = _connection.execute(
        "INSERT INTO callbacks VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        (callback.dlq_id, body, time.time()),
    ).rowcount
    return {"status": "accepted" if inserted else "duplicate", "dlqId": callback.dlq_id}
