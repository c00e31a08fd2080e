"""Shadow rules: a candidate rules file that decides every dlqId beside the live rules
and has its decision recorded, never acted on (docs/rules.md, "Changing rules safely").
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import structlog

from daemon.foundation.words import counted
from daemon.metrics import Metrics
from daemon.rules.ruleset import Decision, Ruleset, load_rules
from daemon.rules.yamlfile import FileError, Unreadable

log = structlog.get_logger(__name__)


def shadow_text(decision: Decision) -> str:
    """What a decision is compared by, as compact JSON: the deciding rule, its action, and
    a recovery's overrides (Rule.overrides_key), each null when there is none. The store
    keeps the shadow's so, beside the live decision's rule, action and overrides."""
    rule = decision.rule
    overrides = rule.overrides_key if rule is not None else None
    return json.dumps(
        {
            "rule": rule.name if rule else None,
            "action": rule.action if rule else None,
            "overrides": overrides,
        },
        separators=(",", ":"),
    )


class ShadowRules:
    """The candidate at RECOVERYD_SHADOW_RULES, loaded at start and again on every reload
    of the live rules (LiveRules.also_reload). A file that fails to load leaves no shadow
    deciding, is logged and reported (`error`, `problems`, the metric at 0), and changes
    nothing else: the daemon starts, and the live rules decide, as without one."""

    def __init__(self, path: Path, metrics: Metrics) -> None:
        self.path = path
        self._metrics = metrics
        self.current: Ruleset | None = None
        self.error: str | None = None
        self.problems: tuple[str, ...] = ()
        self.load()

    @property
    def digest(self) -> str | None:
        return self.current.digest if self.current else None

    def load(self) -> None:
        """Read the file again; what it says decides from now on, or nothing if it fails."""
        try:
            ruleset = load_rules(self.path)
        except FileError as exc:
            problems = tuple(str(problem) for problem in exc.problems)
            self._failed(f"{counted(len(problems), 'problem')} in the shadow rules file", problems)
            return
        except Unreadable as exc:
            self._failed(str(exc), ())
            return
        self.current, self.error, self.problems = ruleset, None, ()
        self._metrics.shadow_rules_loaded.set(1)
        log.info("shadow rules loaded", path=str(self.path), sha256=ruleset.digest)

    async def reload(self) -> None:
        await asyncio.to_thread(self.load)

    def _failed(self, error: str, problems: tuple[str, ...]) -> None:
        self.current, self.error, self.problems = None, error, problems
        self._metrics.shadow_rules_loaded.set(0)
        log.error("shadow rules refused; no shadow decides until they load",
                  path=str(self.path), error=error, problems=list(problems))  # fmt: skip
