"""Rule decisions/s: recoveryd's compiled rules against its interpreter and plain Python.

Two rules files (bench.rulecases): the worst case, 200 rules of which only the last
matches the message, and 20 typical rules over a mix of 100 realistic messages. Each is
timed six ways, in this one process: recoveryd's `Ruleset.decide` (the rules compiled
into one function, rules/compiled.py) on facts built once; `facts()` then `decide()` per
message, as the daemon does; the same two with `Ruleset.interpret`, the interpreter
(one predicate per rule, closures per condition; what `explain` walks); and the same two
with the baseline: one plain Python function of `if`/`and` chains over the same
conditions written for the file (bench.plainrules), about the best CPython can do.
Before timing, every message must get the same decision from all three.
Measurements of `--seconds` each alternate between the contenders, round after round,
so that drift on a noisy machine hits them alike; a figure is the median of the rounds.
Target: >= 25,000 decisions/s for the 200-rule worst case with facts(), per core (this
process runs one thread). `--profile` runs cProfile over the 200-rule decide() loop.
Run: python -m bench.rules [--seconds S] [--repeat N] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import linecache
import os
import platform
import pstats
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import rulecases
from bench.options import positive_float, positive_int
from bench.plainrules import compile_plain
from daemon.rules import Ruleset, facts, parse_rules

HEADER_PREFIX = "Service"
TARGET_RATE = 25_000  # decisions/s per core, 200-rule worst case, facts() included
WORST_RULES = 200
PASS_SIZE = 100  # decisions between two looks at the clock
TOP = 15
_ROOT = Path(__file__).resolve().parent.parent


class BenchmarkError(Exception):
    """recoveryd and the baseline disagree, or a case is not what it claims to be."""


@dataclass(frozen=True)
class Options:
    seconds: float
    repeat: int
    profile: bool


@dataclass(frozen=True)
class Contender:
    """One way of deciding; `run` makes one pass over its inputs and returns how many
    decisions it made."""

    name: str
    run: Callable[[], int]


@dataclass(frozen=True)
class Case:
    label: str  # short, for the rounds
    title: str
    ruleset: Ruleset
    baseline: Callable[[Mapping[str, Any]], int | None]
    messages: list[dict[str, Any]]

    def contenders(self) -> list[Contender]:
        """Baseline, interpreter and compiled on ready facts, then each with facts() per
        message."""
        messages = self.messages * (PASS_SIZE // len(self.messages))
        ready = [facts(message, HEADER_PREFIX) for message in messages]
        ways = {"baseline": self.baseline, "interpret()": self.ruleset.interpret,
                "decide()": self.ruleset.decide}  # fmt: skip
        return [Contender(name, _over(way, ready)) for name, way in ways.items()] + [
            Contender(_WITH_FACTS[name], _with_facts(way, messages)) for name, way in ways.items()
        ]


_WITH_FACTS = {
    "baseline": "baseline + facts()",
    "interpret()": "facts() + interpret()",
    "decide()": "facts() + decide()",
}


def _over(decide: Callable[[Any], object], ready: list[dict[str, Any]]) -> Callable[[], int]:
    def run() -> int:
        for item in ready:
            decide(item)
        return len(ready)

    return run


def _with_facts(
    decide: Callable[[Any], object], messages: list[dict[str, Any]]
) -> Callable[[], int]:
    def run() -> int:
        for message in messages:
            decide(facts(message, HEADER_PREFIX))
        return len(messages)

    return run


def rate(run: Callable[[], int], seconds: float) -> float:
    """Decisions/s of `run`, called over and over for `seconds`."""
    decisions = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        decisions += run()
        now = time.perf_counter()
        if now >= deadline:
            return decisions / (now - start)


def worst_case() -> Case:
    case = rulecases.worst_case(WORST_RULES)
    ruleset = parse_rules(case.text, "worst-case.yaml")
    baseline, _ = compile_plain([rule["match"] for rule in case.rules])
    message = rulecases.worst_message()
    decision = ruleset.decide(facts(message, HEADER_PREFIX))
    if decision.matched != (ruleset.rules[-1],):
        names = [rule.name for rule in decision.matched]
        raise BenchmarkError(f"the worst-case message must match the last rule only, not {names}")
    positions = Counter(position + 1 for position in case.failing_at)
    sizes = [len(rule["match"]) for rule in case.rules[:-1]]
    print(
        f"worst case: {len(sizes)} rules that fail, {min(sizes)}-{max(sizes)} conditions each "
        f"({statistics.mean(sizes):.1f} on average), failing at condition "
        + ", ".join(f"#{number}: {positions[number]}" for number in sorted(positions))
        + f"; then {ruleset.rules[-1].name!r} matches"
    )
    title = f"{WORST_RULES} rules, only the last matches"
    return Case(f"{WORST_RULES} rules", title, ruleset, baseline, [message])


def typical_case() -> Case:
    ruleset = parse_rules(rulecases.TYPICAL_RULES, "typical.yaml")
    baseline, _ = compile_plain([rule.spec.match for rule in ruleset.rules])
    messages = rulecases.message_mix()
    decided = Counter(_decided(ruleset, message) for message in messages)
    print(
        f"typical case: {len(ruleset.rules)} rules over {len(messages)} messages, decided by "
        + ", ".join(f"{name} {count}" for name, count in decided.most_common())
    )
    return Case(
        f"{len(ruleset.rules)} rules",
        f"{len(ruleset.rules)} typical rules, {len(messages)}-message mix",
        ruleset,
        baseline,
        messages,
    )


def _decided(ruleset: Ruleset, message: Mapping[str, Any]) -> str:
    final = ruleset.decide(facts(message, HEADER_PREFIX)).rule
    return final.name if final else "(none)"


def check_agreement(case: Case) -> None:
    """Both sides must pick the same rule for every message, or the figures compare
    different work."""
    if any(rule.spec.continue_ for rule in case.ruleset.rules):
        raise BenchmarkError(f"{case.title}: the baseline does not do `continue`")
    for message in case.messages:
        known = facts(message, HEADER_PREFIX)
        compiled, interpreted = case.ruleset.decide(known), case.ruleset.interpret(known)
        if compiled != interpreted:
            raise BenchmarkError(
                f"{case.title}: message {message.get('dlqId')}: the compiled rules decided "
                f"{compiled}, the interpreter {interpreted}"
            )
        final = compiled.rule
        expected = None if final is None else case.ruleset.rules.index(final)
        got = case.baseline(known)
        if got != expected:
            raise BenchmarkError(
                f"{case.title}: message {message.get('dlqId')}: recoveryd decided rule "
                f"{expected}, the baseline {got}"
            )


def measure(cases: Sequence[Case], options: Options) -> dict[str, dict[str, list[float]]]:
    """Rates per case and contender, rounds alternating the contenders' order."""
    lineups = {case.title: case.contenders() for case in cases}
    labels = {case.title: case.label for case in cases}
    for contenders in lineups.values():  # warm-up: caches, branch predictors, the allocator
        for contender in contenders:
            rate(contender.run, min(options.seconds, 0.2))
    rates: dict[str, dict[str, list[float]]] = {
        title: {contender.name: [] for contender in contenders}
        for title, contenders in lineups.items()
    }
    for number in range(1, options.repeat + 1):
        for title, contenders in lineups.items():
            order = contenders if number % 2 else contenders[::-1]
            for contender in order:
                rates[title][contender.name].append(rate(contender.run, options.seconds))
            figures = "  ".join(
                f"{contender.name} {rates[title][contender.name][-1]:,.0f}"
                for contender in contenders
            )
            print(f"round {number}  {labels[title]:<9} {figures}", flush=True)
    return rates


def print_summary(rates: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """The median of each contender, and recoveryd's as a share of the baseline's."""
    medians = {
        title: {name: statistics.median(values) for name, values in contenders.items()}
        for title, contenders in rates.items()
    }
    print(f"\n{'':<32} {'decisions/s':>12} {'us/decision':>12}   {'min .. max of rounds':>22}")
    for title, contenders in rates.items():
        print(title)
        for name, values in contenders.items():
            median = medians[title][name]
            spread = f"{min(values):,.0f} .. {max(values):,.0f}"
            print(f"  {name:<30} {median:12,.0f} {1e6 / median:12.2f}   {spread:>22}")
        m = medians[title]
        print(
            f"  compiled / baseline: decide() {m['decide()'] / m['baseline']:.3f}, with facts() "
            f"{m['facts() + decide()'] / m['baseline + facts()']:.3f}; compiled / interpreter: "
            f"decide() {m['decide()'] / m['interpret()']:.2f}x, with facts() "
            f"{m['facts() + decide()'] / m['facts() + interpret()']:.2f}x"
        )
    return medians


def print_target(medians: dict[str, float]) -> None:
    measured = medians["facts() + decide()"]
    verdict = "met" if measured >= TARGET_RATE else "missed"
    print(
        f"\ntarget >= {TARGET_RATE:,} decisions/s per core for the {WORST_RULES}-rule worst "
        f"case: {verdict} (facts() + decide(): {measured:,.0f}/s; decide() alone: "
        f"{medians['decide()']:,.0f}/s; the interpreter, facts() + interpret(): "
        f"{medians['facts() + interpret()']:,.0f}/s; this process runs one thread, so its "
        "rate is per core)"
    )


def profile(case: Case, seconds: float) -> None:
    """cProfile over the decide() loop of `case`, and its top functions by own time."""
    messages = case.messages * (PASS_SIZE // len(case.messages))
    ready = [facts(message, HEADER_PREFIX) for message in messages]
    run = _over(case.ruleset.decide, ready)
    profiler = cProfile.Profile()
    decisions = 0
    deadline = time.perf_counter() + seconds
    profiler.enable()
    while time.perf_counter() < deadline:
        decisions += run()
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(
        f"\ncProfile of {case.title}, decide() only: {decisions:,} decisions in {total:.2f} s "
        "of profiled time (cProfile charges every Python call, so small functions weigh more "
        "than they do unprofiled: read shares, not rates)"
    )
    print(f"top {TOP} functions by own time (tottime)")
    print(f"{'tottime s':>9} {'share':>6} {'calls/decision':>14}  function")
    entries = stats.stats.items()  # type: ignore[attr-defined]
    for where, (_, calls, own, _cumulative, _) in sorted(entries, key=lambda e: -e[1][2])[:TOP]:
        print(f"{own:9.3f} {own / total:6.1%} {calls / decisions:14.1f}  {_function(where)}")


def _function(where: tuple[str, int, str]) -> str:
    """`file:line name`, with the source line of a lambda or generator expression."""
    file, line, name = where
    if file == "~":
        return name  # a builtin
    path = Path(file)
    shown = str(path.relative_to(_ROOT)) if path.is_relative_to(_ROOT) else path.name
    text = f"{shown}:{line} {name}"
    if name in ("<lambda>", "<genexpr>"):
        text += f"  {linecache.getline(file, line).strip()[:70]}"
    return text


def print_header(options: Options) -> None:
    print(
        f"recoveryd rules: {options.seconds:g} s per measurement x {options.repeat} rounds, "
        "contenders alternating; figures are medians of the rounds"
    )
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start\n",
        flush=True,
    )


def run(options: Options) -> None:
    print_header(options)
    worst, typical = worst_case(), typical_case()
    for case in (worst, typical):
        check_agreement(case)
    print("recoveryd and the baseline decide alike on every message\n", flush=True)
    medians = print_summary(measure([worst, typical], options))
    print_target(medians[worst.title])
    if options.profile:
        profile(worst, options.seconds)


def parse_options(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rules",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--seconds", type=positive_float, default=0.5, help="per measurement (default 0.5)"
    )
    parser.add_argument(
        "--repeat", type=positive_int, default=5, help="rounds of measurements (default 5)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the 200-rule decide() loop at the end"
    )
    args = parser.parse_args(argv)
    return Options(args.seconds, args.repeat, args.profile)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        run(parse_options(argv))
    except BenchmarkError as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
