"""Sweeps as their tests drive them: a rules file with one sweep, DLQ entries its filter
selects and entries it must leave alone, and the sweep's runs read back from the admin
API."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import httpx

from tests.support import workflows

FROM = 1_763_600_000_000  # the filter's fromDate, ms
TO = FROM + 100_000  # and its toDate
CALLER = "203.0.113.7"
RESTART = "/v2/workflows/dlq/restart"
LIST = "/v2/workflows/dlq"
# Each filter of the sweep, as the service is sent it.
FILTER = {
    "label": ["billing", "search"],
    "failureFunctionState": "CALLBACK_FAIL",
    "fromDate": FROM,
    "toDate": TO,
    "callerIp": CALLER,
}


def sweep_rules(schedule: str = "1s", *, name: str = "restart-billing", **fields: Any) -> str:
    """A rules file with no rule and one restart sweep over FILTER; `fields` add to it."""
    sweep = {
        "name": name,
        "schedule": schedule,
        "action": "restart",
        "filter": FILTER,
        "overrides": {"retries": 2, "labels": ["swept"]},
        **fields,
    }
    return f"version: 1\nrules: []\nsweeps:\n  - {json.dumps(sweep)}\n"


def matching(n: int) -> list[dict[str, Any]]:
    """`n` failed workflow runs the sweep selects: each label of the filter, the first at
    fromDate and the last at toDate (both inclusive), the rest spread in between."""
    step = (TO - FROM) // max(n - 1, 1)
    return [
        {
            **entry,
            "labels": ["billing"] if i % 2 else ["search", "other"],
            "createdAt": TO if i == n - 1 else FROM + i * step,
            "failureFunctionState": "CALLBACK_FAIL",
            "callerIP": CALLER,
        }
        for i, entry in enumerate(workflows(n))
    ]


def not_matching() -> list[dict[str, Any]]:
    """Entries that miss the filter by one condition each (labels are OR-ed, the rest
    AND-ed), and a message that is not a workflow run's."""
    [base] = matching(1)
    misses = [
        {"labels": ["other"]},
        {"failureFunctionState": "CALLBACK_SUCCESS"},
        {"createdAt": FROM - 1},
        {"createdAt": TO + 1},
        {"callerIP": "198.51.100.1"},
    ]
    entries = [{**base, **miss, "workflowRunId": f"wfr_miss_{i}"} for i, miss in enumerate(misses)]
    plain = {k: v for k, v in base.items() if k != "workflowRunId"}
    return [*entries, plain]


def interleaved(selected: list[dict[str, Any]], others: list[dict[str, Any]]) -> list[Any]:
    """`others` spread among `selected`, so every page walks past some."""
    gap = max(1, len(selected) // (len(others) + 1))
    waiting = list(others)
    mixed: list[Any] = []
    for i, entry in enumerate(selected):
        if i and i % gap == 0 and waiting:
            mixed.append(waiting.pop(0))
        mixed.append(entry)
    return mixed + waiting


async def seed(control: httpx.AsyncClient, selected: int) -> tuple[list[str], list[str]]:
    """`selected` matching entries among the not-matching ones; (matching, other) ids."""
    messages = interleaved(matching(selected), not_matching())
    response = await control.post("/_emulator/dlq", json={"messages": messages})
    response.raise_for_status()
    return split(response.json()["dlqIds"], messages)


def split(ids: list[str], messages: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The ids of seeded `messages`: (those the sweep selects, the others)."""
    picked, left = [], []
    for dlq_id, message in zip(ids, messages, strict=True):
        run_id = message.get("workflowRunId", "wfr_miss")
        (left if run_id.startswith("wfr_miss") else picked).append(dlq_id)
    return picked, left


async def sweeps(admin: httpx.AsyncClient, runs: int = 100) -> list[dict[str, Any]]:
    response = await admin.get("/api/v1/sweeps", params={"runs": runs})
    response.raise_for_status()
    found: list[dict[str, Any]] = response.json()["sweeps"]
    return found


async def finished_runs(
    admin: httpx.AsyncClient, count: int, *, name: str = "restart-billing", seconds: float = 30
) -> list[dict[str, Any]]:
    """Wait until the sweep has `count` finished runs; all its runs, oldest first."""
    async with asyncio.timeout(seconds):
        while True:
            [sweep] = [found for found in await sweeps(admin) if found["name"] == name]
            runs = list(reversed(sweep["lastRuns"]))
            if sum(run["result"] is not None for run in runs) >= count:
                return runs
            await asyncio.sleep(0.05)


def recovered_ids(runs: list[dict[str, Any]]) -> list[str]:
    """The workflow runs the sweep's runs recorded as made, in order."""
    return [
        made["workflowRunId"]
        for run in runs
        for page in run["pages"]
        for made in page.get("workflowRuns", [])
    ]


def sources(emulator_runs: list[dict[str, Any]]) -> Counter[str]:
    """How many runs the service made from each dlqId."""
    return Counter(run["sourceDlqId"] for run in emulator_runs)
