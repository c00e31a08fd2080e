"""What a decision would do, spelled out: the service call each matched rule causes.

`recoveryd explain` prints it and `recoveryd test` checks it. The override headers come
from the same `Overrides.headers` the client sends, so what is explained is what is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from daemon.foundation.words import counted
from daemon.rules.callback import CARRIED
from daemon.rules.ruleset import Decision, Rule, Ruleset

# How a budget counts, said where a user looks (`recoveryd explain`, docs/rules.md).
BUDGET_COUNTS = (
    "recoveries of this workflow: its run and every run a resume or restart made from it "
    "(each gets a new workflowRunId), decided within the window"
)


def explain(
    ruleset: Ruleset, message: Mapping[str, Any], decision: Decision, header_prefix: str
) -> dict[str, Any]:
    """The decision for `message` as JSON: every matched rule, in order, with its call."""
    final = decision.rule
    return {
        "dlqId": message.get("dlqId"),
        "rule": final.name if final else None,
        "action": final.action if final else None,
        "matched": [_step(ruleset, rule, message, header_prefix) for rule in decision.matched],
        "rules": {"source": ruleset.source, "sha256": ruleset.digest},
    }


def call_headers(rule: Rule, header_prefix: str) -> dict[str, str]:
    """The override headers of a resume or restart call (spec 4.6); none for the rest."""
    overrides = rule.spec.overrides
    return overrides.headers(header_prefix) if overrides else {}


def recovery_call(rule: Rule, dlq_id: str, header_prefix: str) -> dict[str, Any]:
    """The bulk call a resume or restart rule makes for `dlq_id` (alone in its batch)."""
    return {
        "method": "POST",
        "path": f"/v2/workflows/dlq/{rule.action}",
        "query": {"dlqIds": [dlq_id]},
        "headers": call_headers(rule, header_prefix),
    }


def _step(
    ruleset: Ruleset, rule: Rule, message: Mapping[str, Any], header_prefix: str
) -> dict[str, Any]:
    spec = rule.spec
    step: dict[str, Any] = {
        "rule": rule.name,
        "action": rule.action,
        "dryRun": spec.dry_run or ruleset.dry_run,
        "continue": spec.continue_,
        "reads": sorted(rule.reads),
        # Whether a failure callback carries all it reads (rules/callback.py).
        "decidableFromCallback": rule.reads <= CARRIED,
    }
    if rule.batch is not None:
        step["call"] = recovery_call(rule, str(message.get("dlqId", "")), header_prefix)
        step["batch"] = {"maxSize": rule.batch.max_size, "maxWaitSeconds": rule.batch.max_wait}
        if spec.budget:
            step["budget"] = {
                "maxRecoveries": spec.budget.max_recoveries,
                "withinSeconds": spec.budget.within,
                "counts": BUDGET_COUNTS,
            }
    elif rule.action == "remove-endpoint":
        step.update(_removal(rule, message))
    elif spec.notify is not None:
        step["call"] = {"method": "POST", "url": spec.notify.url}
    else:
        step["call"] = None
    if step["dryRun"] and step.get("call"):
        step["note"] = "dry run: the call is recorded, not made"
    return step


def _removal(rule: Rule, message: Mapping[str, Any]) -> dict[str, Any]:
    spec = rule.spec
    group = message.get("topicName")
    if not isinstance(group, str) or not group:
        return {"call": None, "note": "the message has no topicName: no URL Group to act on"}
    name, url = message.get("endpointName"), message.get("url")
    endpoint = {"name": name} if isinstance(name, str) and name else {"url": url}
    threshold = spec.threshold
    condition = (
        f"after {counted(threshold.failures, 'failure')} within {threshold.within:g}s"
        if threshold
        else ""
    )
    if spec.keep_last_endpoint:
        condition += ", unless it is the group's last endpoint (keepLastEndpoint)"
    return {
        "call": {
            "method": "DELETE",
            "path": f"/v2/topics/{quote(group, safe='')}/endpoints",
            "body": {"endpoints": [endpoint]},
        },
        "when": condition,
    }
