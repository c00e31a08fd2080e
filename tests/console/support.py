"""The console as its browser tests see it: recoveryd (with an admin token) and the
emulator carrying real traffic, seeded with failures of every kind the pages show, and
what the tests read and write (the pages, the payloads, the screenshots' folder)."""

from __future__ import annotations

import base64
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.async_api import StorageState, StorageStateCookie

from tests.endpoints.support import dead_letter, endpoints, fail, finished_removals, put_group
from tests.pipeline.support import Harness
from tests.support import callback_json, eventually, signed

ADMIN_TOKEN = "adm_console-Tests-token"
# Where the screenshots go: a folder CI keeps (.ci/run sets it), else one gitignored here.
# Not a RECOVERYD_* name: recoveryd refuses to start beside a RECOVERYD_* variable that is
# no setting of its own (daemon/settings.py, as a misspelt one would turn a check off).
SCREENSHOTS = Path(os.environ.get("CONSOLE_SCREENSHOTS") or Path(__file__).parent / "screenshots")

RULES = """\
version: 1
rules:
  - name: prune-dead-endpoints
    match: {topicName: {exists: true}, responseStatus: {in: [404, 410]}}
    action: remove-endpoint
    threshold: {failures: 1, within: 10m}
    keepLastEndpoint: true
  - name: resume-billing
    match: {labels: {any: [billing]}}
    action: resume
    batch: {maxSize: 10, maxWait: 100ms}
  - name: resume-the-rest
    match: {workflow: true}
    action: resume
    batch: {maxSize: 10, maxWait: 100ms}
  - name: everything-else
    match: {}
    action: ignore
sweeps:
  - name: nightly-resume
    schedule: "0 3 * * *"
    action: resume
    filter: {failureFunctionState: CALLBACK_FAIL, fromDate: -24h}
    maxPerRun: 500
"""

# The candidate the Rules page shows twice: as the shadow rules, and as the file on disk
# once the traffic is seeded (what a reload would change): billing runs ignored.
CANDIDATE = RULES.replace(
    "action: resume\n    batch: {maxSize: 10, maxWait: 100ms}\n  - name: resume-the-rest",
    "action: ignore\n  - name: resume-the-rest",
)

# What an attacker who can make a delivery fail puts in the fields the console shows.
SCRIPT = "<script>alert(1)</script>"
IMAGE = '"><img src=x onerror=alert(1)>'
JAVASCRIPT_URL = "javascript:alert(1)"
PAYLOADS = (SCRIPT, IMAGE, JAVASCRIPT_URL)
HOSTILE_HEADERS = {"X-Note": [SCRIPT], "X-Link": [JAVASCRIPT_URL]}
HOSTILE_BODY = f"{SCRIPT} {IMAGE} {JAVASCRIPT_URL}"

# The pages every console link leads to (the failure's own page is added with a dlqId).
PAGES = {
    "overview": "/ui/",
    "failures": "/ui/failures",
    "groups": "/ui/groups",
    "batches": "/ui/batches",
    "removals": "/ui/removals",
    "sweeps": "/ui/sweeps",
    "rules": "/ui/rules",
}
NAV = ("Overview", "Failures", "Groups", "Batches", "Removals", "Sweeps", "Rules")


@dataclass
class Console:
    """The running daemon and what was seeded: dlqIds by what happened to them."""

    h: Harness
    url: str  # the admin listener's, where /ui/ is
    billing: list[str] = field(default_factory=list)  # resumed by resume-billing
    others: list[str] = field(default_factory=list)  # resumed by resume-the-rest
    failed: str = ""  # refused by the service on every fetch: `failed`
    removed: str = ""  # whose endpoint (orders/c) was removed
    hostile: str = ""  # whose fields carry the payloads
    members: list[dict[str, str]] = field(default_factory=list)  # URL Group orders


def runs(prefix: str, count: int, **fields: Any) -> list[dict[str, Any]]:
    """`count` workflow DLQ entries with run ids of their own."""
    return [
        {"url": "https://app.example.com/wf", "workflowRunId": f"wfr_{prefix}_{i}", **fields}
        for i in range(count)
    ]


def encoded(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def state(h: Harness, dlq_id: str) -> str:
    found: str = (await h.record(dlq_id))["state"]
    return found


async def seed(h: Harness) -> Console:
    """Each kind of failure, driven through the daemon as the service would drive it."""
    console = Console(h, str(h.recoveryd.admin.base_url))
    console.billing = await h.seed(runs("billing", 2, labels=["billing"]))
    console.others = await h.seed(runs("other", 2))
    await h.send_callbacks(console.billing + console.others)

    # Refused on every read: the fetch gives up after its five tries.
    [console.failed] = await h.seed(runs("refused", 1))
    await h.fault(kind="status", status=400, times=5, paths=[f"/v2/dlq/{console.failed}"])
    await h.send_callbacks([console.failed])

    console.members = endpoints("orders", "a", "b", "c")
    await put_group(h.control, "orders", console.members)
    [console.removed] = await fail(h, dead_letter("orders", console.members[2]))
    await finished_removals(h.recoveryd.admin, 1)

    console.hostile = await send_hostile(h)
    for dlq_id in [*console.billing, *console.others, console.hostile]:
        await eventually(functools.partial(_settled, h, dlq_id), what=f"{dlq_id} final")
    await eventually(lambda: _failed(h, console.failed), what=f"{console.failed} failed")
    return console


async def _settled(h: Harness, dlq_id: str) -> bool:
    return await state(h, dlq_id) in ("done", "skipped")


async def _failed(h: Harness, dlq_id: str) -> bool:
    return await state(h, dlq_id) == "failed"


async def send_hostile(h: Harness) -> str:
    """A delivery to a URL Group whose every field the console shows carries a payload,
    in the DLQ and in its signed callback alike."""
    fields: dict[str, Any] = {
        "topicName": SCRIPT,
        "endpointName": IMAGE,
        "url": JAVASCRIPT_URL,
    }
    [dlq_id] = await h.seed(
        [
            fields
            | {
                "header": HOSTILE_HEADERS,
                "body": HOSTILE_BODY,
                "responseHeader": HOSTILE_HEADERS,
                "responseBody": HOSTILE_BODY,
            }
        ]
    )
    body = callback_json(
        dlq_id,
        **fields,
        header=HOSTILE_HEADERS,
        body=encoded(HOSTILE_BODY),
        sourceHeader=HOSTILE_HEADERS,
        sourceBody=encoded(HOSTILE_BODY),
    )
    answer = await h.recoveryd.post(body, signed(body))
    assert answer.status_code == 200, answer.text
    return dlq_id


def session_cookie(storage: StorageState) -> StorageStateCookie:
    """The console's session cookie in a context's storage state."""
    [cookie] = [c for c in storage.get("cookies", []) if c.get("name") == "recoveryd_session"]
    return cookie


def dumps(violations: list[dict[str, Any]]) -> str:
    """axe's violations, short enough to read in a failure."""
    return json.dumps(
        [
            {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]]}
            for v in violations
        ],
        indent=1,
    )
