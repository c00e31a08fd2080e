"""A rules file loaded, checked as a whole and compiled; and the decision it makes.

Loading reads the file once, reports every mistake in it (FileError) or returns a frozen
Ruleset whose conditions are compiled predicates. Deciding is pure: facts in, the
matching rules out, first match winning unless a rule says `continue`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon.rules.compiled import Compiled, compile_ruleset
from daemon.rules.conditions import Facts, Predicate, compile_match
from daemon.rules.model import (
    ACTION_KEYS,
    ACTION_NEEDS,
    RECOVERIES,
    Action,
    Batch,
    RulesFile,
    RuleSpec,
    SweepSpec,
)
from daemon.rules.yamlfile import (
    Document,
    FileError,
    Mistake,
    parse_document,
    read_document,
)

DEFAULT_BATCH = (50, 5.0)  # maxSize, maxWait in seconds, when neither rule nor defaults say
_COMMON_KEYS = frozenset({"name", "match", "action", "dryRun", "continue"})
_RULE_KEYS = frozenset(field.alias or name for name, field in RuleSpec.model_fields.items())


@dataclass(frozen=True)
class BatchPolicy:
    max_size: int
    max_wait: float  # seconds after a batch's first dlqId


@dataclass(frozen=True, eq=False)
class Rule:
    """A rule ready to decide: its validated spec and its compiled condition."""

    spec: RuleSpec
    matches: Predicate
    batch: BatchPolicy | None  # resume and restart only
    # The message's fields its `match` tests: what a message must carry for this rule to
    # be decided on (RECOVERYD_FETCH=needed decides from the callback when it has them).
    reads: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def action(self) -> Action:
        return self.spec.action

    @functools.cached_property
    def overrides_key(self) -> str | None:
        """A recovery's overrides as canonical JSON: equal overrides, equal text, one
        batch; what a recorded decision and a replayed or shadow one are compared by.
        None for the other actions, which send none."""
        if self.action not in RECOVERIES:
            return None
        overrides = self.spec.overrides
        wire = overrides.model_dump(by_alias=True, exclude_defaults=True) if overrides else {}
        return json.dumps(wire, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Decision:
    """The rules a message matched, in order; the last one ended the evaluation.
    `evaluated`: how many of the rules, from the first, were tested to reach it."""

    matched: tuple[Rule, ...]
    evaluated: int = 0

    @property
    def rule(self) -> Rule | None:
        return self.matched[-1] if self.matched else None


@dataclass(frozen=True, eq=False)
class Ruleset:
    rules: tuple[Rule, ...]
    sweeps: tuple[SweepSpec, ...]
    dry_run: bool  # defaults.dryRun
    default_batch: BatchPolicy  # defaults.batch, for dlqIds whose rule is gone
    digest: str  # sha256 of the file's bytes, to tell versions apart
    source: str
    text: str = field(repr=False)  # what was compiled: replayed or promoted as it was checked

    def __post_init__(self) -> None:
        self._compiled, self._decisions  # noqa: B018 (compiled as the file loads, not later)

    def decide(self, facts: Facts) -> Decision:
        """The decision, by the rules compiled into one function (rules/compiled.py)."""
        continued: list[int] = []
        last = self._compiled(facts, continued)
        if not continued:
            return self._decisions[last]
        matched = [self.rules[index] for index in continued]
        if last < 0:
            return Decision(tuple(matched), len(self.rules))
        return Decision((*matched, self.rules[last]), last + 1)

    def interpret(self, facts: Facts) -> Decision:
        """The same decision, rule by rule through each one's own predicate: the
        reference the compiled rules are tested against, and what `explain` walks."""
        matched = []
        for tested, rule in enumerate(self.rules, start=1):
            if rule.matches(facts):
                matched.append(rule)
                if not rule.spec.continue_:
                    return Decision(tuple(matched), tested)
        return Decision(tuple(matched), len(self.rules))

    @functools.cached_property
    def _compiled(self) -> Compiled:
        return compile_ruleset(
            [rule.spec.match for rule in self.rules], [rule.spec.continue_ for rule in self.rules]
        )

    @functools.cached_property
    def _decisions(self) -> dict[int, Decision]:
        """The decision each rule makes alone (-1: none matched), made once."""
        decisions = {-1: Decision((), len(self.rules))}
        for index, rule in enumerate(self.rules):
            decisions[index] = Decision((rule,), index + 1)
        return decisions

    def reads(self, decision: Decision) -> frozenset[str]:
        """The fields the rules tested to reach `decision` read: what a message must
        carry for the same decision to be made from it."""
        return self._reads_of_first[decision.evaluated]

    @functools.cached_property
    def _reads_of_first(self) -> tuple[frozenset[str], ...]:
        """Item n: the fields the first n rules read."""
        unions = [frozenset[str]()]
        for rule in self.rules:
            unions.append(unions[-1] | rule.reads)
        return tuple(unions)

    @functools.cached_property
    def reads_all(self) -> frozenset[str]:
        """The fields any of the rules reads: the bulky facts a decision keeps (fields.kept)."""
        return self._reads_of_first[-1]

    def rule(self, name: str) -> Rule | None:
        return next((rule for rule in self.rules if rule.name == name), None)

    def longest_budget_window(self) -> float:
        """The longest `budget.within` of any rule, seconds (0 with no budget): records
        of recoveries that recent still count against a budget, so retention keeps them."""
        return max((rule.spec.budget.within for rule in self.rules if rule.spec.budget),
                   default=0.0)  # fmt: skip


def load_rules(path: Path, name: str | None = None) -> Ruleset:
    """The rules file at `path`; Unreadable, or FileError with every mistake in it."""
    return compile_rules(read_document(path, name))


def parse_rules(text: str, file: str = "rules.yaml") -> Ruleset:
    return compile_rules(parse_document(text, file))


def compile_rules(document: Document) -> Ruleset:
    found: list[Mistake] = []
    raw_rules = _items(document.data, "rules")
    predicates: dict[int, Predicate] = {}
    reads: dict[int, frozenset[str]] = {}
    for index, rule in raw_rules:
        if "match" in rule:
            here = ("rules", index, "match")
            predicates[index], mistakes, reads[index] = compile_match(rule["match"], here)
            found += mistakes
        found += _action_problems(index, rule)
    found += _duplicate_names(raw_rules, "rules")
    found += _duplicate_names(_items(document.data, "sweeps"), "sweeps")
    spec, problems = document.validate(RulesFile)
    problems += document.problems(found)
    if problems or spec is None:
        raise FileError(sorted(set(problems)))
    default_batch = spec.defaults.batch or Batch()
    rules = tuple(
        Rule(
            spec=rule,
            matches=predicates[index],
            batch=_batch(rule.batch, default_batch) if rule.action in RECOVERIES else None,
            reads=reads[index],
        )
        for index, rule in enumerate(spec.rules)
    )
    return Ruleset(
        rules=rules,
        sweeps=spec.sweeps,
        dry_run=spec.defaults.dry_run,
        default_batch=_batch(None, default_batch),
        digest=hashlib.sha256(document.text.encode()).hexdigest(),
        source=document.file,
        text=document.text,
    )


def _items(data: Any, key: str) -> list[tuple[int, dict[str, Any]]]:
    """The mappings of the list under `key`, with their indexes; the rest is for pydantic
    to report."""
    listed = data.get(key) if isinstance(data, dict) else None
    if not isinstance(listed, list):
        return []
    return [(index, item) for index, item in enumerate(listed) if isinstance(item, dict)]


def _action_problems(index: int, rule: Mapping[str, Any]) -> Iterator[Mistake]:
    """Keys the rule's action does not take, and the ones it needs but lacks."""
    action = rule.get("action")
    if not isinstance(action, str) or action not in ACTION_KEYS:
        return  # pydantic names the valid actions
    takes = ACTION_KEYS[action]
    for key in rule:
        if key not in _COMMON_KEYS and key not in takes and key in _RULE_KEYS:
            users = sorted(name for name, keys in ACTION_KEYS.items() if key in keys)
            message = f"{key} applies to {' and '.join(users)} rules, not to {action}"
            yield Mistake(("rules", index, key), message, at_key=True)
    for key in sorted(ACTION_NEEDS.get(action, frozenset()) - set(rule)):
        yield Mistake(("rules", index, key), f"is required for a {action} rule")


def _duplicate_names(items: list[tuple[int, dict[str, Any]]], section: str) -> Iterator[Mistake]:
    first: dict[str, int] = {}
    for index, item in items:
        name = item.get("name")
        if not isinstance(name, str):
            continue
        if name in first:
            message = (
                f"{name!r} is already the name of {section}[{first[name]}]; names must be unique"
            )
            yield Mistake((section, index, "name"), message)
        else:
            first[name] = index


def _batch(batch: Batch | None, defaults: Batch) -> BatchPolicy:
    batch = batch or Batch()
    return BatchPolicy(
        max_size=batch.max_size or defaults.max_size or DEFAULT_BATCH[0],
        max_wait=_first_set(batch.max_wait, defaults.max_wait, DEFAULT_BATCH[1]),
    )


def _first_set(*values: float | None) -> float:
    return next(value for value in values if value is not None)
