"""A replay's report (rules/replay.py) as people read it: a table for the terminal, and
Markdown for a pull request's comment. dlqIds are untrusted text: Markdown escapes them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from daemon.foundation.words import counted

FORMATS = ("table", "json", "markdown")


def rendered(report: dict[str, Any], form: str) -> str:
    """The report in `form`, one of FORMATS."""
    if form == "json":
        return json.dumps(report, indent=2)
    return markdown(report) if form == "markdown" else table(report)


def summary(report: dict[str, Any]) -> str:
    """One line: what was replayed, on what, and how much would change."""
    candidate = report["candidate"]
    return (
        f"{candidate['source']} (sha256 {candidate['sha256'][:12]}) replayed on "
        f"{counted(report['examined'], 'record')}{_scope(report)}: {verdict(report)}"
    )


def verdict(report: dict[str, Any]) -> str:
    """`nothing would change`, or how many decisions and budget effects would."""
    budget = report["budget"]
    effects = budget["stopped"]["count"] + budget["recoveredAgain"]["count"]
    if not report["changed"] and not effects:
        return "nothing would change"
    said = f"{counted(report['changed'], 'decision')} would change"
    return said + (f", {counted(effects, 'budget effect')}" if effects else "")


def _scope(report: dict[str, Any]) -> str:
    since = "" if report["since"] is None else f" received since {_iso(report['since'])}"
    only = "" if report["rule"] is None else f" (rule {report['rule']}, before or after)"
    return since + only


def table(report: dict[str, Any]) -> str:
    lines = [summary(report)]
    if report["groups"]:
        rows = [("BEFORE (RULE ACTION)", "AFTER (RULE ACTION)", "RECORDS", "EXAMPLES")]
        rows += [
            (_decided(group["before"]), _decided(group["after"]), str(group["count"]),
             ", ".join(group["examples"]))
            for group in report["groups"]
        ]  # fmt: skip
        widths = [max(len(row[at]) for row in rows) for at in range(3)]
        lines += ["", *("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)),
                                   row[3]]).rstrip() for row in rows)]  # fmt: skip
    for change in report["overrides"]:
        lines += ["", f"overrides {_moved(change)}: {_examples(change)}"]
        lines += [f"  {key}: {old} -> {new}" for key, old, new in _differences(change)]
    lines += ["", *_budget_lines(report, str)]
    lines += _not_replayable(report, str)
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    candidate = report["candidate"]
    lines = [
        f"### Replay of {_md(candidate['source'])} (sha256 `{candidate['sha256'][:12]}`)",
        "",
        f"**{verdict(report).capitalize()}**, of "
        f"{counted(report['examined'], 'record')}{_md(_scope(report))}.",
    ]
    if report["groups"]:
        lines += ["", "| Before | After | Records | Examples |", "|---|---|---:|---|"]
        lines += [
            f"| {_md(_decided(group['before']))} | {_md(_decided(group['after']))} | "
            f"{group['count']} | {', '.join(_md(dlq_id) for dlq_id in group['examples'])} |"
            for group in report["groups"]
        ]
    if report["overrides"]:
        lines += ["", "#### Overrides that differ", ""]
        lines += ["| Rule | Override | Before | After | Records |", "|---|---|---|---|---:|"]
        for change in report["overrides"]:
            lines += [
                f"| {_md(_moved(change))} | {_md(key)} | {_md(old)} | {_md(new)} | "
                f"{change['count']} |"
                for key, old, new in _differences(change)
            ]
    lines += ["", "#### Budgets", "", *(f"- {line}" for line in _budget_lines(report, _md))]
    lines += [f"- {line}" for line in _not_replayable(report, _md)]
    return "\n".join(lines)


def _budget_lines(report: dict[str, Any], escape: Callable[[str], str]) -> Iterator[str]:
    budget = report["budget"]
    stopped, again = budget["stopped"], budget["recoveredAgain"]
    yield (f"stopped by the candidate's budgets (not by the live ones): {stopped['count']}"
           + _listed(stopped, escape))  # fmt: skip
    yield (f"recovered again (the live budgets stopped them): {again['count']}"
           + _listed(again, escape))  # fmt: skip
    yield f"stopped by the live budgets: {budget['liveStopped']}"


def _not_replayable(report: dict[str, Any], escape: Callable[[str], str]) -> list[str]:
    missing = report["notReplayable"]
    if not missing["count"]:
        return []
    fields = ", ".join(missing["fields"])
    return [
        f"not replayable: {missing['count']} (the candidate reads {fields}, which these "
        f"records did not keep)" + _listed(missing, escape)
    ]


def _listed(tally: dict[str, Any], escape: Callable[[str], str]) -> str:
    return (
        f" ({', '.join(escape(dlq_id) for dlq_id in tally['examples'])})"
        if tally["examples"]
        else ""
    )


def _examples(change: dict[str, Any]) -> str:
    return f"{counted(change['count'], 'record')} ({', '.join(change['examples'])})"


def _decided(side: dict[str, Any]) -> str:
    return "no rule" if side["rule"] is None else f"{side['rule']} {side['action']}"


def _moved(change: dict[str, Any]) -> str:
    before, after = _decided(change["before"]), _decided(change["after"])
    return before if before == after else f"{before} -> {after}"


def _differences(change: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(override, before, after) for each override the two sides set differently."""
    old, new = change["before"]["overrides"], change["after"]["overrides"]
    for key in sorted(old.keys() | new.keys()):
        if old.get(key) != new.get(key):
            yield key, _value(old, key), _value(new, key)


def _value(overrides: dict[str, Any], key: str) -> str:
    if key not in overrides:
        return "(not set)"
    return json.dumps(overrides[key], separators=(",", ":"))


_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&])")


def _md(text: str) -> str:
    """Text set in Markdown as it is: its special characters escaped, lines joined."""
    return _SPECIAL.sub(r"\\\1", " ".join(text.splitlines()))


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
