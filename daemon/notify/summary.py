"""What a notify rule posts: a small JSON summary of the dead letter, built once, at
decision time, so that every attempt posts the same bytes. Pure.

Only what identifies the failure and lets a human act goes in. Never the message's
headers (they carry the caller's credentials forwarded to the endpoint), never a body
(the user's data; the endpoint's answer may echo it), never the query of a URL (API
keys travel there): the receiver is often a chat channel or an incident tool outside
the user's control. The dlqId is there to read everything else from the DLQ.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from daemon import __version__
from daemon.rules import Decision, Rule
from daemon.store.records import Notice

EVENT = "dead_letter"
# The Idempotency-Key of a (dlqId, rule) is a UUID derived from them: the same on every
# attempt and after any restart, without storing anything first.
_KEYS = uuid.UUID("6f1c5d0e-3b8a-5c47-9a0e-2d4f8b7c1a93")
# Each text is cut to this many characters and the labels to this many: one summary
# stays well under a few kilobytes whatever the message holds.
MAX_TEXT = 500
MAX_LABELS = 20
_TEXT = ("messageId", "method", "topicName", "endpointName", "queueName", "scheduleId",
         "workflowRunId", "flowControlKey")  # fmt: skip
_NUMBERS = ("responseStatus", "createdAt", "maxRetries", "notBefore")


def idempotency_key(dlq_id: str, rule: str) -> str:
    return str(uuid.uuid5(_KEYS, f"{dlq_id}\n{rule}"))


def receiver_of(url: str) -> str:
    """The URL's origin (scheme, host and port): what logs, records and metrics show of a
    webhook, whose path or query is often its secret; and the unit of concurrency."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{host}{port}"


def without_query(url: str) -> str:
    """`url` without its user, password, query and fragment."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def notices(
    dlq_id: str, decision: Decision, facts: Mapping[str, Any], *, dry_run: bool, now: float
) -> tuple[Notice, ...]:
    """The notifications `decision` asks for: one per notify rule it matched, whether it
    decided or matched with `continue` (none in a dry run, the rule's own included)."""
    return tuple(
        _notice(dlq_id, rule, decision, facts, now)
        for rule in decision.matched
        if rule.spec.notify is not None and not (dry_run or rule.spec.dry_run)
    )


def _notice(
    dlq_id: str, rule: Rule, decision: Decision, facts: Mapping[str, Any], now: float
) -> Notice:
    assert rule.spec.notify is not None
    url = rule.spec.notify.url
    key = idempotency_key(dlq_id, rule.name)
    body = summary(dlq_id, rule.name, decision, facts, decided_at=now, key=key)
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return Notice(rule.name, url, receiver_of(url), key, text)


def summary(
    dlq_id: str,
    rule: str,
    decision: Decision,
    facts: Mapping[str, Any],
    *,
    decided_at: float,
    key: str,
) -> dict[str, Any]:
    """The JSON posted for `dlq_id` by notify rule `rule` (docs/rules.md#notify)."""
    deciding = decision.rule
    return {
        "event": EVENT,
        "id": key,
        "dlqId": dlq_id,
        "rule": rule,
        "decision": {
            "rule": deciding.name if deciding else None,
            "action": deciding.action if deciding else None,
            "matchedRules": [matched.name for matched in decision.matched],
        },
        "message": _message(facts),
        "decidedAt": decided_at,
        "recoveryd": {"version": __version__},
    }


def _message(facts: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    url = facts.get("url")
    if isinstance(url, str):
        found["url"] = _clip(without_query(url))
    for name in _TEXT:
        value = facts.get(name)
        if isinstance(value, str):
            found[name] = _clip(value)
    for name in _NUMBERS:
        value = facts.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            found[name] = value
    labels = facts.get("labels")
    if isinstance(labels, list | tuple) and labels:
        found["labels"] = [_clip(label) for label in labels[:MAX_LABELS] if isinstance(label, str)]
    found["workflow"] = facts.get("workflow") is True
    return found


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"
