"""A workflow app to try `recoveryd dev --app` with (README.md here): FastAPI and the
official Python workflow SDK (`upstash-workflow`), three steps and a failure function.

Step two stands in for a call to a payment API that is down for a while: for an order
whose payload says `"failures": K`, it fails on its first K attempts (counted in this
process), then succeeds. K at least the step's retries + 1 (4 by default) sends the run
to the DLQ, where recoveryd picks it up.

The SDK reads QSTASH_URL, QSTASH_TOKEN, QSTASH_CURRENT_SIGNING_KEY and
QSTASH_NEXT_SIGNING_KEY: the values `recoveryd dev --app` prints. Run it with
`uvicorn app:app --port 8000` in this folder.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from fastapi import FastAPI
from upstash_workflow import AsyncWorkflowContext
from upstash_workflow.fastapi import Serve

log = logging.getLogger("uvicorn.error")  # printed with uvicorn's own lines
app = FastAPI()
serve = Serve(app)
attempts: Counter[Any] = Counter()  # step two's attempts, by order


async def failure_function(
    context: AsyncWorkflowContext[Any], status: int, response: str, headers: dict[str, Any]
) -> None:
    """Called by the SDK once a step has used up its retries (the run is in the DLQ)."""
    log.warning("run %s failed (%s): %s", context.workflow_run_id, status, response)


@serve.post("/workflow", failure_function=failure_function)
async def workflow(context: AsyncWorkflowContext[Any]) -> None:
    payload = context.request_payload or {}
    order = payload.get("order")

    async def reserve() -> None:
        log.info("run %s: step 1, stock reserved for order %s", context.workflow_run_id, order)

    await context.run("reserve", reserve)

    async def charge() -> str:
        attempts[order] += 1
        if attempts[order] <= int(payload.get("failures", 0)):
            raise RuntimeError(f"payment API down (attempt {attempts[order]})")
        log.info("run %s: step 2, order %s charged", context.workflow_run_id, order)
        return "charged"

    charged = await context.run("charge", charge)

    async def confirm() -> None:
        log.info("run %s: step 3, order %s %s, confirmed", context.workflow_run_id, order, charged)

    await context.run("confirm", confirm)
