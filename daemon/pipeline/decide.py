"""What the pipeline does with a decision: pure, so that it can be read and tested alone.

A resume or restart becomes `decided` and waits for its batch; everything else ends
here: `skipped` (ignore, no rule, not a workflow run), `dry-run` (the call it would
have made is recorded instead).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from daemon.rules import Decision, Rule, Ruleset
from daemon.rules.explain import recovery_call
from daemon.rules.model import NOT_CARRIED_OUT, RECOVERIES
from daemon.store.records import Budget, Outcome


def overrides_key(rule: Rule) -> str:
    """The rule's overrides as canonical JSON: equal overrides, equal text, one batch."""
    overrides = rule.spec.overrides
    wire = overrides.model_dump(by_alias=True, exclude_defaults=True) if overrides else {}
    return json.dumps(wire, sort_keys=True, separators=(",", ":"))


def outcome_of(
    dlq_id: str,
    decision: Decision,
    ruleset: Ruleset,
    facts: Mapping[str, Any],
    *,
    dry_run: bool,
    header_prefix: str,
    now: float,
    calls: tuple[dict[str, Any], ...],
) -> Outcome:
    """The outcome for a fetched DLQ message that `ruleset` decided on. `dry_run` is
    RECOVERYD_DRY_RUN; the rules file and the rule can ask for a dry run too."""
    rule = decision.rule
    if rule is None:
        return Outcome(dlq_id, "skipped", reason="no rule matched", calls=calls)
    run_id = facts.get("workflowRunId")
    common: dict[str, Any] = {
        "rule": rule.name,
        "action": rule.action,
        "matched": tuple(matched.name for matched in decision.matched),
        "workflow_run_id": run_id if isinstance(run_id, str) else None,
        "calls": calls,
    }
    if dry_run or ruleset.dry_run or rule.spec.dry_run:
        would = _would_call(rule, dlq_id, header_prefix)
        return Outcome(dlq_id, "dry-run", reason="dry run: nothing changed", would=would, **common)
    if rule.action in RECOVERIES:
        if not facts.get("workflow"):
            reason = f"{rule.action} applies to workflow runs, and this message is not one"
            return Outcome(dlq_id, "skipped", reason=reason, **common)
        budget = rule.spec.budget
        return Outcome(
            dlq_id,
            "decided",
            overrides=overrides_key(rule),
            budget=Budget(budget.max_recoveries, now - budget.within) if budget else None,
            **common,
        )
    if rule.action in NOT_CARRIED_OUT:
        reason = f"{rule.action} is recorded but not carried out by this version"
        return Outcome(dlq_id, "skipped", reason=reason, **common)
    return Outcome(dlq_id, "skipped", reason=f"rule {rule.name} says ignore", **common)


def _would_call(rule: Rule, dlq_id: str, header_prefix: str) -> dict[str, Any]:
    if rule.action not in RECOVERIES:
        return {"action": rule.action}
    return recovery_call(rule, dlq_id, header_prefix)
