"""The rules in force in a running daemon, replaced whole by a reload that succeeds.

Like Alertmanager's reloader: the new file is read, checked and compiled completely
before it replaces anything, so an invalid file changes nothing; its problems go back
to whoever asked for the reload (`POST /-/reload`, SIGHUP) and to the log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from daemon.foundation.words import counted
from daemon.metrics import Metrics, RuleLabels
from daemon.rules.ruleset import Ruleset, load_rules
from daemon.rules.yamlfile import FileError, Unreadable

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ReloadResult:
    """How the last reload ended, for whoever shows it (the console): the digest put in
    force, or the problems (each with its file, line and column) that refused it."""

    at: float
    ruleset: Ruleset | None  # None: refused, the running rules stayed
    error: str | None = None
    problems: tuple[str, ...] = ()


class LiveRules:
    def __init__(
        self, path: Path, metrics: Metrics, *, wall_clock: Callable[[], float] = time.time
    ) -> None:
        """Load the rules at `path` now; FileError or Unreadable if they cannot be used."""
        self._path = path
        self._metrics = metrics
        self._wall_clock = wall_clock
        self._lock = asyncio.Lock()  # one reload at a time: the last one asked for wins
        self._listeners: list[Callable[[Ruleset], None]] = []
        self._followers: list[Callable[[], Awaitable[None]]] = []
        self._current = load_rules(path)
        self._swap(self._current)
        self.last_reload: ReloadResult | None = None  # none since the start

    @property
    def path(self) -> Path:
        return self._path

    @property
    def current(self) -> Ruleset:
        """The rules deciding now. Read it once per decision: a reload may swap it."""
        return self._current

    def subscribe(self, listener: Callable[[Ruleset], None]) -> None:
        """Tell `listener` of every ruleset a reload puts in force, right after the swap
        (the sweeps reschedule from it). It must be quick and must not raise."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[Ruleset], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def also_reload(self, follower: Callable[[], Awaitable[None]]) -> None:
        """Run `follower` after every reload, whether the live rules loaded or not (the
        shadow rules reload with them: rules/shadow.py). It must not raise."""
        self._followers.append(follower)

    async def reload(self, via: str | None = None) -> Ruleset:
        """Load the file again and put it in force; on FileError or Unreadable the
        running rules stay. `via` names who asked, in the log (the console's audit)."""
        async with self._lock:
            try:
                return await self._reload(via)
            finally:
                for follower in self._followers:
                    await follower()

    async def _reload(self, via: str | None) -> Ruleset:
        """The reload itself, under the lock."""
        try:
            ruleset = await asyncio.to_thread(self._load, via)
        except FileError as exc:
            problems = tuple(str(problem) for problem in exc.problems)
            error = f"{counted(len(problems), 'problem')} in the rules file"
            self.last_reload = ReloadResult(self._wall_clock(), None, error, problems)
            raise
        except Unreadable as exc:
            self.last_reload = ReloadResult(self._wall_clock(), None, str(exc))
            raise
        self.last_reload = ReloadResult(self._wall_clock(), ruleset)
        previous, self._current = self._current, ruleset
        self._swap(ruleset, previous)
        for listener in list(self._listeners):
            try:
                listener(ruleset)
            except Exception as exc:  # the rules are in force; a listener's bug is logged
                log.error("a listener of rules reloads failed", error=repr(exc), exc_info=exc)
        log.info(
            "rules reloaded",
            path=str(self._path),
            sha256=ruleset.digest,
            changed=ruleset.digest != previous.digest,
            **({"via": via} if via else {}),
        )
        return ruleset

    def _load(self, via: str | None) -> Ruleset:
        """The file loaded again; a refusal is counted and logged before it is raised."""
        try:
            return load_rules(self._path)
        except (FileError, Unreadable) as exc:
            self._metrics.rules_reloads["failure"].inc()
            self._metrics.rules_last_reload_successful.set(0)
            problems = str(exc).splitlines()
            log.error(
                "rules refused; the running rules stay",
                path=str(self._path),
                problems=problems,
                **({"via": via} if via else {}),
            )
            raise

    def _swap(self, ruleset: Ruleset, previous: Ruleset | None = None) -> None:
        metrics = self._metrics
        metrics.rules_reloads["success"].inc()
        metrics.rules_last_reload_successful.set(1)
        metrics.rules_last_reload_success.set(self._wall_clock())
        if previous is not None:
            metrics.rules_info.remove(previous.digest, str(len(previous.rules)))
        metrics.rules_info.labels(ruleset.digest, str(len(ruleset.rules))).set(1)
        metrics.follow_rules(
            [
                RuleLabels(rule.name, rule.action, rule.spec.budget is not None)
                for rule in ruleset.rules
            ],
            [(sweep.name, sweep.action) for sweep in ruleset.sweeps],
        )
