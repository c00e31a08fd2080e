"""Replay (rules/replay.py): a candidate's decisions on recorded ones, and how they differ."""

from __future__ import annotations

from typing import Any

from daemon.rules import Ruleset, facts, parse_rules
from daemon.rules.fields import kept
from daemon.rules.replay import Replay, replay, would_change
from daemon.store.records import ReplayRow, over_budget_reason

LIVE = parse_rules("""\
version: 1
rules:
  - name: restart-billing
    match: {labels: {any: [billing]}}
    action: restart
    overrides: {retries: 5, delay: 30s}
  - name: resume-the-rest
    match: {workflow: true}
    action: resume
  - name: everything-else
    match: {}
    action: ignore
""")

BILLING_RESUMED = parse_rules("""\
version: 1
rules:
  - name: restart-billing
    match: {labels: {any: [billing]}}
    action: resume
    overrides: {retries: 3, delay: 30s}
  - name: resume-the-rest
    match: {workflow: true}
    action: resume
  - name: everything-else
    match: {}
    action: ignore
""")

ONCE_A_DAY = parse_rules("""\
version: 1
rules:
  - name: resume-once
    match: {workflow: true}
    action: resume
    budget: {maxRecoveries: 1, within: 1d}
""")


def message(run: str | None = "wfr_1", **fields: Any) -> dict[str, Any]:
    header = {"Service-Workflow-RunId": [run]} if run else {}
    return {"url": "https://app.example.com/wf", "header": header, **fields}


def recorded(
    dlq_id: str,
    at: float,
    sent: dict[str, Any],
    live: Ruleset = LIVE,
    *,
    state: str | None = None,
    reason: str | None = None,
    key: str | None = None,
) -> ReplayRow:
    """The row the store keeps of `sent` decided by `live` at `at` (as pipeline/decide.py
    records it): `state` when not the decision's own."""
    found = facts(sent)
    rule = live.decide(found).rule
    recovery = rule is not None and rule.action in ("resume", "restart")
    return ReplayRow(
        dlq_id=dlq_id,
        received_at=at,
        state=state or ("done" if recovery else "skipped"),
        reason=reason,
        rule=rule and rule.name,
        action=rule and rule.action,
        overrides=rule.overrides_key if rule is not None else None,
        workflow_key=key or found.get("workflowRunId"),
        facts=kept(found, live.reads_all),
    )


def mixed(count: int) -> list[ReplayRow]:
    """`count` records of each: billing runs, other runs, plain messages."""
    rows = []
    for i in range(count):
        rows.append(recorded(f"billing-{i}", 3 * i, message(f"b{i}", labels=["billing"])))
        rows.append(recorded(f"other-{i}", 3 * i + 1, message(f"o{i}")))
        rows.append(recorded(f"plain-{i}", 3 * i + 2, message(None)))
    return rows


def test_the_rules_in_force_change_nothing() -> None:
    """Replaying the rules that decided the records reports every one, none changed."""
    report = replay(LIVE, mixed(4))

    assert (report["examined"], report["changed"]) == (12, 0)
    assert report["groups"] == report["overrides"] == []
    assert not would_change(report)


def test_changed_decisions_are_grouped_by_rule_and_action_before_and_after() -> None:
    """The billing records alone change, restart to resume, with example dlqIds."""
    report = replay(BILLING_RESUMED, mixed(3))

    assert (report["examined"], report["changed"]) == (9, 3)
    assert report["groups"] == [
        {
            "before": {"rule": "restart-billing", "action": "restart"},
            "after": {"rule": "restart-billing", "action": "resume"},
            "count": 3,
            "examples": ["billing-0", "billing-1", "billing-2"],
        }
    ]
    assert would_change(report)


def test_overrides_that_differ_are_reported_with_both_sides() -> None:
    """Each side's overrides are given whole, for the records whose overrides differ."""
    [change] = replay(BILLING_RESUMED, mixed(2))["overrides"]

    assert change["before"] == {
        "rule": "restart-billing", "action": "restart", "overrides": {"retries": 5, "delay": "30s"}
    }  # fmt: skip
    assert change["after"] == {
        "rule": "restart-billing", "action": "resume", "overrides": {"retries": 3, "delay": "30s"}
    }  # fmt: skip
    assert (change["count"], change["examples"]) == (2, ["billing-0", "billing-1"])


def test_only_overrides_changing_is_a_change() -> None:
    """Same rule, same action, other overrides: changed, in overrides but no group."""
    candidate = parse_rules("""\
version: 1
rules:
  - name: restart-billing
    match: {labels: {any: [billing]}}
    action: restart
    overrides: {retries: 9}
  - name: everything-else
    match: {}
    action: ignore
""")
    rows = [recorded("billing-0", 0, message("b0", labels=["billing"]))]

    report = replay(candidate, rows)

    assert report["changed"] == 1
    assert report["groups"] == []
    assert [change["after"]["overrides"] for change in report["overrides"]] == [{"retries": 9}]


def test_examples_are_at_most_the_number_asked_for() -> None:
    """A group counts every record and lists the first `examples` of them."""
    [group] = replay(BILLING_RESUMED, mixed(10), examples=2)["groups"]

    assert (group["count"], group["examples"]) == (10, ["billing-0", "billing-1"])


def test_a_rule_reports_the_records_it_decided_before_or_would_decide_after() -> None:
    """--rule: the records that rule decided, and those it takes from other rules."""
    candidate = parse_rules("""\
version: 1
rules:
  - name: resume-the-rest
    match: {workflow: true}
    action: resume
  - name: everything-else
    match: {}
    action: ignore
""")
    rows = mixed(2)

    took = replay(candidate, rows, rule="resume-the-rest")
    lost = replay(candidate, rows, rule="restart-billing")
    untouched = replay(candidate, rows, rule="everything-else")

    assert (took["examined"], took["changed"]) == (4, 2)
    assert (lost["examined"], lost["changed"]) == (2, 2)
    assert (untouched["examined"], untouched["changed"]) == (2, 0)


def test_the_candidates_budget_stops_a_workflow_recovered_before_within_its_window() -> None:
    """A second recovery of one workflow within a day is stopped; a day later it is not."""
    rows = [
        recorded("first", 0, message("wfr_a")),
        recorded("again", 3600, message("wfr_a2"), key="wfr_a"),
        recorded("next-day", 3600 + 86401, message("wfr_a3"), key="wfr_a"),
        recorded("another", 3601, message("wfr_b")),
    ]

    report = replay(ONCE_A_DAY, rows)

    assert report["budget"]["stopped"] == {"count": 1, "examples": ["again"]}
    assert would_change(report)


def test_a_recovery_the_live_budget_stopped_is_recovered_again_without_one() -> None:
    """The live budget's stops are counted, and those a candidate would recover listed."""
    stop = over_budget_reason("wfr_a", "wfr_a2", 1)
    rows = [
        recorded("first", 0, message("wfr_a"), ONCE_A_DAY),
        recorded("again", 60, message("wfr_a2"), ONCE_A_DAY, state="skipped", reason=stop,
                 key="wfr_a"),
    ]  # fmt: skip

    same = replay(ONCE_A_DAY, rows)
    unbudgeted = replay(LIVE, rows)

    assert same["budget"]["liveStopped"] == unbudgeted["budget"]["liveStopped"] == 1
    assert same["budget"]["recoveredAgain"]["count"] == 0
    assert not would_change(same)
    assert unbudgeted["budget"]["recoveredAgain"] == {"count": 1, "examples": ["again"]}


def test_records_before_the_start_count_towards_budgets_only() -> None:
    """A recovery made before `since` spends the budget of one reported after it."""
    rows = [
        recorded("before", 0, message("wfr_a"), ONCE_A_DAY),
        recorded("after", 7200, message("wfr_a2"), ONCE_A_DAY, key="wfr_a"),
    ]

    report = replay(ONCE_A_DAY, rows, since=3600)

    assert report["examined"] == 1
    assert report["budget"]["stopped"] == {"count": 1, "examples": ["after"]}


def test_budgets_hold_only_the_recoveries_of_their_window() -> None:
    """A day of recoveries at most, however many records pass: memory stays flat."""
    replaying = Replay(ONCE_A_DAY)
    held = []
    for hour in range(24 * 10):
        replaying.add(recorded(f"h{hour}", hour * 3600.0, message(f"wfr_{hour}"), ONCE_A_DAY))
        held.append(replaying.held)

    assert max(held) <= 25
    assert replaying.report()["examined"] == 240


def test_a_candidate_reading_a_body_not_kept_cannot_replay_those_records() -> None:
    """The bodies are kept only when the live rules read them: such records are counted
    apart, with the field, and not as changes."""
    candidate = parse_rules("""\
version: 1
rules:
  - name: by-body
    match: {body: {contains: invoice}}
    action: resume
  - name: everything-else
    match: {}
    action: ignore
""")
    rows = [recorded("with-body", 0, message("wfr_a", body="invoice 7"))]

    report = replay(candidate, rows)

    assert report["notReplayable"] == {"fields": ["body"], "count": 1, "examples": ["with-body"]}
    assert report["changed"] == 0


def test_a_body_the_live_rules_read_was_kept_and_replays() -> None:
    """With a live rule reading the body, a candidate testing it decides from it."""
    live = parse_rules("""\
version: 1
rules:
  - name: by-body
    match: {body: {contains: receipt}}
    action: ignore
  - name: resume-the-rest
    match: {workflow: true}
    action: resume
""")
    candidate = parse_rules("""\
version: 1
rules:
  - name: by-body
    match: {body: {contains: invoice}}
    action: ignore
  - name: resume-the-rest
    match: {workflow: true}
    action: resume
""")
    rows = [recorded("with-body", 0, message("wfr_a", body="invoice 7"), live)]

    report = replay(candidate, rows)

    assert report["notReplayable"]["count"] == 0
    assert [group["after"]["rule"] for group in report["groups"]] == ["by-body"]
