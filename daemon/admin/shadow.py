"""`GET /api/v1/shadow` on the admin listener: the shadow rules in force (or why none
are) and where they disagree with the live rules. The console's Rules page shows the
same, from `shadow_status`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from daemon.http.errors import STORE_UNAVAILABLE
from daemon.rules.shadow import ShadowRules
from daemon.store import Store


class ShadowStatus(BaseModel):
    """`GET /api/v1/shadow`, as docs/api.md describes it."""

    path: str | None  # RECOVERYD_SHADOW_RULES; null when none is set
    loaded: bool
    digest: str | None  # sha256 of the file's bytes
    error: str | None
    problems: list[str]
    disagreements: list[dict[str, Any]]


async def shadow_status(shadow: ShadowRules | None, store: Store) -> dict[str, Any]:
    """The shadow rules' file, whether they loaded (else the error and its problems), and
    the records they decided otherwise than the live rules, grouped."""
    return {
        "path": None if shadow is None else str(shadow.path),
        "loaded": shadow is not None and shadow.current is not None,
        "digest": None if shadow is None else shadow.digest,
        "error": None if shadow is None else shadow.error,
        "problems": [] if shadow is None else list(shadow.problems),
        # Kept while no shadow is set too: the records of the last one stay until pruned.
        "disagreements": await store.shadow_disagreements(),
    }


def shadow_routes(shadow: ShadowRules | None, store: Store) -> APIRouter:
    router = APIRouter()

    @router.get("/api/v1/shadow", responses={200: {"model": ShadowStatus}, **STORE_UNAVAILABLE})
    async def shadow_rules() -> JSONResponse:
        """The shadow rules (RECOVERYD_SHADOW_RULES): loaded or not, and their
        disagreements with the live rules, grouped by both decisions, most first."""
        return JSONResponse(await shadow_status(shadow, store))

    return router
