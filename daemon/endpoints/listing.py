"""`recoveryd removals` for people: each removal, why, its evidence and how to undo it."""

from __future__ import annotations

import datetime
import shlex
from collections.abc import Iterable
from typing import Any

from daemon.foundation.durations import shown_duration
from daemon.foundation.words import counted


def described(removals: Iterable[dict[str, Any]]) -> str:
    """The removals (as `/api/v1/removals` lists them) as text, a block each."""
    blocks = [_block(removal) for removal in removals]
    return "\n\n".join(blocks) if blocks else "no endpoint removals recorded"


def _block(removal: dict[str, Any]) -> str:
    endpoint = removal["endpoint"]
    name, url = endpoint.get("name"), endpoint.get("url")
    when = removal["finishedAt"] or removal["updatedAt"]
    lines = [
        f"removal {removal['id']}  URL Group {removal['urlGroup']}  endpoint {name or url}  "
        f"{removal['state']}  {_iso(when)}"
    ]
    if name and url:
        lines.append(f"  url       {url}")
    if removal["reason"]:
        lines.append(f"  reason    {removal['reason']}")
    threshold = removal["threshold"]
    lines.append(
        f"  rule      {removal['rule']}: {counted(threshold['failures'], 'failure')} within "
        f"{shown_duration(threshold['withinSeconds'])}"
    )
    for number, item in enumerate(removal["evidence"]):
        label = "evidence" if number == 0 else ""
        status = item["responseStatus"] if item["responseStatus"] is not None else "-"
        lines.append(f"  {label:<9} {_iso(item['at'])}  status {status}  dlqId {item['dlqId']}")
    restore = removal["restore"]
    if restore["state"] == "restored":
        lines.append(f"  restored  {_iso(restore['restoredAt'])}")
    elif removal["state"] == "removed":
        if restore["reason"]:  # a restore that did not go through
            lines.append(f"  restore   {restore['reason']}")
        command = shlex.join(["recoveryd", "restore-endpoint", removal["urlGroup"], name or url])
        lines.append(f"  undo      {command}")
    return "\n".join(lines)


def _iso(at: float | None) -> str:
    if at is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
