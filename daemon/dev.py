"""`recoveryd dev`: the zero-configuration demo, recoveryd recovering real failures live.

On loopback it starts the bundled service emulator, a small workflow app (the user's
side) and recoveryd itself, with a copy of the repository's rules.yaml on a temporary
SQLite store. Every two seconds a wave of workflow runs is published through the
emulator, which delivers them for real: /billing is down (503) for a while and then
recovers, /reports fails for good (500), /canary answers 503 and /signup 422. A delivery
that runs out of retries is dead-lettered and its signed failure callback reaches
recoveryd, which reads the dead letter and decides by the rules. Each action and a sweep
happen for real:

* resume and restart: billing restarted, transient failures resumed, in batches; the
  emulator then runs them against the app again (canaries are ignored);
* notify: the copy's notify webhook is the app's, so the summaries /signup's 422 causes
  are posted for real;
* remove-endpoint: each wave also goes to the URL Group `orders`, three endpoints on the
  app of which `legacy` answers 410 (decommissioned); at the rule's threshold recoveryd
  reads the group and takes `legacy` out of it (`recoveryd restore-endpoint` puts it
  back);
* a sweep: a few shipping runs are in the DLQ from before the demo, their failure
  callbacks never answered (`CALLBACK_FAIL`), so no rule ever saw them: the story sweeps
  exist for. The copy runs each sweep every SWEEP_EVERY instead of on its schedule (a
  nightly sweep would never fire during a demo).

The demo changes only its copy of the rules, never the user's file. One line is printed
per dead letter, service call, decision, batch, notification, removal, sweep run and
recovered run as it happens, and a summary at the end: each failure callback received
counted once (of the runs recovered, how many then succeeded, failed again or were still
running; how many recoveries a rule's budget stopped; the failures of a dead endpoint
counted...), then the notifications delivered, the endpoints removed and the runs swept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import signal
import socket
import tempfile
import time
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    MutableMapping,
    Sequence,
)
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from daemon.app import running
from daemon.emulator import Emulator, EmulatorConfig, create_app
from daemon.emulator.delivery import Delivery
from daemon.emulator.emulator import PublishRequest
from daemon.emulator.journal import Call
from daemon.emulator.state import Endpoint, Run, SeedMessage
from daemon.foundation.logs import iso_times
from daemon.foundation.words import counted, plural
from daemon.http.serving import bind, serve
from daemon.http.uvicorn_version import unsupported
from daemon.pipeline import Tuning
from daemon.rules import FileError, Unreadable, load_rules
from daemon.rules.model import SweepSpec
from daemon.settings import load_settings
from daemon.store import Store, open_store
from daemon.store.records import OVER_BUDGET
from daemon.store.sweep_records import SweepRun

Echo = Callable[[str], None]
WAVE_EVERY = 2.0  # seconds between waves of published runs
FAILING = {"reports": 500, "canary": 503, "signup": 422, "orders-legacy": 410}
HEALTHY = {"orders-eu", "orders-us", "shipping"}  # /billing is healthy once its outage ends
RECOVERED = {"restart": "restarted", "resume": "resumed"}
WEBHOOK = "/hooks/recoveryd"  # the app's on-call webhook, where notify rules post
GROUP = "orders"  # a URL Group of three endpoints on the app, by name: the app's path
ENDPOINTS = {"eu": "orders-eu", "us": "orders-us", "legacy": "orders-legacy"}
MISSED = 3  # shipping runs dead-lettered before the demo, their failure callbacks missed
# Each sweep's schedule in the demo's copy of the rules: short enough that a sweep fires
# within the 10s demo CI runs, long enough that it fires once or twice, not every wave.
SWEEP_EVERY = "8s"
_NOTIFY_URL = re.compile(r'notify: \{url: "[^"]*"\}')
_SCHEDULE = re.compile(r"""^([ \t]+schedule: )("[^"]*"|'[^']*'|\S+)""", re.MULTILINE)


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
        self.app = Starlette(
            routes=[
                Route(WEBHOOK, self.notified, methods=["POST"]),
                Route("/{name}", self.step, methods=["POST"]),
            ]
        )

    def start(self) -> None:
        self.healthy_at = time.monotonic() + self.outage

    async def step(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name == "billing":
            status = 200 if time.monotonic() >= self.healthy_at else 503
        elif name in HEALTHY:
            status = 200
        else:
            status = FAILING.get(name, 404)
        return JSONResponse({"ok": status == 200}, status_code=status)

    async def notified(self, request: Request) -> Response:
        return Response(status_code=204)


def demo_rules(text: str, webhook: str) -> str:
    """The demo's copy of a rules file: notify rules post to the app's `webhook`, and
    each sweep runs every SWEEP_EVERY instead of on its schedule (a nightly sweep would
    never fire during a demo). The rest, rules and sweeps alike, is the user's."""
    text = _NOTIFY_URL.sub(f'notify: {{url: "{webhook}"}}', text)
    return _SCHEDULE.sub(rf'\g<1>"{SWEEP_EVERY}"', text)


def seed_group(emulator: Emulator, app_url: str) -> None:
    """The URL Group `orders` (as `POST /_emulator/url-groups` makes it): three endpoints
    on the app, of which `legacy` was decommissioned and answers 410."""
    endpoints = [Endpoint(url=f"{app_url}/{path}", name=name) for name, path in ENDPOINTS.items()]
    emulator.store.put_group(GROUP, endpoints, emulator.now_ms())


def seed_missed(emulator: Emulator, app_url: str, callback_url: str) -> set[str]:
    """Shipping runs that failed half an hour ago while recoveryd was down (as
    `POST /_emulator/dlq` seeds them): in the DLQ, their failure callbacks never answered
    (CALLBACK_FAIL) and never sent again, so no rule saw them and only a sweep finds them.
    /shipping is back now. Their dlqIds."""
    url = f"{app_url}/shipping"
    then = emulator.now_ms() - 30 * 60 * 1000
    seeds = [
        SeedMessage(
            url=url, body=json.dumps({"shipment": n}), maxRetries=2, createdAt=then,
            responseStatus=503, labels=["shipping"], workflowRunId=f"wfr_shipping_{n}",
            workflowUrl=url, failureCallback=callback_url, failureFunctionState="CALLBACK_FAIL",
        )
        for n in range(MISSED)
    ]  # fmt: skip
    return {entry.dlq_id for entry in emulator.seed(seeds)}


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
    read from its state, and recoveryd's decisions, batches, notifications, removals and
    sweep runs, from its log events."""

    def __init__(self, echo: Echo, emulator: Emulator) -> None:
        self.echo = echo
        self.emulator = emulator
        self.started = time.monotonic()
        self.calls_seen = 0
        self.deliveries_seen: set[str] = set()
        self.missed: set[str] = set()  # dlqIds only a sweep finds: their new runs are swept
        # With --forever, the running daemon's admin URL: hints that work while it runs.
        self.admin: str | None = None
        # Lines of what happens before the header is out (recoveryd logs as it starts):
        # they follow it (`begin`), so the banner comes first.
        self.held: list[str] | None = []

    def line(self, what: str, text: str) -> None:
        shown = f"{time.monotonic() - self.started:6.1f}s  {what:<9} {text}"
        if self.held is None:
            self.echo(shown)
        else:
            self.held.append(shown)

    def begin(self) -> None:
        """The header is out: the lines held back until now follow it, the others as
        they happen."""
        held, self.held = self.held or [], None
        for shown in held:
            self.echo(shown)

    def flush(self) -> None:
        """What the emulator did since the last flush, in the order cause and effect
        happen: a dead letter before the calls it leads to, a recovered run after them."""
        runs = {run.delivery_id: run for run in self.emulator.store.runs}
        recovered = []
        for delivery in list(self.emulator.courier.deliveries.values()):
            final = delivery.state == "delivered" or delivery.dlq_id is not None
            if final and delivery.id not in self.deliveries_seen:
                self.deliveries_seen.add(delivery.id)
                run = runs.get(delivery.id)
                shown = _delivered(delivery, run, self.missed)
                if run is None:
                    self.line(*shown)
                else:
                    recovered.append(shown)
        calls = self.emulator.journal.calls
        for call in calls[self.calls_seen :]:
            self.line("call", _call(call))
        self.calls_seen = len(calls)
        for shown in recovered:
            self.line(*shown)

    def on_log(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> NoReturn:
        """A structlog processor: recoveryd's events as concise lines, nothing else."""
        self.flush()  # the calls and dead letters that led to this event come first
        name = event.pop("event")
        if name in _EVENT_LINES:
            what, text = _EVENT_LINES[name](event)
            if name == "endpoint removed" and self.admin is not None:
                undo = _restore_call(self.admin, event["url_group"], event["endpoint"])
                text += f"; undo while the demo runs: {undo}"
            self.line(what, text)
        elif name not in _QUIET and method != "debug":
            details = [f"{key}={value}" for key, value in iso_times(logger, method, event).items()]
            self.line(method, " ".join([name, *details]))
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


Event = MutableMapping[str, Any]
Line = tuple[str, str]  # what happened, and the rest of the line


def _decided(event: Event) -> Line:
    rule = f"{event['rule']} -> {event['action']}" if event["rule"] else "no rule"
    if event["state"] == "decided":  # to be resumed or restarted: its batch line follows
        state = ""
    elif event["action"] == "remove-endpoint" and event["state"] == "done":
        state = " (one more failure of its endpoint counted)"
    else:
        state = f" ({event['state']})"
    also = [m for m in event["matched"] if m != event["rule"]]
    after = f"  [after {', '.join(also)}]" if also else ""
    return "decided", f"{event['dlq_id']}  {rule}{state}{after}"


def _batch_sent(event: Event) -> Line:
    runs = f"{counted(event['dlq_ids'], 'dlqId')}, {counted(event['runs'], 'new run')}"
    return "sent", f"{event['action']} batch {event['batch']}: {runs}"


def _notified(event: Event) -> Line:
    receiver = f"{event['receiver']}{WEBHOOK}"
    return "notified", f"{event['dlq_id']}  {event['rule']} posted to {receiver}"


def _gone(event: Event) -> Line:
    return "gone", f"{event['dlq_id']} is no longer in the DLQ"


def _over_budget(event: Event) -> Line:
    return "stopped", f"{event['dlq_id']}  {event['rule']}: budget spent, not recovered"


def _removed(event: Event) -> Line:
    group, endpoint = event["url_group"], event["endpoint"]
    return "removed", f"endpoint {endpoint} from URL Group {group} ({event['rule']})"


def _not_removed(event: Event) -> Line:
    where = f"endpoint {event['endpoint']} of URL Group {event['url_group']}"
    return "kept", f"{where}: {event['result']}, {event['reason']}"


def _swept(event: Event) -> Line:
    n, result = event["workflows"], event["result"]
    if result == "dry-run":
        what = f"{counted(n, 'run')} selected, none recovered (dry run)"
    else:
        what = f"{counted(n, 'run')} recovered" if n else "nothing to recover"
    if result not in ("success", "dry-run"):
        what += f" ({result}: {event['error']})"
    return "swept", f"sweep {event['sweep']} run {event['run']}: {what}"


# recoveryd's log events shown as a line of their own; other events at info and above
# are shown as they are, but for _QUIET ones, which another line already tells.
_EVENT_LINES: dict[str, Callable[[Event], Line]] = {
    "decided": _decided,
    "batch sent": _batch_sent,
    "notification sent": _notified,
    "dlq message already gone": _gone,
    "budget spent; not recovered": _over_budget,
    "endpoint removed": _removed,
    "endpoint not removed": _not_removed,
    "sweep run ended": _swept,
}
_QUIET = {
    "sweep scheduled",  # the header says when the sweeps run
    "sweep run started",  # its "sweep run ended" line follows
    "removing endpoint",  # its "endpoint removed" line follows
}


def _restore_call(admin: str, group: str, endpoint: str) -> str:
    """The admin API call that puts `endpoint` back, on the demo's running daemon: the
    demo's store and daemon are gone once it stops, and `recoveryd restore-endpoint`
    with them."""
    path = f"/api/v1/removals/{quote(group, safe='')}/{quote(endpoint, safe='')}/restore"
    return f"curl -X POST {shlex.quote(admin + path)}"


def _delivered(delivery: Delivery, run: Run | None, missed: set[str]) -> Line:
    """A delivery's line: a published message, or a run recoveryd resumed or restarted
    (`swept` when a sweep did, for a dlqId whose failure callback was missed)."""
    message = delivery.message
    if run is not None:
        how = "swept" if run.source_dlq_id in missed else RECOVERED[run.mode]
        who = f"{how} run of {run.source_dlq_id}"
    elif message.topic_name is not None:
        who = f"{message.topic_name}/{message.endpoint_name or message.url}"
    else:
        who = message.workflow.run_id if message.workflow else message.message_id
    answer = f"{who}: {message.method} {urlsplit(message.url).path} -> {delivery.last_status}"
    if delivery.state == "delivered":
        return "ok", answer
    tries = counted(delivery.attempts, "attempt")
    return "dead", f"{answer} ({tries}), dead-lettered as {delivery.dlq_id}"


def _call(call: Call) -> str:
    """A service call's line; a bulk call by dlqIds shows the first few, one by filter
    (a sweep's) its filter."""
    ids = [value for name, value in call.query if name == "dlqIds"]
    if ids:
        more = ", ..." if len(ids) > 4 else ""
        shown = f" ({counted(len(ids), 'dlqId')}: {', '.join(ids[:4])}{more})"
    elif call.query:
        shown = f" ({', '.join(f'{name}={value}' for name, value in call.query)})"
    else:
        shown = ""
    return f"{call.method} {call.path} -> {call.status}{shown}"


def _kind(call: Call) -> str:
    path = "/v2/dlq/{dlqId}" if call.path.startswith("/v2/dlq/") else call.path
    return f"{call.method} {path}"


async def run_demo(*, duration: float, forever: bool, echo: Echo) -> None:
    """The demo for `duration` seconds (until Ctrl-C with `forever`), then its summary."""
    problem = unsupported(uvicorn.__version__)  # the demo's recoveryd listens as serve's
    if problem:
        raise DemoError(problem)
    rules = repo_rules()
    sweeps = _sweeps(rules)
    config = EmulatorConfig(delivery_retry_delay=0.1)
    emulator_app = create_app(config)
    emulator: Emulator = emulator_app.state.emulator
    workflows = Workflows(outage=10.0 if forever else min(10.0, max(2.0, round(duration / 3))))
    live = Live(echo, emulator)
    with tempfile.TemporaryDirectory(prefix="recoveryd-dev-") as tmp, live.logging():
        store_url = f"sqlite:///{Path(tmp) / 'recoveryd.db'}"
        async with serve(emulator_app) as emulator_url, serve(workflows.app) as app_url:
            local_rules = Path(tmp) / "rules.yaml"
            local_rules.write_text(demo_rules(rules.read_text(), f"{app_url}{WEBHOOK}"))
            async with loopback_recoveryd(config, emulator_url, local_rules, store_url) as (
                callbacks,
                admin,
            ):
                seed_group(emulator, app_url)
                live.missed = seed_missed(emulator, app_url, callbacks)
                at = Addresses(emulator_url, app_url, callbacks, admin)
                _header(echo, at, rules, sweeps, workflows.outage, forever)
                until = "Ctrl-C" if forever else f"{duration:g}s"
                echo(
                    f"a wave of workflow runs, and a message to URL Group {GROUP}, every "
                    f"{WAVE_EVERY:g}s, until {until}:"
                )
                live.admin = at.admin if forever else None
                live.begin()
                async with live.watching():
                    await _traffic(emulator, workflows, app_url, callbacks, duration, forever)
                live.line("stop", "traffic stopped; recoveryd finishes what is under way")
            found = await _recorded(store_url, emulator, sweeps)
            # No await from here on: the runs cannot move on between their last lines and
            # the summary, so the two agree.
            live.flush()
            _summary(echo, found, emulator, sweeps, time.monotonic() - live.started)
            if not forever:
                echo("`recoveryd dev --forever` keeps it all running until Ctrl-C, to look around.")


def _sweeps(rules: Path) -> tuple[SweepSpec, ...]:
    """The sweeps of the user's rules file, as written: the header tells how the demo's
    copy changes their schedule."""
    try:
        return load_rules(rules).sweeps
    except (FileError, Unreadable) as exc:
        raise DemoError(str(exc)) from None


@dataclass(frozen=True)
class Addresses:
    """Where the demo's servers listen."""

    emulator: str
    app: str
    callbacks: str
    admin: str


def _header(
    echo: Echo,
    at: Addresses,
    rules: Path,
    sweeps: Sequence[SweepSpec],
    outage: float,
    forever: bool,
) -> None:
    """What runs where, what fails how, and what the demo's copy of the rules changes."""
    echo("recoveryd dev: the service emulator, a workflow app and recoveryd, while it runs")
    echo(f"  emulator   {at.emulator}  (control API under /_emulator/)")
    echo(f"  workflows  {at.app}  /billing 503 for {outage:g}s, then 200;")
    echo("             /reports 500 for good, /canary 503, /signup 422, /shipping 200;")
    echo(f"             URL Group {GROUP}: endpoints eu and us 200, legacy 410 (decommissioned)")
    echo(f"  DLQ        {MISSED} shipping runs failed before the demo, their callbacks missed")
    echo(f"  recoveryd  {at.callbacks}  admin {at.admin}/api/v1/status")
    echo(f"  rules      {rules}, changed in the demo's copy only:")
    echo(f"             notify posts to {at.app}{WEBHOOK}")
    for spec in sweeps:
        every = f'every {SWEEP_EVERY} (in the file: "{spec.schedule}")'
        echo(f"             sweep {spec.name} runs {every}")
    if forever:
        echo(f"while it runs, poke at {at.admin}/api/v1/dlq/<dlqId>, {at.admin}/api/v1/removals,")
        echo(f"  {at.admin}/api/v1/sweeps and {at.emulator}/_emulator/runs; once legacy is")
        echo(f"  removed, {_restore_call(at.admin, GROUP, 'legacy')} puts it back")


@contextlib.asynccontextmanager
async def loopback_recoveryd(
    config: EmulatorConfig,
    service_url: str,
    rules: Path,
    store_url: str,
    sock: socket.socket | None = None,
) -> AsyncIterator[tuple[str, str]]:
    """recoveryd on loopback (on `sock`, else a free port), configured for the emulator,
    its header prefix the emulator's (the callbacks' issuer); its callback and admin URLs."""
    if sock is None:
        sock = bind("127.0.0.1", 0)  # bound first: the callback URL is in the settings
    callback_url = f"http://127.0.0.1:{sock.getsockname()[1]}/callbacks"
    settings = load_settings({
        "RECOVERYD_SERVICE_URL": service_url,
        "RECOVERYD_HEADER_PREFIX": config.header_prefix,
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
                serve(daemon.public, sock=sock, http=daemon.public_http),
                serve(daemon.admin, http=daemon.admin_http) as admin_url,
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
                _publish_wave(emulator, n, app_url, callback_url)
                n += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), WAVE_EVERY)
    except TimeoutError:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _publish_wave(emulator: Emulator, n: int, app_url: str, callback_url: str) -> None:
    """The n-th wave: its workflow runs, and an order to every endpoint of the URL Group
    (a plain message, not a workflow run: only remove-endpoint acts on its failures)."""
    for name, labels in wave(n):
        emulator.publish(PublishRequest(
            url=f"{app_url}/{name}", body=json.dumps({"wave": n}), maxRetries=2,
            workflowRunId=f"wfr_{name}_{n}", labels=labels, failureCallback=callback_url,
        ))  # fmt: skip
    emulator.publish(PublishRequest(
        topic=GROUP, body=json.dumps({"order": n}), maxRetries=2, failureCallback=callback_url
    ))  # fmt: skip


@dataclass(frozen=True)
class Recorded:
    """What recoveryd recorded, read from its store once it has stopped."""

    states: dict[str, int]  # dlqIds by state
    records: list[dict[str, Any]]  # each dlqId's record, as /api/v1/dlq/{dlqId} shows it
    removals: list[dict[str, Any]]  # as /api/v1/removals shows them
    sweep_runs: dict[str, list[SweepRun]]  # each sweep's runs (the store keeps the last 100)


async def _recorded(store_url: str, emulator: Emulator, sweeps: Sequence[SweepSpec]) -> Recorded:
    async with open_store(store_url) as store:
        return Recorded(
            states=(await store.status(time.time()))["states"],
            records=await _records(store, emulator),
            removals=await store.removals(),
            sweep_runs={spec.name: await store.sweep_runs(spec.name, 1000) for spec in sweeps},
        )


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


def _fates(emulator: Emulator, runs: Iterable[Run | None]) -> str:
    """`2 succeeded, 3 failed again, 1 still running`: what became of new runs."""
    fates = Counter(_fate(emulator, run) for run in runs)
    shown = ["succeeded", "failed again", "still running"]
    shown += [fate for fate in fates if fate not in shown]  # never, unless something is amiss
    return ", ".join(f"{fates[fate]} {fate}" for fate in shown)


def _recovered(records: list[dict[str, Any]], emulator: Emulator) -> str:
    """The fate of the new run made for each dlqId recoveryd resumed or restarted
    (`done`). A run that failed again came back to the DLQ: its new dlqId is one more
    failure callback received."""
    runs = {run.source_dlq_id: run for run in emulator.store.runs}
    done = [r["dlqId"] for r in records if r["state"] == "done" and r["action"] in RECOVERED]
    return _fates(emulator, (runs.get(dlq_id) for dlq_id in done))


def _row(label: str, n: int, text: str = "") -> str:
    """A line of the summary: what, how many, and what that counts."""
    return f"  {label:<12}{n:4}  {text}".rstrip()


INDENT = " " * 20  # where a row's text starts: a line that goes on under it


def _summary(
    echo: Echo,
    found: Recorded,
    emulator: Emulator,
    sweeps: Sequence[SweepSpec],
    seconds: float,
) -> None:
    """The failure callbacks received, each on one line; then what recoveryd did besides
    recovering runs: notifications, removals and sweeps; then the calls it made."""
    echo("")
    echo(f"summary after {seconds:.1f}s")
    recovered = _callback_lines(echo, found, emulator)
    _notified_line(echo, found.records)
    _removal_lines(echo, found.removals)
    swept = sum(_sweep_line(echo, spec, found.sweep_runs[spec.name], emulator) for spec in sweeps)
    _calls_line(echo, emulator, recovered + swept)


def _callback_lines(echo: Echo, found: Recorded, emulator: Emulator) -> int:
    """Each failure callback received is counted on exactly one line, from `recovered`
    to `in flight`, by what became of its dlqId; the recovered runs are told apart by
    what became of them. The number of runs recovered."""
    states, records = found.states, found.records
    done = Counter(record["action"] for record in records if record["state"] == "done")
    recovered = sum(done[action] for action in RECOVERED)
    towards_removal = done["remove-endpoint"]
    reported = done.total() - recovered - towards_removal  # a notify rule that does not `continue`
    over_budget = sum(
        r["state"] == "skipped" and (r["reason"] or "").startswith(OVER_BUDGET) for r in records
    )
    in_flight = states["received"] + states["decided"] + states["batched"]
    received = sum(states.values())
    callbacks = plural(received, "failure callback")
    echo(_row("received", received, f"{callbacks}, each counted once below"))
    fates = _recovered(records, emulator)
    echo(_row("recovered", recovered, f"{plural(recovered, 'run')} resumed or restarted: {fates}"))
    enough = "by a rule's budget: that workflow was recovered enough times"
    echo(_row("stopped", over_budget, enough))
    failures = plural(towards_removal, "failure")
    echo(_row("counted", towards_removal, f"{failures} of a dead endpoint, towards removing it"))
    if reported:
        echo(_row("reported", reported, "decided by a notify rule: posting was all to do"))
    echo(_row("skipped", states["skipped"] - over_budget, "ignored, or the action did not apply"))
    echo(_row("gone", states["gone"], "no longer in the DLQ"))
    echo(_row("failed", states["failed"]))
    echo(_row("dry-run", states["dry-run"]))
    if in_flight:
        echo(_row("in flight", in_flight, "(received, decided or batched when it stopped)"))
    return recovered


def _notified_line(echo: Echo, records: list[dict[str, Any]]) -> None:
    sent = sum(n["state"] == "sent" for record in records for n in record["notifications"])
    summaries = plural(sent, "summary", "summaries")
    echo(_row("notified", sent, f"{summaries} delivered to the webhook (for dlqIds counted above)"))


def _removal_lines(echo: Echo, removals: list[dict[str, Any]]) -> None:
    """The endpoints removed; then each threshold reached, with what came of it; then
    how a removal is undone where the store outlives the command (not the demo's)."""
    removed = sum(removal["state"] == "removed" for removal in removals)
    endpoints, their = plural(removed, "dead endpoint"), plural(removed, "its", "their")
    echo(_row("removed", removed, f"{endpoints} taken out of {their} URL Group"))
    for removal in removals:
        echo(INDENT + _removal(removal))
    if removed:
        echo(f"{INDENT}(in a deployment, `recoveryd restore-endpoint GROUP NAME` puts one back)")


def _removal(removal: dict[str, Any]) -> str:
    endpoint = removal["endpoint"]["name"] or removal["endpoint"]["url"]
    group, state, evidence = removal["urlGroup"], removal["state"], removal["evidence"]
    statuses = ", ".join(sorted({str(failure["responseStatus"]) for failure in evidence}))
    text = f"{endpoint} from {group} after {counted(len(evidence), 'failure')} ({statuses})"
    if state == "removed":
        return text
    return f"{text}: {state}, {removal['reason'] or 'under way when recoveryd stopped'}"


def _sweep_line(echo: Echo, spec: SweepSpec, runs: list[SweepRun], emulator: Emulator) -> int:
    """The runs a sweep recovered, by the runs of it the store recorded, and what became
    of them; their number. In the demo they are the dead letters whose failure callbacks
    were missed."""
    made = [
        item["workflowRunId"]
        for run in runs
        if not run.dry_run
        for page in run.page_records
        if page.outcome == "done"
        for item in page.items
    ]
    by_id = {run.workflow_run_id: run for run in emulator.store.runs}
    fates = _fates(emulator, (by_id.get(run_id) for run_id in made))
    how = f"{plural(len(made), 'run')} {RECOVERED[spec.action]} by sweep {spec.name}: {fates}"
    echo(_row("swept", len(made), how))
    ran = counted(len(runs), "time")
    echo(f"{INDENT}(found by its filter, not by a failure callback; the sweep ran {ran})")
    return len(made)


def _calls_line(echo: Echo, emulator: Emulator, recovered: int) -> None:
    """Every call made to the service, by kind, and per run recovered by a rule or a
    sweep: what the batches and the bulk calls by filter save."""
    calls = Counter(_kind(call) for call in emulator.journal.calls)
    total = calls.total()
    per_run = f"{total / recovered:.1f}" if recovered else "-"
    kinds = ", ".join(f"{n} {kind}" for kind, n in calls.most_common())
    echo(f"{_row('calls made', total)}  ({kinds}): {per_run} per recovered run")
