"""Rule unit tests (docs/rules.md#rule-tests): a message in, the expected rule, action and headers.

A test file is checked like a rules file, every mistake with its line, and also against
the rules it tests: expecting a rule that does not exist is a typo, not a failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from daemon.foundation.words import with_guess
from daemon.rules.explain import call_headers
from daemon.rules.fields import facts
from daemon.rules.model import Action, Spec
from daemon.rules.ruleset import Decision, Ruleset
from daemon.rules.yamlfile import FileError, Loc, Mistake, Unreadable, read_document


class Expect(Spec):
    """What the decision must be. Only the keys given are checked; `rule: null` means no
    rule matches, and a header expected as null must be absent."""

    rule: str | None = None
    rules: tuple[str, ...] | None = None
    action: Action | None = None
    headers: dict[str, str | None] | None = None


class RuleTest(Spec):
    name: str = Field(min_length=1)
    message: dict[str, Any]
    expect: Expect


class TestFile(Spec):
    tests: tuple[RuleTest, ...] = Field(min_length=1)


@dataclass(frozen=True)
class Outcome:
    test: RuleTest
    line: int
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures


def load_tests(path: Path, ruleset: Ruleset) -> list[tuple[RuleTest, int]]:
    """The tests in `path` with their line numbers; FileError lists every mistake."""
    document = read_document(path)
    spec, problems = document.validate(TestFile)
    if spec is not None:
        problems += document.problems(_unknown_rules(spec, ruleset))
    if problems or spec is None:
        raise FileError(sorted(set(problems)))
    return [(test, document.problem(("tests", i), "").line) for i, test in enumerate(spec.tests)]


def tests_beside(rules: Path) -> Path:
    """Where the unit tests of the rules file `rules` are kept by convention: beside it,
    `rules.test.yaml` for `rules.yaml` (the console runs them against the rules in force)."""
    return rules.with_name(f"{rules.stem}.test{rules.suffix}")


@dataclass(frozen=True)
class Results:
    """The rule tests beside a rules file, run against a ruleset: `outcomes`, or why they
    could not run (`problem`: no file, or the mistakes in it)."""

    path: Path
    outcomes: tuple[Outcome, ...] = ()
    problem: str | None = None

    @property
    def failed(self) -> list[Outcome]:
        return [outcome for outcome in self.outcomes if not outcome.passed]


def results_beside(rules: Path, ruleset: Ruleset, header_prefix: str) -> Results:
    """The rule tests kept beside `rules` (tests_beside), run against `ruleset`."""
    path = tests_beside(rules)
    if not path.exists():
        return Results(path, problem="no rule tests there")
    try:
        tests = load_tests(path, ruleset)
    except FileError as exc:
        return Results(path, problem="; ".join(str(problem) for problem in exc.problems))
    except Unreadable as exc:
        return Results(path, problem=str(exc))
    return Results(path, tuple(run_tests(tests, ruleset, header_prefix)))


def run_tests(
    tests: list[tuple[RuleTest, int]], ruleset: Ruleset, header_prefix: str
) -> list[Outcome]:
    outcomes = []
    for test, line in tests:
        decision = ruleset.decide(facts(test.message, header_prefix))
        failures = tuple(_failures(test.expect, decision, header_prefix))
        outcomes.append(Outcome(test, line, failures))
    return outcomes


def _unknown_rules(spec: TestFile, ruleset: Ruleset) -> Iterator[Mistake]:
    names = [rule.name for rule in ruleset.rules]
    for index, test in enumerate(spec.tests):
        expect = test.expect
        loc: Loc = ("tests", index, "expect")
        if expect.rule is not None and expect.rule not in names:
            yield Mistake((*loc, "rule"), _no_rule(expect.rule, names, ruleset.source))
        for position, name in enumerate(expect.rules or ()):
            if name not in names:
                yield Mistake((*loc, "rules", position), _no_rule(name, names, ruleset.source))


def _no_rule(name: str, names: list[str], source: str) -> str:
    return with_guess(f"no rule is named {name!r} in {source}", name, names)


def _failures(expect: Expect, decision: Decision, header_prefix: str) -> Iterator[str]:
    final = decision.rule
    given = expect.model_fields_set
    got_rule = final.name if final else None
    if "rule" in given and expect.rule != got_rule:
        yield f"expected rule {_name(expect.rule)}, got {_name(got_rule)}"
    matched = tuple(rule.name for rule in decision.matched)
    if expect.rules is not None and expect.rules != matched:
        yield f"expected rules {list(expect.rules)}, got {list(matched)}"
    got_action = final.action if final else None
    if "action" in given and expect.action != got_action:
        yield f"expected action {_name(expect.action)}, got {_name(got_action)}"
    headers = {
        k.lower(): v for k, v in (call_headers(final, header_prefix) if final else {}).items()
    }
    for name, value in (expect.headers or {}).items():
        actual = headers.get(name.lower())
        if actual != value:
            wanted = "no such header" if value is None else repr(value)
            got = "none" if actual is None else repr(actual)
            yield f"expected header {name}: {wanted}, got {got}"


def _name(value: str | None) -> str:
    return "none (no rule matches)" if value is None else repr(value)
