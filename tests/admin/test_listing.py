"""The listings' admin routes (daemon/admin/listing.py): GET /api/v1/dlq, /api/v1/batches
and /api/v1/groups on a running daemon, and their 400s naming the parameter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from tests.support import Recoveryd, callback_json, running_recoveryd, signed

# The refusals read one daemon started once for the module; the tests that send
# callbacks start their own. The module's tests share its event loop, the daemon's.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def empty_daemon(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Recoveryd]:
    """recoveryd with no record, for requests that must be refused before any is read."""
    async with running_recoveryd(tmp_path_factory.mktemp("listing")) as recoveryd:
        yield recoveryd


async def send(recoveryd: Recoveryd, dlq_id: str, **fields: object) -> None:
    body = callback_json(dlq_id, **fields)
    answer = await recoveryd.public.post("/callbacks", content=body, headers=signed(body))
    assert answer.status_code == 200, answer.text


async def test_the_records_are_listed_and_paged_by_cursor(tmp_path: Path) -> None:
    """Newest first, `next` leads to the rest, each with the callback's URL Group."""
    async with running_recoveryd(tmp_path) as recoveryd:
        for n in range(3):
            await send(recoveryd, f"list-{n}", topicName=f"group-{n}")
        first = (await recoveryd.admin.get("/api/v1/dlq", params={"limit": 2})).json()
        rest = await recoveryd.admin.get(
            "/api/v1/dlq", params={"limit": 2, "cursor": first["next"]}
        )
        found = await recoveryd.admin.get("/api/v1/dlq", params={"q": "group-1", "since": "1h"})
    listed = [item["dlqId"] for item in first["items"] + rest.json()["items"]]
    assert sorted(listed) == ["list-0", "list-1", "list-2"]
    assert rest.json()["next"] is None
    assert [item["dlqId"] for item in found.json()["items"]] == ["list-1"]
    assert found.json()["items"][0]["endpoint"] == "fulfilment"
    assert found.json()["items"][0]["status"] == 503


async def test_the_groups_and_batches_are_listed(tmp_path: Path) -> None:
    """/api/v1/groups counts the callbacks of one URL Group and endpoint together."""
    async with running_recoveryd(tmp_path) as recoveryd:
        await send(recoveryd, "g-1")
        await send(recoveryd, "g-2")
        groups = (await recoveryd.admin.get("/api/v1/groups")).json()["groups"]
        batches = await recoveryd.admin.get("/api/v1/batches", params={"state": "settled"})
    assert [(g["urlGroup"], g["endpoint"], g["count"]) for g in groups] == [
        ("orders", "fulfilment", 2)
    ]
    assert batches.json() == {"items": [], "next": None}


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/api/v1/dlq", {"cursor": "garbage"}, "cursor"),
        ("/api/v1/dlq", {"state": "lost"}, "state"),
        ("/api/v1/dlq", {"since": "yesterday"}, "since"),
        ("/api/v1/dlq", {"limit": "501"}, "limit"),
        ("/api/v1/dlq", {"q": "a\x00b"}, "q"),
        ("/api/v1/batches", {"state": "decided"}, "state"),
        ("/api/v1/batches", {"cursor": "WyJ4Il0"}, "cursor"),
        ("/api/v1/groups", {"limit": "²"}, "limit"),
    ],
)
async def test_a_bad_parameter_is_a_400_naming_it(
    empty_daemon: Recoveryd, path: str, params: dict[str, str], field: str
) -> None:
    """{"error", "field"}, not FastAPI's 422 nor a 500."""
    answer: httpx.Response = await empty_daemon.admin.get(path, params=params)
    assert answer.status_code == 400, answer.text
    assert answer.json()["field"] == field
    assert answer.json()["error"]
