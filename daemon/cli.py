"""The `recoveryd` command line (docs/cli.md)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from click.core import ParameterSource

from daemon.foundation.durations import parse_duration

if TYPE_CHECKING:
    from daemon.rules import Ruleset
    from daemon.settings import Need, Settings


class _Duration(click.ParamType[float]):
    name = "duration"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _RulesSettings(click.ClickException):
    """Settings of check, explain or test with problems. These run anywhere (CI, a
    laptop), away from the daemon's environment: they read only their own settings, and
    a problem with one exits 2, as a bad option does (1 is for rules with problems)."""

    exit_code = 2


class _NoReplay(click.ClickException):
    """`recoveryd replay` could not replay (the settings, the daemon or the store refuse
    it): 3, as 1 says the candidate would change something, a CI gate's failure."""

    exit_code = 3


def _settings(
    *require: str | Need,
    only: Collection[str] | None = None,
    refused: type[click.ClickException] = click.ClickException,
    **given: Any,
) -> Settings:
    """The settings a command uses, checked as `serve` checks its own (load_settings):
    every problem at once, a line each naming its variable, before the command does
    anything; `refused` (exit 1 unless it says otherwise) says them. `require`: what this
    command needs that others may leave out; `only`: the settings read by a command that
    runs away from the daemon's environment; `given`: the values its options set."""
    from daemon.settings import SettingsError, load_settings

    try:
        return load_settings(os.environ, require=require, daemon=False, only=only, **given)
    except SettingsError as exc:
        raise refused(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="recoveryd")
def main() -> None:
    """recoveryd: recovers dead-lettered messages and failed workflow runs."""


@main.command(short_help="Run the local emulator of the service.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8081, show_default=True, type=click.IntRange(0, 65535))
def emulator(host: str, port: int) -> None:
    """Run the local emulator of the message delivery service.

    Credentials and signing keys come from EMULATOR_TOKEN, EMULATOR_USERNAME,
    EMULATOR_PASSWORD, EMULATOR_SIGNING_KEY_CURRENT and EMULATOR_SIGNING_KEY_NEXT;
    the ones not set are generated and printed once.
    """
    from daemon.emulator import EmulatorConfig
    from daemon.emulator.config import EmulatorSettingsError
    from daemon.emulator.server import run

    try:
        config = EmulatorConfig.from_env()
    except EmulatorSettingsError as exc:
        raise click.ClickException(str(exc)) from None
    run(host, port, config)


@main.command(short_help="Run the daemon.")
@click.option(
    "--rules",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Rules file (default: RECOVERYD_RULES, or rules.yaml).",
)
def serve(rules: Path | None) -> None:
    """Run the daemon, configured by RECOVERYD_* environment variables."""
    from daemon.serve import StartError
    from daemon.serve import serve as run_daemon

    try:
        run_daemon(rules=rules)
    except StartError as exc:
        raise click.ClickException(str(exc)) from None


class _HeaderPrefix(click.ParamType[str]):
    name = "word"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        from daemon.settings import header_prefix

        # The daemon's own check, so explain and test refuse exactly what serve refuses.
        try:
            return header_prefix(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


# check, explain and test: exit 1 for rules with problems, 2 for a file that cannot be read.
_RULES_PATH = click.Path(dir_okay=False, path_type=Path)
# The daemon's setting, read the same way, so a message is explained as `serve` would see
# it: with RECOVERYD_HEADER_PREFIX=Upstash, an Upstash-Workflow-RunId makes a workflow run.
_HEADER_PREFIX = click.option(
    "--header-prefix",
    type=_HeaderPrefix(),
    help="Prefix of the service's headers (Upstash for QStash). Default: "
    "RECOVERYD_HEADER_PREFIX, or Service.",
)


def _header_prefix(given: str | None) -> str:
    """--header-prefix, else RECOVERYD_HEADER_PREFIX, else Service."""
    chosen = {} if given is None else {"HEADER_PREFIX": given}
    return _settings(only=("HEADER_PREFIX",), refused=_RulesSettings, **chosen).HEADER_PREFIX


@main.command(short_help="Validate a rules file.")
@click.argument("path", type=_RULES_PATH, required=False)
def check(path: Path | None) -> None:
    """Validate a rules file (default: RECOVERYD_RULES, or rules.yaml).

    Every problem is printed as PATH:LINE:COL: yaml.path: message. Exit status: 0 valid,
    1 invalid, 2 unreadable.
    """
    settings = _settings(only=("RULES",), refused=_RulesSettings)
    path = path or settings.RULES
    ruleset = _load_rules(path)
    from daemon.foundation.words import counted

    rules, sweeps = counted(len(ruleset.rules), "rule"), counted(len(ruleset.sweeps), "sweep")
    click.echo(f"{path}: ok: {rules}, {sweeps}")


@main.command(short_help="Make the shadow rules the live rules.")
@click.option("--yes", is_flag=True, help="Do it; without --yes, only print what it would do.")
def promote(yes: bool) -> None:
    """Put the shadow rules (RECOVERYD_SHADOW_RULES) in place of the rules file
    (RECOVERYD_RULES): checked as `check` checks them, written over it atomically (the
    old file kept as RULES.bak), then a running daemon (on RECOVERYD_ADMIN_LISTEN) asked
    to reload. Exit status: 0 done (or, without --yes, would be), 1 refused, 2 the
    shadow file is invalid or unreadable.
    """
    from daemon.admin.promote import PromoteError, reload_daemon, replace_rules
    from daemon.foundation.words import counted
    from daemon.rules import FileError, Unreadable, load_rules

    settings = _settings(only=("RULES", "SHADOW_RULES", "ADMIN_LISTEN", "ADMIN_TOKEN", "STORE"))
    shadow, rules = settings.SHADOW_RULES, settings.RULES
    if shadow is None:
        _fail("RECOVERYD_SHADOW_RULES is not set: there are no shadow rules to promote", 1)
    try:
        candidate = load_rules(shadow)
    except (FileError, Unreadable) as exc:
        _fail(str(exc), 2)
    what = f"{shadow} ({counted(len(candidate.rules), 'rule')}, sha256 {candidate.digest[:12]})"
    if not yes:
        click.echo(_replayed_summary(settings, candidate))
        click.echo(f"would write {what} over {rules} (the old one kept as {rules}.bak) "
                   "and ask a running daemon to reload; run again with --yes to do it")  # fmt: skip
        return
    try:
        backup = replace_rules(candidate.text, rules)
        digest = asyncio.run(reload_daemon(settings))
    except OSError as exc:
        _fail(f"{rules}: cannot write the rules file: {exc}", 1)
    except PromoteError as exc:
        _fail(f"{rules} promoted, but {exc}", 1)
    click.echo(f"promoted {what} to {rules}; the old rules are in {backup}")
    if digest is None:
        click.echo("no daemon answered: it reads the new rules at its next start")
    else:
        click.echo(f"the running daemon reloaded them (sha256 {digest[:12]})")


def _replayed_summary(settings: Settings, candidate: Ruleset) -> str:
    """`recoveryd replay`'s summary line of `candidate`, or why there is none: what
    promoting it would have changed on the last 7 days of records."""
    from daemon.admin.replay import DEFAULT_SINCE, ReplayError, replay_now
    from daemon.rules.replay_text import summary
    from daemon.store import StoreMissing

    try:
        return summary(asyncio.run(replay_now(settings, candidate, DEFAULT_SINCE, None)))
    except (ReplayError, StoreMissing) as exc:
        return f"no replay of {candidate.source}: {exc}"


@main.command(short_help="Which rule a DLQ message matches, and the call it causes.")
@click.argument("rules", type=_RULES_PATH)
@click.argument("message", type=_RULES_PATH)
@_HEADER_PREFIX
def explain(rules: Path, message: Path, header_prefix: str | None) -> None:
    """Which rule the DLQ message in MESSAGE (JSON, as the service returns it) matches, and
    the call it would cause: method, path, query and the exact override headers, as JSON.
    Sample messages are in the repository's examples/ folder."""
    from daemon.rules import facts
    from daemon.rules.explain import explain as explained

    prefix = _header_prefix(header_prefix)
    ruleset = _load_rules(rules)
    try:
        data = json.loads(message.read_bytes())
    except (OSError, ValueError) as exc:
        _fail(f"{message}: cannot read a JSON message: {exc}", 2)
    if not isinstance(data, dict):
        _fail(f"{message}: a DLQ message is a JSON object", 2)
    # The interpreter, rule by rule: the compiled rules decide alike (tests/rules).
    decision = ruleset.interpret(facts(data, prefix))
    click.echo(json.dumps(explained(ruleset, data, decision, prefix), indent=2))


@main.command("test", short_help="Run rule unit tests.")
@click.argument("rules", type=_RULES_PATH)
@click.argument("tests", type=_RULES_PATH)
@_HEADER_PREFIX
def test_rules(rules: Path, tests: Path, header_prefix: str | None) -> None:
    """Run the rule unit tests in TESTS against RULES. Exit status: 0 when all pass, 1 when
    any fails or a file has problems, 2 when a file cannot be read."""
    from daemon.foundation.words import counted
    from daemon.rules import FileError, Unreadable
    from daemon.rules.testing import load_tests, run_tests

    prefix = _header_prefix(header_prefix)
    ruleset = _load_rules(rules)
    try:
        cases = load_tests(tests, ruleset)
    except FileError as exc:
        _fail(str(exc), 1)
    except Unreadable as exc:
        _fail(str(exc), 2)
    outcomes = run_tests(cases, ruleset, prefix)
    for outcome in outcomes:
        verdict = "PASS" if outcome.passed else "FAIL"
        click.echo(f"{tests}:{outcome.line}: {verdict} {outcome.test.name}")
        for failure in outcome.failures:
            click.echo(f"    {failure}")
    failed = sum(not outcome.passed for outcome in outcomes)
    click.echo(
        f"{counted(len(outcomes), 'test')}, {len(outcomes) - failed} passed, {failed} failed"
    )
    if failed:
        sys.exit(1)


@main.command(short_help="What a rules file would change, replayed on recorded decisions.")
@click.argument("candidate", type=_RULES_PATH)
@click.option("--since", default="7d", show_default=True, type=_Duration(),
              help="Replay the records received this recently.")  # fmt: skip
@click.option("--rule", help="Only the records this rule decided, or would decide.")
@click.option("--format", "form", type=click.Choice(("table", "json", "markdown")),
              default="table", show_default=True, help="table for people, markdown for a "
              "pull request's comment, json as the admin API answers.")  # fmt: skip
def replay(candidate: Path, since: float, rule: str | None, form: str) -> None:
    """Decide the records of the last 7 days (--since) again with the rules in
    CANDIDATE, from the facts each decision kept, and report what would change: the
    decisions, by rule and action before and after, the overrides, the budgets' effects,
    with example dlqIds. A running daemon (on RECOVERYD_ADMIN_LISTEN) is asked; with none
    running, the store (RECOVERYD_STORE) is read here. Exit status: 0 nothing would
    change, 1 something would, 2 CANDIDATE is invalid (its problems printed as `check`
    prints them) or cannot be read, 3 no replay was made (the settings, the daemon or the
    store refuse it)."""
    from daemon.admin.replay import ReplayError, replay_now
    from daemon.foundation.logs import configure_command_logging
    from daemon.rules import FileError, Unreadable, load_rules
    from daemon.rules.replay import would_change
    from daemon.rules.replay_text import rendered
    from daemon.store import StoreMissing

    try:
        ruleset = load_rules(candidate)
    except (FileError, Unreadable) as exc:
        _fail(str(exc), 2)
    settings = _settings(refused=_NoReplay)
    configure_command_logging(settings)
    try:
        report = asyncio.run(replay_now(settings, ruleset, f"{since}s", rule))
    except (ReplayError, StoreMissing) as exc:
        raise _NoReplay(str(exc)) from None
    click.echo(rendered(report, form))
    if would_change(report):
        sys.exit(1)


def _load_rules(path: Path) -> Any:
    from daemon.rules import FileError, Unreadable, load_rules

    try:
        return load_rules(path)
    except FileError as exc:
        _fail(str(exc), 1)
    except Unreadable as exc:
        _fail(str(exc), 2)


def _fail(message: str, status: int) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(status)


def _app_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from daemon.dev_app import app_url_problem

    problem = None if value is None else app_url_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


@main.command(
    short_help="The zero-configuration demo, or the emulator and recoveryd for your own "
    "workflow app (--app)."
)
@click.option(
    "--duration",
    type=_Duration(),
    default="30s",
    show_default=True,
    help="Stop the demo after this long (unless --forever).",
)
@click.option(
    "--forever", is_flag=True, help="Keep everything running until Ctrl-C (the URLs are printed)."
)
@click.option(
    "--app",
    "app_url",
    metavar="URL",
    callback=_app_url,
    help="Your own workflow endpoint (served by an official workflow SDK, any language) "
    "instead of the built-in app: prints the environment to give it and how to start a "
    "run, and runs until Ctrl-C unless --duration is given.",
)
@click.option(
    "--rules",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="With --app: the rules file recoveryd runs, as it is. Default: the repository's "
    "rules.yaml.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="With --app: the emulator's port on 127.0.0.1, the app's QSTASH_URL (0: a free one).",
)
def dev(duration: float, forever: bool, app_url: str | None, rules: Path | None, port: int) -> None:
    """Zero-configuration demo: the service emulator, a workflow app whose runs fail, and
    recoveryd with the repository's rules.yaml recovering them, printed live. With --app,
    the emulator and recoveryd for your own workflow app instead (docs/emulator.md)."""
    from daemon.dev import DemoError, repo_rules, run_demo
    from daemon.dev_app import run_app_dev

    ctx = click.get_current_context()
    if app_url is None:
        for name in ("rules", "port"):
            if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT:
                raise click.UsageError(f"--{name} goes with --app")
    try:
        if app_url is None:
            asyncio.run(run_demo(duration=duration, forever=forever, echo=click.echo))
        else:
            timed = ctx.get_parameter_source("duration") is not ParameterSource.DEFAULT
            until = duration if timed and not forever else None
            run = run_app_dev(
                app_url=app_url, rules=rules or repo_rules(), port=port, duration=until,
                echo=click.echo,
            )  # fmt: skip
            asyncio.run(run)
    except DemoError as exc:
        raise click.ClickException(str(exc)) from None


@main.command("rotate-token", short_help="Rotate the account token now.")
@click.option(
    "--timeout",
    "wait",
    type=_Duration(),
    default="120s",
    show_default=True,
    help="Give up waiting for the rotation after this long.",
)
def rotate_token(wait: float) -> None:
    """Rotate the account token now and save the new credentials to
    RECOVERYD_CREDENTIALS_FILE. A running daemon (on RECOVERYD_ADMIN_LISTEN) is asked to do
    it, so it swaps the token without a refused call; with no daemon running, it is done
    here. Exit status: 0 rotated, 1 not rotated (the reason is printed)."""
    from daemon.account.rotate_command import RotateError, rotate_now
    from daemon.foundation.logs import configure_command_logging
    from daemon.settings import CREDENTIALS_KEPT, RESET_CREDENTIALS

    settings = _settings("SERVICE_URL", CREDENTIALS_KEPT, *RESET_CREDENTIALS)
    configure_command_logging(settings)
    try:
        click.echo(asyncio.run(rotate_now(settings, wait)))
    except RotateError as exc:
        raise click.ClickException(str(exc)) from None


@main.command("set-token", short_help="Save a token from the service's console (after a lockout).")
@click.option(
    "--from",
    "source",
    metavar="FILE",
    help="Read the token from FILE ('-': standard input): the token alone, or JSON as "
    'the credentials file holds it ({"token": "...", "password": "..."}). Default: '
    "RECOVERYD_TOKEN_FILE or RECOVERYD_TOKEN.",
)
@click.option(
    "--no-check", is_flag=True, help="Save it without asking the service whether it works."
)
@click.option(
    "--replace-unreadable",
    is_flag=True,
    help="Replace saved credentials that cannot be read (a lost key, a broken file) instead "
    "of refusing.",
)
def set_token(source: str | None, no_check: bool, replace_unreadable: bool) -> None:
    """Save a token (e.g. one reset in the service's console, after a lockout) where
    recoveryd keeps its credentials: sealed into the PostgreSQL store with
    RECOVERYD_CREDENTIALS_KEY, or in RECOVERYD_CREDENTIALS_FILE. The service is asked
    first whether it takes the token. Refused while a token rotation is under way. A
    running daemon (on RECOVERYD_ADMIN_LISTEN) is then asked to take it up at once.
    Never pass the token as an argument: pipe it in with --from -. Exit status: 0 saved
    and taken up (or no daemon running), 1 not (the reason is printed)."""
    from daemon.account.set_token import TOKEN_GIVEN, SetTokenError, read_given
    from daemon.account.set_token import set_token as save
    from daemon.foundation.logs import configure_command_logging
    from daemon.settings import CREDENTIALS_KEPT, SettingsError

    checked = () if no_check else ("SERVICE_URL",)
    settings = _settings(*checked, CREDENTIALS_KEPT, *(() if source else (TOKEN_GIVEN,)))
    configure_command_logging(settings)
    try:
        given = read_given(source, settings)
        saving = save(settings, given, check=not no_check, replace_unreadable=replace_unreadable)
        for line in asyncio.run(saving):
            click.echo(line)
    except (SettingsError, SetTokenError) as exc:
        raise click.ClickException(str(exc)) from None


@main.command(short_help="Seal the store's credentials under the first key.")
def reseal() -> None:
    """Seal the credentials kept in the PostgreSQL store again, under the first of
    RECOVERYD_CREDENTIALS_KEY's keys (comma-separated: the first seals, all open), so
    that the others can leave the setting. Exit status: 0 resealed (or nothing saved
    yet), 1 not (the reason is printed)."""
    from daemon.account.reseal import ResealError
    from daemon.account.reseal import reseal as reseal_now
    from daemon.foundation.logs import configure_command_logging
    from daemon.settings import needs, postgres_store
    from daemon.store import StoreMissing

    settings = _settings(
        needs("CREDENTIALS_KEY", why="the keys the saved credentials are sealed with"),
        postgres_store("the saved credentials are sealed into it"),
    )
    configure_command_logging(settings)
    try:
        click.echo(asyncio.run(reseal_now(settings)))
    except (ResealError, StoreMissing) as exc:
        raise click.ClickException(str(exc)) from None


@main.command(short_help="The endpoints remove-endpoint rules removed, with their evidence.")
@click.option("--group", help="Only the removals from this URL Group.")
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON, as the admin API does.")
def removals(group: str | None, as_json: bool) -> None:
    """List the endpoints remove-endpoint rules took out of their URL Groups (and the
    thresholds that did not lead to a removal, and why), each with its evidence and the
    command that puts it back. A running daemon (on RECOVERYD_ADMIN_LISTEN) is asked;
    with none running, the store (RECOVERYD_STORE) is read here."""
    from daemon.endpoints.listing import described
    from daemon.endpoints.restore import RemovalsError, removals_now
    from daemon.foundation.logs import configure_command_logging
    from daemon.store import StoreMissing

    settings = _settings()
    configure_command_logging(settings)
    try:
        found = asyncio.run(removals_now(settings, group))
    except (RemovalsError, StoreMissing) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(found, indent=2) if as_json else described(found))


@main.command(short_help="List dlqId records, newest first.")
@click.option("--state", help="Only records in this state.")
@click.option("--rule", help="Only records decided by this rule.")
@click.option("--action", help="Only records of this action (resume, restart...).")
@click.option("--since", type=_Duration(), help="Only records received this recently (24h).")
@click.option("--q", "q", help="Only the record of this dlqId, run id, URL or URL Group.")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True,
              help="At most this many.")  # fmt: skip
@click.option("--cursor", help="Go on from the page before (its `next`, as printed).")
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON, as the admin API does.")
def ls(since: float | None, limit: int, as_json: bool, **wanted: str | None) -> None:
    """List the dlqId records, newest received first (the data of GET /api/v1/dlq): each
    one's state, rule, action, the failed delivery's status and its URL Group and endpoint
    (or URL). A running daemon (on RECOVERYD_ADMIN_LISTEN) is asked; with none running,
    the store (RECOVERYD_STORE) is read here."""
    from daemon.admin.ls import ListError, records_now, table
    from daemon.foundation.logs import configure_command_logging
    from daemon.store import StoreMissing

    settings = _settings()
    configure_command_logging(settings)
    given = {name: value for name, value in wanted.items() if value is not None}
    try:
        page = asyncio.run(records_now(settings, given, since, limit))
    except (ListError, StoreMissing) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(page, indent=2))
        return
    click.echo(table(page["items"]) if page["items"] else "no records")
    if page["next"] is not None:
        click.echo(f"more: recoveryd ls ... --cursor {page['next']}")


@main.command("restore-endpoint", short_help="Put a removed endpoint back into its URL Group.")
@click.argument("group")
@click.argument("name")
def restore_endpoint(group: str, name: str) -> None:
    """Put the endpoint NAME that recoveryd removed back into the URL Group GROUP, with the
    name and url its removal recorded. NAME is the endpoint's name, or its url when it has
    none (quote it for the shell). A running daemon (on RECOVERYD_ADMIN_LISTEN) is asked to
    do it; with none running, it is done here. Exit status: 0 restored, 1 not (no such
    removal, restored already, or the service refused; the reason is printed)."""
    from daemon.endpoints.restore import RemovalsError, restore_now
    from daemon.foundation.logs import configure_command_logging
    from daemon.settings import TOKEN_SOURCE
    from daemon.store import StoreMissing

    settings = _settings("SERVICE_URL", TOKEN_SOURCE)
    configure_command_logging(settings)
    try:
        answer = asyncio.run(restore_now(settings, group, name))
    except (RemovalsError, StoreMissing) as exc:
        raise click.ClickException(str(exc)) from None
    endpoint = answer["endpoint"]
    shown = f"{endpoint['name']} ({endpoint['url']})" if endpoint.get("name") else endpoint["url"]
    click.echo(f"restored endpoint {shown} to URL Group {group} (removal {answer['removal']})")


@main.command(short_help="Put final dlqIds back into the pipeline.")
@click.option(
    "--state",
    "states",
    multiple=True,
    default=("failed",),
    show_default=True,
    help="Final state to redrive (repeat for several): failed, gone, skipped, dry-run, done.",
)
@click.option("--rule", help="Only dlqIds decided by this rule.")
@click.option(
    "--since", type=_Duration(), help="Only dlqIds that reached their state this recently (24h)."
)
@click.option("--yes", is_flag=True, help="Do it; without --yes, only print what it would do.")
def redrive(states: tuple[str, ...], rule: str | None, since: float | None, yes: bool) -> None:
    """Put final dlqIds back into the pipeline, to be fetched and decided again.

    A running daemon (on RECOVERYD_ADMIN_LISTEN) is asked to do it; with none running,
    the store (RECOVERYD_STORE) is changed here and the next start picks them up.
    """
    import time

    from daemon.admin.redrive import RedriveError, RedriveFilter, redrive_now
    from daemon.foundation.logs import configure_command_logging
    from daemon.foundation.words import counted
    from daemon.store import StoreMissing

    settings = _settings()
    configure_command_logging(settings)
    try:
        wanted = {"states": list(states), "rule": rule, "dryRun": not yes}
        selection = RedriveFilter.from_json({**wanted, "since": f"{since}s" if since else None})
        answer = asyncio.run(redrive_now(settings, selection, time.time()))
    except (RedriveError, StoreMissing) as exc:
        raise click.ClickException(str(exc)) from None
    count, listed = answer["count"], answer["dlqIds"]
    for dlq_id in listed:
        click.echo(dlq_id)
    if len(listed) < count:
        click.echo(f"... and {count - len(listed)} more")
    which = f"{counted(count, 'dlqId')} in state {', '.join(states)}"
    if yes:
        click.echo(f"redriven: {which}; they will be fetched and decided again")
    else:
        click.echo(f"would redrive {which}; run again with --yes to do it")


@main.command(short_help="What a sweep would select now, without acting.")
@click.argument("name")
@click.option(
    "--dry-run", is_flag=True, help="List what the sweep would select now; act on nothing."
)
@click.option(
    "--rules",
    type=_RULES_PATH,
    help="Rules file holding the sweep (default: RECOVERYD_RULES, or rules.yaml).",
)
def sweep(name: str, dry_run: bool, rules: Path | None) -> None:
    """What sweep NAME would select now, without acting (--dry-run): each failed workflow
    run its filter selects (relative dates resolved now), at most maxPerRun, then how
    many. The service is asked with RECOVERYD_SERVICE_URL and the daemon's credentials.
    Without --dry-run it refuses: a sweep runs on its schedule in `recoveryd serve`."""
    from daemon.foundation.logs import configure_command_logging
    from daemon.settings import TOKEN_SOURCE, SettingsError
    from daemon.store import StoreMissing
    from daemon.sweeps.command import NOT_BY_HAND, SweepCommandError
    from daemon.sweeps.command import dry_run as list_selection

    if not dry_run:
        raise click.UsageError(NOT_BY_HAND.format(name=name))
    settings = _settings("SERVICE_URL", TOKEN_SOURCE)
    configure_command_logging(settings)
    try:
        asyncio.run(list_selection(settings, rules or settings.RULES, name, click.echo))
    except (SettingsError, SweepCommandError, StoreMissing) as exc:
        raise click.ClickException(str(exc)) from None
