"""`recoveryd dev`: the zero-configuration demo, recoveryd recovering real failures live.

On loopback it starts the bundled service emulator, a small workflow app (the user's
side) and recoveryd itself, with the repository's rules.yaml on a temporary SQLite
store. Every two seconds a wave of workflow runs is published through the emulator,
which delivers them for real: /billing is down (503) for a while and then recovers,
/reports fails for good (500), /canary answers 503 and /signup 422. A delivery that runs
out of retries is dead-lettered and its signed failure callback reaches recoveryd,
which reads the dead letter, decides by the rules (billing restarted, transient failures
resumed, canaries ignored...) and resumes or restarts runs in batches; the emulator then
runs them against the app again. One line is printed per dead letter, service call,
decision, batch and recovered run as it happens, and a summary at the end: of the runs
recoveryd recovered, how many then succeeded, failed again or were still running, and
how many recoveries a rule's budget stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from daemon.app import running
from daemon.emulator import Emulator, EmulatorConfig, create_app
from daemon.emulator.delivery import Delivery
from daemon.emulator.emulator import PublishRequest
from daemon.emulator.journal import Call
from daemon.emulator.state import Run
from daemon.pipeline import Tuning
from daemon.rules import FileError, Unreadable
from daemon.serving import bind, serve
from daemon.settings import load_settings
from daemon.store import Store, open_store
from daemon.store.records import OVER_BUDGET

Echo = Callable[[str], None]
WAVE_EVERY = 2.0  # seconds between waves of published runs
FAILING = {"reports": 500, "canary": 503, "signup": 422}
RECOVERED = {"restart": "restarted", "resume": "resumed"}


class DemoError(Exception):
    """The demo cannot start; `str()` says why."""


def repo_rules() -> Path:
    """The repository's rules.yaml (next to the package in a checkout), else ./rules.yaml."""
    for path in (Path(__file__).resolve().parent.parent / "rules.yaml", Path("rules.yaml")):
        if path.is_file():
            return path
    raise DemoError("no rules.yaml: run `recoveryd dev` from the recoveryd repository")


class Workflows:
    """The user's workflow app: /billing is down until `outage` seconds after `start`."""

    def __init__(self, outage: float) -> None:
        self.outage = outage
        self.healthy_at = float("inf")
        self.app = Starlette(routes=[Route("/{name}", self.step, methods=["POST"])])

    def start(self) -> None:
        self.healthy_at = time.monotonic() + self.outage

    async def step(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name == "billing":
            status = 200 if time.monotonic() >= self.healthy_at else 503
        else:
            status = FAILING.get(name, 404)
        return JSONResponse({"ok": status == 200}, status_code=status)


def wave(n: int) -> list[tuple[str, list[str]]]:
    """The runs of the n-th wave, as (app path, labels); a few fail for good, early on."""
    runs = [("billing", ["billing"])]
    if n < 3:
        runs.append(("reports", ["reports"]))
    if n % 2:
        runs.append(("canary", ["billing", "canary"]))  # ignore-canaries comes first
    if n == 0:
        runs.append(("signup", ["signup"]))
    return runs


class Live:
    """Prints what happens as it happens: the emulator's deliveries and service calls,
    read from its state, and recoveryd's decisions and batches, from its log events."""

    def __init__(self, echo: Echo, emulator: Emulator) -> None:
        self.echo = echo
        self.emulator = emulator
        self.started = time.monotonic()
        self.calls_seen = 0
        self.deliveries_seen: set[str] = set()

    def line(self, what: str, text: str) -> None:
        self.echo(f"{time.monotonic() - self.started:6.1f}s  {what:<9} {text}")

    def flush(self) -> None:
        runs = {run.delivery_id: run for run in self.emulator.store.runs}
        for delivery in list(self.emulator.courier.deliveries.values()):
            final = delivery.state == "delivered" or delivery.dlq_id is not None
            if final and delivery.id not in self.deliveries_seen:
                self.deliveries_seen.add(delivery.id)
                self.line(*_delivered(delivery, runs.get(delivery.id)))
        calls = self.emulator.journal.calls
        for call in calls[self.calls_seen :]:
            self.line("call", _call(call))
        self.calls_seen = len(calls)

    def on_log(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> NoReturn:
        """A structlog processor: recoveryd's events as concise lines, nothing else."""
        self.flush()  # the calls and dead letters that led to this event come first
        name = event.pop("event")
        if name == "decided":
            rule = f"{event['rule']} -> {event['action']}" if event["rule"] else "no rule"
            state = "" if event["state"] == "decided" else f" ({event['state']})"
            also = [m for m in event["matched"] if m != event["rule"]]
            after = f"  [after {', '.join(also)}]" if also else ""
            self.line("decided", f"{event['dlq_id']}  {rule}{state}{after}")
        elif name == "batch sent":
            runs = f"{event['dlq_ids']} dlqIds, {event['runs']} new runs"
            self.line("sent", f"{event['action']} batch {event['batch']}: {runs}")
        elif name == "dlq message already gone":
            self.line("gone", f"{event['dlq_id']} is no longer in the DLQ")
        elif method != "debug":
            details = " ".join(f"{key}={value}" for key, value in event.items())
            self.line(method, f"{name} {details}")
        raise structlog.DropEvent

    @contextlib.contextmanager
    def logging(self) -> Iterator[None]:
        """recoveryd's log events go to `on_log` for the block."""
        saved = structlog.get_config()
        structlog.configure(processors=[self.on_log], cache_logger_on_first_use=False)
        try:
            yield
        finally:
            structlog.configure(**saved)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Flush what the emulator did every 100ms for the block."""

        async def poll() -> None:
            while True:
                self.flush()
                await asyncio.sleep(0.1)

        task = asyncio.create_task(poll())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _delivered(delivery: Delivery, run: Run | None) -> tuple[str, str]:
    """A delivery's line: a published run or one recoveryd resumed or restarted."""
    message = delivery.message
    who = message.workflow.run_id if message.workflow else message.message_id
    if run is not None:
        who = f"{RECOVERED[run.mode]} run of {run.source_dlq_id}"
    answer = f"{who}: {message.method} {urlsplit(message.url).path} -> {delivery.last_status}"
    if delivery.state == "delivered":
        return "ok", answer
    return "dead", f"{answer} ({delivery.attempts} attempts), dead-lettered as {delivery.dlq_id}"


def _call(call: Call) -> str:
    ids = [value for name, value in call.query if name == "dlqIds"]
    shown = f" ({len(ids)} dlqIds: {', '.join(ids[:4])}{', ...' if len(ids) > 4 else ''})"
    return f"{call.method} {call.path} -> {call.status}" + (shown if ids else "")


def _kind(call: Call) -> str:
    path = "/v2/dlq/{dlqId}" if call.path.startswith("/v2/dlq/") else call.path
    return f"{call.method} {path}"


async def run_demo(*, duration: float, forever: bool, echo: Echo) -> None:
    """The demo for `duration` seconds (until Ctrl-C with `forever`), then its summary."""
    rules = repo_rules()
    config = EmulatorConfig(delivery_retry_delay=0.1)
    emulator_app = create_app(config)
    emulator: Emulator = emulator_app.state.emulator
    workflows = Workflows(outage=10.0 if forever else min(10.0, max(2.0, round(duration / 3))))
    live = Live(echo, emulator)
    with tempfile.TemporaryDirectory(prefix="recoveryd-dev-") as tmp, live.logging():
        store_url = f"sqlite:///{Path(tmp) / 'recoveryd.db'}"
        async with serve(emulator_app) as emulator_url, serve(workflows.app) as app_url:
            async with _recoveryd(config, emulator_url, rules, store_url) as (callbacks, admin):
                echo("recoveryd dev: the service emulator, a workflow app and recoveryd")
                echo(f"  emulator   {emulator_url}  (control API under /_emulator/)")
                echo(f"  workflows  {app_url}  /billing 503 for {workflows.outage:g}s, then 200;")
                echo("             /reports 500 for good, /canary 503, /signup 422")
                echo(f"  recoveryd  {callbacks}  admin {admin}/api/v1/status")
                echo(f"  rules      {rules}")
                if forever:
                    echo(f"poke at {admin}/api/v1/dlq/<dlqId> and {emulator_url}/_emulator/runs")
                until = "Ctrl-C" if forever else f"{duration:g}s"
                echo(f"a wave of workflow runs every {WAVE_EVERY:g}s, until {until}:")
                async with live.watching():
                    await _traffic(emulator, workflows, app_url, callbacks, duration, forever)
                live.line("stop", "traffic stopped; recoveryd finishes what is under way")
            async with open_store(store_url) as store:
                states = (await store.status(time.time()))["states"]
                records = await _records(store, emulator)
            # No await from here on: the runs cannot move on between their last lines and
            # the summary, so the two agree.
            live.flush()
            _summary(echo, states, records, emulator, time.monotonic() - live.started)


@contextlib.asynccontextmanager
async def _recoveryd(
    config: EmulatorConfig, service_url: str, rules: Path, store_url: str
) -> AsyncIterator[tuple[str, str]]:
    """recoveryd on loopback, configured for the emulator; its callback and admin URLs."""
    sock = bind("127.0.0.1", 0)  # bound first: the callback URL is in the settings
    callback_url = f"http://127.0.0.1:{sock.getsockname()[1]}/callbacks"
    settings = load_settings({
        "RECOVERYD_SERVICE_URL": service_url,
        "RECOVERYD_TOKEN": config.token,
        "RECOVERYD_SIGNING_KEY_CURRENT": config.signing_key_current,
        "RECOVERYD_SIGNING_KEY_NEXT": config.signing_key_next,
        "RECOVERYD_PUBLIC_URL": callback_url,  # the `sub` the callbacks are signed for
        "RECOVERYD_STORE": store_url,
        "RECOVERYD_RULES": str(rules),
    })  # fmt: skip
    try:
        with contextlib.closing(sock):
            async with (
                running(settings, tuning=Tuning(drain_timeout=5.0)) as daemon,
                serve(daemon.public, sock=sock),
                serve(daemon.admin) as admin_url,
            ):
                yield callback_url, admin_url
    except (FileError, Unreadable) as exc:
        raise DemoError(str(exc)) from None


async def _traffic(
    emulator: Emulator,
    workflows: Workflows,
    app_url: str,
    callback_url: str,
    duration: float,
    forever: bool,
) -> None:
    """Publish a wave of runs every WAVE_EVERY seconds for `duration` (`forever`: until
    SIGINT or SIGTERM, which also end a timed demo early)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after the servers took them: ours now
        loop.add_signal_handler(sig, stop.set)
    workflows.start()
    try:
        async with asyncio.timeout(None if forever else duration):
            n = 0
            while not stop.is_set():
                for name, labels in wave(n):
                    emulator.publish(PublishRequest(
                        url=f"{app_url}/{name}", body=json.dumps({"wave": n}), maxRetries=2,
                        workflowRunId=f"wfr_{name}_{n}", labels=labels,
                        failureCallback=callback_url,
                    ))  # fmt: skip
                n += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), WAVE_EVERY)
    except TimeoutError:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _records(store: Store, emulator: Emulator) -> list[dict[str, Any]]:
    """recoveryd's record (as `/api/v1/dlq/{dlqId}` shows it) of every dead letter the
    emulator made whose failure callback reached it."""
    dead = [d.dlq_id for d in list(emulator.courier.deliveries.values()) if d.dlq_id]
    found = [await store.record(dlq_id) for dlq_id in dead]
    return [record for record in found if record is not None]


def _fate(emulator: Emulator, run: Run | None) -> str:
    """What became of a recovered run, read as its live line reads it: a dead letter is
    final at once (the emulator marks the run failed only once its failure callback is
    answered, which may be never once recoveryd has stopped)."""
    delivery = emulator.courier.deliveries.get(run.delivery_id or "") if run else None
    if delivery is None:
        return "not seen by the emulator"
    if delivery.state == "delivered":
        return "succeeded"
    if delivery.dlq_id is not None:
        return "failed again"
    return "still running"


def _recovered(records: list[dict[str, Any]], emulator: Emulator) -> str:
    """`2 succeeded, 3 failed again, 1 still running`: the fate of the new run made for
    each dlqId recoveryd recovered (`done`). A run that failed again came back to the DLQ:
    its new dlqId is one more failure callback received."""
    runs = {run.source_dlq_id: run for run in emulator.store.runs}
    done = [record["dlqId"] for record in records if record["state"] == "done"]
    fates = Counter(_fate(emulator, runs.get(dlq_id)) for dlq_id in done)
    shown = ["succeeded", "failed again", "still running"]
    shown += [fate for fate in fates if fate not in shown]  # never, unless something is amiss
    return ", ".join(f"{fates[fate]} {fate}" for fate in shown)


def _summary(
    echo: Echo,
    states: dict[str, int],
    records: list[dict[str, Any]],
    emulator: Emulator,
    seconds: float,
) -> None:
    """Each failure callback received is counted on exactly one line, from `received` to
    `in flight`; the recovered runs are told apart by what became of them."""
    calls = Counter(_kind(call) for call in emulator.journal.calls)
    recovered = states["done"]
    over_budget = sum(
        r["state"] == "skipped" and (r["reason"] or "").startswith(OVER_BUDGET) for r in records
    )
    skipped = states["skipped"] - over_budget
    in_flight = states["received"] + states["decided"] + states["batched"]
    total = sum(calls.values())
    per_run = f"{total / recovered:.1f}" if recovered else "-"
    echo("")
    echo(f"summary after {seconds:.1f}s")
    echo(f"  received    {sum(states.values()):4}  failure callbacks")
    echo(f"  recovered   {recovered:4}  runs resumed or restarted: {_recovered(records, emulator)}")
    echo(f"  stopped     {over_budget:4}  by a rule's budget: that run was recovered enough times")
    echo(f"  skipped     {skipped:4}  ignored, or not for this version to carry out")
    echo(f"  gone        {states['gone']:4}  no longer in the DLQ")
    echo(f"  failed      {states['failed']:4}")
    echo(f"  dry-run     {states['dry-run']:4}")
    if in_flight:
        echo(f"  in flight   {in_flight:4}  (received, decided or batched when it stopped)")
    kinds = ", ".join(f"{n} {kind}" for kind, n in calls.most_common())
    echo(f"  calls made  {total:4}  ({kinds}): {per_run} per recovered run")
