"""The console's tests: a daemon on the emulator with failures to show, and a browser's
part played by httpx (its cookies, the forms' hidden CSRF field)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from tests.support import (
    LOOPBACK_TLS,
    Recoveryd,
    callback_json,
    emulator_config,
    eventually,
    running_recoveryd,
    workflows,
)

RULES = """\
version: 1
rules:
  - name: resume-workflows
    match: {workflow: true}
    action: resume
    batch: {maxSize: 10, maxWait: 100ms}
  - name: leave-the-rest
    match: {}
    action: ignore
sweeps:
  - name: nightly
    schedule: "0 3 * * *"
    action: resume
    filter: {fromDate: -24h}
"""

# A callback's fields as an attacker would set them: text, never markup or a link.
HOSTILE = {
    "topicName": "<script>alert(1)</script>",
    "endpointName": '"><img src=x onerror=alert(1)>',
    "url": "javascript:alert(1)",
    "sourceHeader": {"Authorization": ["Bearer endpoint-s3cret"], "X-Note": ["<script>x</script>"]},
}
HOSTILE_ID = "1763712000999-0<script>alert(1)</script>"
MARKUP = ("<script>alert(1)", "<img src=x", 'href="javascript:')
# RECOVERYD_ADMIN_TOKEN of the consoles that have one.
ADMIN_TOKEN = "adm_c0nsole-Token"


@dataclass
class Console:
    daemon: Recoveryd
    service: httpx.AsyncClient  # the emulator's control API
    rules: Path
    done: str  # a dlqId recovered (done)

    @property
    def ui(self) -> httpx.AsyncClient:
        return self.daemon.admin

    async def post_form(self, path: str, page: str, **fields: Any) -> httpx.Response:
        """POST the form of `page` (a path) to `path` as a browser would: the page read
        first, its CSRF field sent back with its cookie."""
        form = await self.ui.get(page)
        return await self.ui.post(path, data={"csrf": csrf_of(form.text), **fields})


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


async def settled(daemon: Recoveryd, dlq_id: str, token: str | None = None) -> dict[str, Any]:
    """The record of `dlq_id` once final, read from the admin API (with `token`, its
    bearer token)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    path = f"/api/v1/dlq/{quote(dlq_id, safe='')}"

    async def final() -> dict[str, Any] | None:
        record = (await daemon.admin.get(path, headers=headers)).json()
        return record if record.get("state") in ("done", "gone", "skipped") else None

    found: dict[str, Any] = await eventually(final, what=f"{dlq_id} final")
    return found


@contextlib.asynccontextmanager
async def console(tmp_path: Path, **settings: str) -> AsyncIterator[Console]:
    """A daemon on the emulator that recovered one workflow run (done), its console open
    to the tests' client (the token's session when `ADMIN_TOKEN` is set: log in first)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    with serve_in_thread(create_app(emulator_config(execute_runs=False))) as service_url:
        async with (
            httpx.AsyncClient(base_url=service_url, timeout=10, verify=LOOPBACK_TLS) as service,
            running_recoveryd(
                tmp_path, SERVICE_URL=service_url, RULES=str(rules), **settings
            ) as daemon,
        ):
            seeded = await service.post("/_emulator/dlq", json={"messages": workflows(1)})
            [done] = seeded.json()["dlqIds"]
            body = callback_json(done, "failure-callback-workflow.json", workflowRunId="wfr_0")
            assert (await daemon.post(body)).status_code == 200
            await settled(daemon, done, settings.get("ADMIN_TOKEN"))
            yield Console(daemon, service, rules, done)


async def post_hostile(daemon: Recoveryd) -> dict[str, Any]:
    """A callback whose fields carry markup and a javascript: URL, taken and settled (its
    dlqId is not in the DLQ: the fetch finds it gone)."""
    assert (await daemon.post(callback_json(HOSTILE_ID, **HOSTILE))).status_code == 200
    return await settled(daemon, HOSTILE_ID)
