"""`recoveryd dev --app URL`: the service emulator and recoveryd on loopback, for the
user's own workflow endpoint (any language, served by an official workflow SDK).

The emulator speaks the workflow protocol with the header prefix `Upstash` (the SDKs
verify the JWT issuer `Upstash`, and recoveryd's prefix follows it so that its own check
of the callbacks passes) and sends a copy of every run's failure callback to recoveryd's
/callbacks, the run's own failure URL being the app's failure function. recoveryd runs
the given rules file as it is, on a temporary SQLite store. At start it prints the
environment to give the app (the emulator's URL and its throwaway token and signing
keys) and a curl command that starts a run; then one line per delivery, service call,
decision and recovered run, as `recoveryd dev` does, until Ctrl-C (or `--duration`),
and a summary of the runs and of what recoveryd decided.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import uvicorn

from daemon.dev import DemoError, Echo, Live, loopback_recoveryd
from daemon.emulator import Emulator, EmulatorConfig, create_app
from daemon.emulator.config import EmulatorSettingsError
from daemon.emulator.overrides import is_http_url
from daemon.foundation.words import plural
from daemon.http.serving import bind, serve
from daemon.http.uvicorn_version import unsupported
from daemon.store import open_store

# The official SDKs spell every header `Upstash-*` and accept only that JWT issuer.
SDK_PREFIX = "Upstash"
EXAMPLE_PAYLOAD = '{"order": 1}'


def app_url_problem(value: str) -> str | None:
    """Why `value` cannot be the workflow endpoint the emulator delivers to, or None."""
    if not is_http_url(value):
        return (
            f"must be the absolute http(s) URL of your workflow endpoint, e.g. "
            f"http://127.0.0.1:8000/workflow; got {value!r}"
        )
    return None


def sdk_env(emulator_url: str, config: EmulatorConfig) -> dict[str, str]:
    """The variables the official SDKs read, for this emulator: its URL, token and keys
    (throwaway values of the dev emulator's own, never a real account's)."""
    return {
        "QSTASH_URL": emulator_url,
        "QSTASH_TOKEN": config.token,
        "QSTASH_CURRENT_SIGNING_KEY": config.signing_key_current,
        "QSTASH_NEXT_SIGNING_KEY": config.signing_key_next,
    }


def trigger_command(emulator_url: str, app_url: str, token: str) -> str:
    """The curl command that starts a run: a message published to the endpoint, whose
    SDK takes it as a run's first invocation (its body is the run's initial payload)."""
    return shlex.join([
        "curl", "-X", "POST", f"{emulator_url}/v2/publish/{app_url}",
        "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json",
        "-d", EXAMPLE_PAYLOAD,
    ])  # fmt: skip


async def run_app_dev(
    *,
    app_url: str,
    rules: Path,
    port: int,
    duration: float | None,
    echo: Echo,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Until SIGINT/SIGTERM (or `duration` seconds), then the summary. The emulator reads
    its EMULATOR_* settings from `environ` (fixed credentials, say), but for the header
    prefix and the failure-callback copy, which this sets."""
    problem = app_url_problem(app_url) or unsupported(uvicorn.__version__)
    if problem:
        raise DemoError(problem)
    try:
        settings = EmulatorConfig.from_env(environ)
    except EmulatorSettingsError as exc:
        raise DemoError(str(exc)) from None
    try:
        emulator_sock = bind("127.0.0.1", port)
    except OSError as exc:
        raise DemoError(f"--port {port}: cannot listen on 127.0.0.1: {exc.strerror}") from None
    recoveryd_sock = bind("127.0.0.1", 0)  # bound first: the emulator copies callbacks there
    callbacks = f"http://127.0.0.1:{recoveryd_sock.getsockname()[1]}/callbacks"
    config = replace(settings, header_prefix=SDK_PREFIX, failure_callback_copy=callbacks)
    emulator_app = create_app(config)
    emulator: Emulator = emulator_app.state.emulator
    live = Live(echo, emulator)
    with (
        contextlib.closing(emulator_sock),
        contextlib.closing(recoveryd_sock),
        tempfile.TemporaryDirectory(prefix="recoveryd-dev-") as tmp,
        live.logging(),
    ):
        store_url = f"sqlite:///{Path(tmp) / 'recoveryd.db'}"
        async with serve(emulator_app, sock=emulator_sock) as emulator_url:
            async with loopback_recoveryd(
                config, emulator_url, rules, store_url, recoveryd_sock
            ) as (_, admin):
                _header(echo, app_url, emulator_url, config, callbacks, admin, rules)
                live.admin = admin
                live.begin()
                async with live.watching():
                    await _until_stopped(duration)
                live.line("stop", "stopped; recoveryd finishes what is under way")
            async with open_store(store_url) as store:
                states = (await store.status(time.time()))["states"]
                dead = [d.dlq_id for d in list(emulator.courier.deliveries.values()) if d.dlq_id]
                found = [await store.record(dlq_id) for dlq_id in dead]
            live.flush()
            records = [record for record in found if record is not None]
            _summary(echo, emulator, states, records, time.monotonic() - live.started)


def _header(
    echo: Echo,
    app_url: str,
    emulator_url: str,
    config: EmulatorConfig,
    callbacks: str,
    admin: str,
    rules: Path,
) -> None:
    """Where everything listens, the app's environment and how to start a run."""
    echo("recoveryd dev --app: the service emulator and recoveryd, for your workflow app")
    echo(f"  app        {app_url}")
    echo(f"  emulator   {emulator_url}  (runs: {emulator_url}/_emulator/workflows)")
    echo(f"  recoveryd  {callbacks}  admin {admin}/api/v1/status")
    echo(f"  rules      {rules}")
    echo("give your app this environment (the dev emulator's throwaway credentials):")
    for name, value in sdk_env(emulator_url, config).items():
        echo(f"  export {name}={shlex.quote(value)}")
    echo("start a run (the body is the run's initial payload):")
    echo(f"  {trigger_command(emulator_url, app_url, config.token)}")
    echo(f"each run's record in recoveryd: {admin}/api/v1/dlq/<dlqId>; Ctrl-C stops")


async def _until_stopped(duration: float | None) -> None:
    """Until SIGINT or SIGTERM, or `duration` seconds."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after the servers took them: ours now
        loop.add_signal_handler(sig, stop.set)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), duration)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _summary(
    echo: Echo,
    emulator: Emulator,
    states: dict[str, int],
    records: list[dict[str, Any]],
    seconds: float,
) -> None:
    """The runs by status, then the failure callbacks recoveryd received by what it did."""
    runs = list(emulator.workflows.values())
    status = Counter(run.status for run in runs)
    recovered = sum(run.source_dlq_id is not None for run in runs)
    echo("")
    echo(f"summary after {seconds:.1f}s")
    by_status = ", ".join(f"{n} {name}" for name, n in sorted(status.items())) or "none"
    echo(f"  runs      {len(runs):4}  {by_status} ({recovered} started by recoveryd)")
    received = sum(states.values())
    done = Counter(record["action"] for record in records if record["state"] == "done")
    acted = ", ".join(f"{n} {action}" for action, n in sorted(done.items()))
    shown = ", ".join(f"{n} {state}" for state, n in sorted(states.items()) if n)
    callbacks = plural(received, "failure callback")
    echo(f"  received  {received:4}  {callbacks}: {shown or 'none'}")
    if acted:
        echo(f"            done: {acted}")
