"""What the pipeline does with a decision: pure, so that it can be read and tested alone.

A resume or restart becomes `decided` and waits for its batch; everything else ends
here: `skipped` (ignore, no rule, not a workflow run), `dry-run` (the call it would
have made is recorded instead), `done` for notify (its notification queued with the
outcome, see daemon/notify), `done` for remove-endpoint (its failure counted as the
outcome settles, see daemon/endpoints). Every notify rule matched, deciding or with
`continue`, adds its notification to the outcome.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from daemon.endpoints.failures import endpoint_failure
from daemon.notify.summary import notices, receiver_of
from daemon.rules import Decision, Rule, Ruleset
from daemon.rules.explain import recovery_call
from daemon.rules.model import RECOVERIES
from daemon.store.records import Budget, Outcome

# The facts `outcome_of` reads for a rule's action, beyond those its match reads: a
# recovery's workflow run and fingerprint, the endpoint a remove-endpoint counts. A
# decision made without them (from a callback that lacks one) would not be the same.
_ACTED_ON: Mapping[str, frozenset[str]] = {
    **dict.fromkeys(RECOVERIES, frozenset({"workflow", "workflowRunId", "url", "body"})),
    "remove-endpoint": frozenset({"topicName", "endpointName", "url", "responseStatus"}),
}


def reads(decision: Decision, ruleset: Ruleset) -> frozenset[str]:
    """Every fact `decision` and its outcome depend on."""
    rule = decision.rule
    acted_on = _ACTED_ON.get(rule.action, frozenset()) if rule else frozenset()
    return ruleset.reads(decision) | acted_on


def fingerprint(facts: Mapping[str, Any]) -> str:
    """What a new run of the same workflow repeats: its url and its body. It tells apart
    the dlqIds of one batch when their new runs fail again (see store/sqlite/lineage.py)."""
    parts = (facts.get("url"), facts.get("body"), facts.get("bodyBase64"))
    text = "\n".join(part if isinstance(part, str) else "" for part in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


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
        # A recovery rule's overrides, whatever becomes of it (a dry run, a budget): what
        # a replayed or shadow decision is compared with (rules/shadow.py).
        "overrides": rule.overrides_key,
        "workflow_run_id": run_id if isinstance(run_id, str) else None,
        "fingerprint": fingerprint(facts),
        "calls": calls,
        "notifications": notices(
            dlq_id, decision, facts, dry_run=dry_run or ruleset.dry_run, now=now
        ),
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
            budget=Budget(budget.max_recoveries, now - budget.within) if budget else None,
            **common,
        )
    if rule.spec.notify is not None:
        # Final now: what is left, the delivery, has its own state, and the record follows
        # it (`failed` if it cannot be delivered; see store/sqlite/notify.py).
        receiver = receiver_of(rule.spec.notify.url)
        reason = f"rule {rule.name} queued a notification to {receiver}"
        return Outcome(dlq_id, "done", reason=reason, **common)
    if rule.action == "remove-endpoint":
        # The store counts the failure as it settles the outcome, and its count makes the
        # state and the reason (store/sqlite/endpoints.py); the removal has its own record.
        failure = endpoint_failure(rule, facts)
        if isinstance(failure, str):
            return Outcome(dlq_id, "skipped", reason=failure, **common)
        return Outcome(dlq_id, "done", endpoint_failure=failure, **common)
    return Outcome(dlq_id, "skipped", reason=f"rule {rule.name} says ignore", **common)


def _would_call(rule: Rule, dlq_id: str, header_prefix: str) -> dict[str, Any]:
    if rule.spec.notify is not None:
        return {"action": rule.action, "receiver": receiver_of(rule.spec.notify.url)}
    if rule.action not in RECOVERIES:
        return {"action": rule.action}
    return recovery_call(rule, dlq_id, header_prefix)
