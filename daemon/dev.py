"""`recoveryd dev`: a zero-configuration run of the service's operations against the emulator.

It starts the bundled emulator and a small downstream on loopback, makes real
deliveries fail (so the emulator dead-letters them and sends signed failure
callbacks), then drives the five operations of the spec through the client,
printing every call and its result. The daemon's own pipeline joins in as the
ingest, rules and recovery stages land.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from daemon.emulator import EmulatorConfig, create_app
from daemon.serving import serve
from daemon.upstream import (
    BulkFilter,
    CallRecord,
    Credentials,
    CredentialsHolder,
    EndpointRef,
    NotFound,
    Overrides,
    ServiceClient,
)

Echo = Callable[[str], None]
BILLING_RUNS = 4


class Downstream:
    """The user's side: a billing workflow that is down until it recovers, a URL Group
    endpoint that is gone for good, and the failure-callback receiver."""

    def __init__(self) -> None:
        self.billing_healthy = False
        self.billing_calls = 0
        self.callbacks: list[tuple[str, bytes]] = []  # (signature, raw body)
        self.callback_arrived = asyncio.Event()
        self.app = Starlette(
            routes=[
                Route("/billing", self.billing, methods=["POST"]),
                Route("/orders/fulfil", self.ok, methods=["POST"]),
                Route("/orders/legacy", self.gone, methods=["POST"]),
                Route("/callbacks", self.callback, methods=["POST"]),
            ]
        )

    async def billing(self, request: Request) -> Response:
        self.billing_calls += 1
        if self.billing_healthy:
            return JSONResponse({"ok": True})
        return JSONResponse({"message": "db timeout"}, status_code=503)

    async def ok(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def gone(self, request: Request) -> Response:
        return Response("gone", status_code=410)

    async def callback(self, request: Request) -> Response:
        self.callbacks.append((request.headers.get("service-signature", ""), await request.body()))
        self.callback_arrived.set()
        return JSONResponse({"status": "accepted"})


async def run_demo(*, duration: float, forever: bool, echo: Echo) -> None:
    config = EmulatorConfig(delivery_retry_delay=0.05)
    downstream = Downstream()
    async with (
        serve(create_app(config)) as emulator_url,
        serve(downstream.app) as downstream_url,
        httpx.AsyncClient(timeout=10.0) as http,
    ):
        echo(f"emulator    {emulator_url}   (control API under /_emulator/)")
        echo(f"downstream  {downstream_url}")
        calls: Counter[str] = Counter()
        credentials = CredentialsHolder(Credentials(config.token, config.username, config.password))
        client = ServiceClient(
            http, base_url=emulator_url, credentials=credentials, observe=_printer(echo, calls)
        )
        demo = _Demo(
            echo, client, credentials, http, emulator_url, downstream_url, downstream, config
        )
        try:
            async with asyncio.timeout(duration):
                await demo.run()
        except TimeoutError:
            echo(f"stopped after {duration:g}s (--duration)")
        echo("")
        echo("calls made: " + ", ".join(f"{op} {n}" for op, n in sorted(calls.items())))
        if forever:
            echo("running until interrupted (Ctrl-C)")
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()


def _printer(echo: Echo, calls: Counter[str]) -> Callable[[CallRecord], None]:
    def observe(record: CallRecord) -> None:
        calls[record.operation] += 1
        status = record.status if record.status is not None else record.error
        retry = f" (attempt {record.attempt})" if record.attempt > 1 else ""
        echo(f"    -> {record.method} {record.path} {status} {record.seconds * 1000:.0f}ms{retry}")

    return observe


@dataclass
class _Demo:
    echo: Echo
    client: ServiceClient
    credentials: CredentialsHolder
    http: httpx.AsyncClient
    emulator_url: str
    downstream_url: str
    downstream: Downstream
    config: EmulatorConfig

    async def control(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self.http.request(method, f"{self.emulator_url}/_emulator{path}", **kwargs)
        response.raise_for_status()
        return response.json()

    async def run(self) -> None:
        billing, group = await self.fail_deliveries()
        await self.read_dead_letters(billing + group)
        self.downstream.billing_healthy = True
        self.echo("\nthe billing workflow is healthy again: recover its runs")
        await self.resume_one(billing[0])
        await self.restart_the_rest()
        await self.prune_the_dead_endpoint()
        await self.rotate_the_token()
        await self.control("POST", "/idle")
        runs = await self.control("GET", "/runs")
        done = sum(1 for run in runs if run.get("status") == "succeeded")
        self.echo(f"\n{done} of {len(runs)} recovered runs completed against the workflow URL")

    async def fail_deliveries(self) -> tuple[list[str], list[str]]:
        """Dead-letter real deliveries; the dlqIds of workflow runs and of the URL Group."""
        self.echo("\n1. deliveries fail: the billing workflow answers 503, an old endpoint 410")
        group = {
            "name": "orders",
            "endpoints": [
                {"name": "fulfilment", "url": f"{self.downstream_url}/orders/fulfil"},
                {"name": "legacy", "url": f"{self.downstream_url}/orders/legacy"},
            ],
        }
        await self.control("POST", "/url-groups", json=group)
        failure_callback = f"{self.downstream_url}/callbacks"
        for run in range(BILLING_RUNS):
            await self.control(
                "POST",
                "/publish?wait=true",
                json={
                    "url": f"{self.downstream_url}/billing",
                    "body": f'{{"invoice": {run}}}',
                    "maxRetries": 1,
                    "workflowRunId": f"wfr_billing_{run}",
                    "labels": ["billing"],
                    "failureCallback": failure_callback,
                },
            )
        await self.control(
            "POST",
            "/publish?wait=true",
            json={
                "topic": "orders",
                "body": '{"order": 42}',
                "maxRetries": 1,
                "failureCallback": failure_callback,
            },
        )
        while len(self.downstream.callbacks) < BILLING_RUNS + 1:
            self.downstream.callback_arrived.clear()
            await self.downstream.callback_arrived.wait()
        workflow_ids: list[str] = []
        group_ids: list[str] = []
        for signature, body in self.downstream.callbacks:
            claims = jwt.decode(
                signature,
                self.config.signing_key_current,
                algorithms=["HS256"],
                issuer=self.config.header_prefix,
            )
            payload = json.loads(body)
            (group_ids if "topicName" in payload else workflow_ids).append(payload["dlqId"])
            self.echo(
                f"   failure callback for {payload['dlqId']} ({payload.get('url')}, "
                f"status {payload.get('status')}), signature valid, jti {claims['jti']}"
            )
        return workflow_ids, group_ids

    async def read_dead_letters(self, dlq_ids: list[str]) -> None:
        self.echo("\n2. read each dead letter (spec 4.1)")
        for dlq_id in dlq_ids:
            message = await self.client.get_dlq_message(dlq_id)
            run = message.header_values(f"{self.client.header_prefix}-Workflow-RunId")
            self.echo(
                f"   {dlq_id}: {message.url} answered {message.response_status}"
                + (f", workflow run {run[0]}" if run else f", URL Group {message.topic_name}")
            )

    async def resume_one(self, dlq_id: str) -> None:
        self.echo(f"\n3. resume {dlq_id} by id, with overrides (spec 4.4, 4.6)")
        overrides = Overrides(retries=2, labels=("auto-resumed",))
        result = await self.client.bulk("resume", dlq_ids=[dlq_id], overrides=overrides)
        for run in result.workflow_runs:
            self.echo(f"   resumed as {run.workflow_run_id}")
        try:
            await self.client.get_dlq_message(dlq_id)
        except NotFound:
            self.echo(f"   {dlq_id} has left the DLQ (404)")

    async def restart_the_rest(self) -> None:
        self.echo("\n4. restart every other billing run by filter, following the cursor (4.5, 4.7)")
        started = time.monotonic()
        pages = self.client.bulk_pages(
            "restart", filter=BulkFilter(label=("billing",)), overrides=Overrides(retries=2)
        )
        async for page in pages:
            ids = ", ".join(run.workflow_run_id for run in page.workflow_runs)
            self.echo(f"   restarted {len(page.workflow_runs)}: {ids} (cursor {page.cursor!r})")
        self.echo(f"   done in {(time.monotonic() - started) * 1000:.0f}ms")

    async def prune_the_dead_endpoint(self) -> None:
        self.echo("\n5. take the dead endpoint out of its URL Group (spec 4.3)")
        await self.client.remove_endpoints("orders", [EndpointRef(name="legacy")])
        group = await self.client.get_url_group("orders")
        self.echo(
            f"   orders now has: {', '.join(e.name or e.url or '?' for e in group.endpoints)}"
        )

    async def rotate_the_token(self) -> None:
        self.echo("\n6. rotate the account token (spec 4.2)")
        record = await self.client.rotate_token()
        if record.token is None or record.password is None:
            raise RuntimeError("the token reset answered without new credentials")
        holder = self.credentials
        holder.replace(
            Credentials(
                record.token.get_secret_value(),
                holder.current.username,
                record.password.get_secret_value(),
            )
        )
        self.echo(
            f"   new credentials received and swapped in; limits: "
            f"{record.max_requests_per_second} requests/s, "
            f"DLQ retention {record.max_dlq_retention_time_milis} ms"
        )
