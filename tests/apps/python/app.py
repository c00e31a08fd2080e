"""A user's workflow app, written with the service's official Python SDK (`upstash-workflow`)
on FastAPI as its documentation shows: at /workflow three `context.run` steps, the second
failing while a switch is on, and a failure function; at /sleepy a step, a one-second
`context.sleep`, and a step. The tests run it as a process of its own
(tests/apps/support.py): `uvicorn app:app --app-dir tests/apps/python`.

The SDK reads QSTASH_URL (the service: the emulator), QSTASH_TOKEN, and
QSTASH_CURRENT_SIGNING_KEY with QSTASH_NEXT_SIGNING_KEY (both set: every request to the
workflow endpoint must be signed). WORKFLOW_RETRIES, when set, is `serve`'s `retries`
(which the Python SDK stamps on each step it publishes).

What the tests read back, GET /steps: how often each step ran, every delivery to
/workflow or /sleepy (when it came, in Unix seconds, its path, its headers, the status
answered, the steps run while it was served) and every
call of the failure function. POST /switch {"fail": true|false} turns step two's failure
on or off."""

from __future__ import annotations

import contextvars
import os
import time
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from upstash_workflow import AsyncWorkflowContext
from upstash_workflow.fastapi import Serve

STEPS = ("step-1", "step-2", "step-3")
WORKFLOW = "/workflow"
SLEEPY = "/sleepy"

state: dict[str, Any] = {
    "fail": False,
    "runs": dict.fromkeys(STEPS, 0),
    "deliveries": [],
    "failures": [],
}
# The delivery being served, so that a step can say it ran during it.
delivery: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "delivery", default=None
)


class RecordDeliveries:
    """Records each request to the workflow endpoint before the SDK sees it: its headers as
    received, then the status the SDK answered."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in (WORKFLOW, SLEEPY):
            await self.app(scope, receive, send)
            return
        record: dict[str, Any] = {
            "at": time.time(),
            "path": scope["path"],
            "headers": {},
            "status": None,
            "steps": [],
        }
        headers = record["headers"]
        for raw_name, raw_value in scope["headers"]:
            name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
            headers[name] = value if name not in headers else f"{headers[name]}, {value}"
        state["deliveries"].append(record)

        async def send_recording(message: Message) -> None:
            if message["type"] == "http.response.start":
                record["status"] = message["status"]
            await send(message)

        token = delivery.set(record)
        try:
            await self.app(scope, receive, send_recording)
        finally:
            delivery.reset(token)


app = FastAPI()
app.add_middleware(RecordDeliveries)
serve = Serve(app)


def ran(step: str) -> None:
    state["runs"][step] = state["runs"].get(step, 0) + 1  # /sleepy's steps: once they run
    record = delivery.get()
    if record is not None:
        record["steps"].append(step)


class Switch(BaseModel):
    fail: bool


@app.post("/switch")
async def switch(to: Switch) -> dict[str, bool]:
    state["fail"] = to.fail
    return {"fail": state["fail"]}


@app.get("/steps")
async def steps() -> dict[str, Any]:
    return state


async def failure_function(
    context: AsyncWorkflowContext[Any], status: int, response: str, headers: dict[str, Any]
) -> None:
    state["failures"].append(
        {
            "workflowRunId": context.workflow_run_id,
            "status": status,
            "response": response,
            "headers": headers,
        }
    )


retries = os.environ.get("WORKFLOW_RETRIES")


@serve.post(
    WORKFLOW,
    failure_function=failure_function,
    retries=None if retries is None else int(retries),
)
async def workflow(context: AsyncWorkflowContext[Any]) -> None:
    def one() -> dict[str, int]:
        ran("step-1")
        return {"n": 1}

    first = await context.run("step-1", one)

    def two() -> int:
        ran("step-2")
        if state["fail"]:
            raise RuntimeError("step 2 is switched to fail")
        return int(first["n"]) + 1

    second = await context.run("step-2", two)

    def three() -> int:
        ran("step-3")
        return int(second) + 1

    await context.run("step-3", three)


@serve.post(SLEEPY)
async def sleepy(context: AsyncWorkflowContext[Any]) -> None:
    def before() -> None:
        ran("before")

    await context.run("before", before)
    await context.sleep("nap", 1)  # seconds

    def after() -> None:
        ran("after")

    await context.run("after", after)
