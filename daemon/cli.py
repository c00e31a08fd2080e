"""The `recoveryd` command line (PRODUCT.md section 1)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from daemon.durations import parse_duration


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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="recoveryd")
def main() -> None:
    """recoveryd: recovers dead-lettered messages and failed workflow runs."""


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8081, show_default=True, type=click.IntRange(0, 65535))
def emulator(host: str, port: int) -> None:
    """Run the local emulator of the message delivery service.

    Credentials and signing keys come from EMULATOR_TOKEN, EMULATOR_USERNAME,
    EMULATOR_PASSWORD, EMULATOR_SIGNING_KEY_CURRENT and EMULATOR_SIGNING_KEY_NEXT;
    the ones not set are generated and printed once.
    """
    from daemon.emulator import EmulatorConfig
    from daemon.emulator.server import run

    run(host, port, EmulatorConfig.from_env())


@main.command()
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


@main.command()
@click.option(
    "--duration",
    type=_Duration(),
    default="30s",
    show_default=True,
    help="Stop the demo after this long.",
)
@click.option("--forever", is_flag=True, help="Keep everything running and print the URLs.")
def dev(duration: float, forever: bool) -> None:
    """Zero-configuration demo: the emulator, traffic that fails, and the client at work."""
    from daemon.dev import run_demo

    asyncio.run(run_demo(duration=duration, forever=forever, echo=click.echo))
