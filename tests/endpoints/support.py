"""remove-endpoint as its tests drive it: URL Groups in the emulator, dead letters of their
endpoints, the removals recoveryd records, and the calls the service saw."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.pipeline.support import Harness
from tests.support import eventually


def rules(failures: int = 3, within: str = "10m", keep_last: bool = True) -> str:
    """A rules file whose one rule removes an endpoint answering 404 or 410."""
    return f"""\
version: 1
rules:
  - name: prune-dead-endpoints
    match:
      topicName: {{exists: true}}
      responseStatus: {{in: [404, 410]}}
    action: remove-endpoint
    threshold: {{failures: {failures}, within: {within}}}
    keepLastEndpoint: {"true" if keep_last else "false"}
"""


def endpoints(group: str, *names: str) -> list[dict[str, str]]:
    """Named endpoints of `group`, each at its own url."""
    return [{"name": name, "url": f"https://{name}.example.com/{group}"} for name in names]


async def put_group(control: httpx.AsyncClient, name: str, members: list[dict[str, str]]) -> None:
    response = await control.post(
        "/_emulator/url-groups", json={"name": name, "endpoints": members}
    )
    response.raise_for_status()


async def group_endpoints(control: httpx.AsyncClient, name: str) -> list[dict[str, str]] | None:
    """The group's endpoints as the service has them now; None once it is deleted."""
    groups = (await control.get("/_emulator/url-groups")).json()
    found = [group["endpoints"] for group in groups if group["name"] == name]
    return found[0] if found else None


def dead_letter(group: str, endpoint: dict[str, str], status: int = 410) -> dict[str, Any]:
    """A DLQ message of a delivery to `endpoint` of `group` that failed with `status`."""
    message: dict[str, Any] = {"topicName": group, "url": endpoint["url"], "responseStatus": status}
    if endpoint.get("name"):
        message["endpointName"] = endpoint["name"]
    return message


async def fail(h: Harness, *messages: dict[str, Any]) -> list[str]:
    """Dead-letter `messages`, one after the other: each seeded, its callback sent and its
    dlqId decided before the next (so that their order is known)."""
    dlq_ids = []
    for message in messages:
        [dlq_id] = await h.seed([message])
        await h.send_callbacks([dlq_id])
        await eventually(lambda dlq_id=dlq_id: final(h, dlq_id))
        dlq_ids.append(dlq_id)
    return dlq_ids


async def final(h: Harness, dlq_id: str) -> bool:
    return (await h.record(dlq_id))["state"] not in ("received", "decided", "batched")


async def removals(admin: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await admin.get("/api/v1/removals")
    response.raise_for_status()
    found: list[dict[str, Any]] = response.json()["removals"]
    return found


async def finished_removals(admin: httpx.AsyncClient, count: int) -> list[dict[str, Any]]:
    """Wait until `count` removals are recorded and none is under way; all of them."""
    found: list[dict[str, Any]] = []

    async def done() -> bool:
        nonlocal found
        found = await removals(admin)
        return len(found) >= count and all(r["state"] not in ("pending", "removing") for r in found)

    await eventually(done)
    return found


def topic_calls(journal: list[dict[str, Any]], method: str) -> list[dict[str, Any]]:
    """The calls of `method` to the URL Group operations, in order."""
    return [
        call
        for call in journal
        if call["method"] == method and call["path"].startswith("/v2/topics/")
    ]


def named(call: dict[str, Any]) -> list[dict[str, str]]:
    """The endpoints a DELETE or POST of endpoints named in its body."""
    endpoints: list[dict[str, str]] = json.loads(call["body"])["endpoints"]
    return endpoints
