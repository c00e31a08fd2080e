"""`recoveryd dev --app URL` as a user runs it: the command started, the example workflow
app (examples/workflow-app, the official Python SDK) started with the environment the
command printed, and runs started with the curl command it printed."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from daemon.cli import main as cli
from tests.processes import free_port, stop
from tests.support import LOOPBACK_TLS, wait_for

RECOVERYD = [sys.executable, "-m", "daemon"]
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "workflow-app"
# The rules the test gives `dev`: a step answering 5xx is resumed, in batches of at most
# a second (the repository's rules.yaml waits up to 5s).
RULES = """\
version: 1
defaults:
  batch: {maxSize: 50, maxWait: 1s}
rules:
  - name: resume-the-payment-step
    match: {workflow: true, responseStatus: {gte: 500, lte: 599}}
    action: resume
    overrides: {retries: 3}
  - name: everything-else
    match: {}
    action: ignore
"""


@dataclass
class Dev:
    """`recoveryd dev --app` running: what it printed so far, read as it comes."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def printed(self) -> str:
        return "".join(self.lines)

    def banner(self) -> str:
        """Everything up to the line that says how to stop it."""
        return wait_for(
            lambda: "Ctrl-C stops" in self.printed() and self.printed(), 60, "the banner"
        )

    def interrupted(self) -> str:
        """Ctrl-C; what it printed in all, once it exited 0."""
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=60)
        assert self.process.returncode == 0, self.printed()
        return self.printed()


@contextlib.contextmanager
def dev(*args: str, **settings: str) -> Iterator[Dev]:
    """`recoveryd dev ARGS` until the block ends (killed if it has not stopped by then),
    with `settings` the only EMULATOR_*/RECOVERYD_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EMULATOR_", "RECOVERYD_"))}
    env |= settings
    process = subprocess.Popen(
        [*RECOVERYD, "dev", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=env,
    )  # fmt: skip
    running = Dev(process)
    reader = threading.Thread(target=running.read, daemon=True)
    reader.start()
    try:
        yield running
    finally:
        stop(process)
        reader.join(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


@dataclass
class ExampleApp:
    process: subprocess.Popen[bytes]
    log: Path

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def example_app(port: int, printed: str, log: Path) -> Iterator[ExampleApp]:
    """The example app under uvicorn on `port`, its environment the `export` lines dev
    printed and nothing of the caller's QSTASH_*/UPSTASH_* (QSTASH_DEV would start the
    service's own dev server)."""
    exported = dict(re.findall(r"^  export (QSTASH_\w+)=(\S+)$", printed, re.MULTILINE))
    assert sorted(exported) == [
        "QSTASH_CURRENT_SIGNING_KEY", "QSTASH_NEXT_SIGNING_KEY", "QSTASH_TOKEN", "QSTASH_URL",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QSTASH_", "UPSTASH_"))}
    env |= {name: shlex.split(value)[0] for name, value in exported.items()}
    command = [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port)]
    with log.open("w") as output:
        process = subprocess.Popen(
            command, cwd=EXAMPLE, env=env, stdout=output, stderr=subprocess.STDOUT
        )
    app = ExampleApp(process, log)
    try:

        def answering() -> bool:
            assert process.poll() is None, app.logs()
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{port}/docs", timeout=1).status_code == 200
            return False

        wait_for(answering, 60, "the example app")
        yield app
    finally:
        stop(process)


def start_run(printed: str, payload: str) -> dict[str, Any]:
    """Run the curl command dev printed, with `payload` as its body, and the answer."""
    [line] = [line for line in printed.splitlines() if line.startswith("  curl ")]
    words = shlex.split(line)
    assert words[:3] == ["curl", "-X", "POST"]
    url, options = words[3], words[4:]
    headers = dict(
        value.split(": ", 1) for flag, value in itertools.pairwise(options)
        if flag == "-H"
    )  # fmt: skip
    assert options[-2] == "-d"
    response = httpx.post(url, headers=headers, content=payload, timeout=10)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


@dataclass
class Session:
    dev: Dev
    app: ExampleApp
    printed: str

    def url(self, name: str) -> str:
        [found] = re.findall(rf"^  {name} +(http://\S+)", self.printed, re.MULTILINE)
        return str(found)

    def runs(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url('emulator')}/_emulator/workflows", timeout=10)
        response.raise_for_status()
        runs: list[dict[str, Any]] = response.json()
        return runs


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """dev --app for the example app and the test's rules, then the app started with what
    dev printed: as a user does it."""
    folder = tmp_path_factory.mktemp("dev-app")
    rules = folder / "rules.yaml"
    rules.write_text(RULES)
    port = free_port()
    workflow = f"http://127.0.0.1:{port}/workflow"
    with dev("--app", workflow, "--rules", str(rules)) as running:
        printed = running.banner()
        with example_app(port, printed, folder / "app.log") as app:
            yield Session(running, app, printed)


def run_of(app: ExampleApp, order: int) -> str:
    """The id of the run the app started for `order` (its SDK makes it on the first call)."""
    pattern = rf"run (wfr_\S+): step 1, stock reserved for order {order}\n"
    [run_id] = wait_for(lambda: re.findall(pattern, app.logs()), 60, f"order {order}'s run")
    return str(run_id)


def test_a_run_started_as_printed_completes(session: Session) -> None:
    """The curl command dev prints starts a run of the app, which runs to its end."""
    start_run(session.printed, '{"order": 1}')
    run_id = run_of(session.app, 1)
    completed = {"workflowRunId": run_id, "status": "completed"}
    wait_for(lambda: any(run.items() >= completed.items() for run in session.runs()), 60, "the end")
    assert "step 3, order 1 charged, confirmed" in session.app.logs()


def test_a_run_dead_lettered_is_resumed_by_the_rules_given_and_completes(
    session: Session,
) -> None:
    """A step that runs out of retries lands in the DLQ; the app's failure function and
    recoveryd both hear of it; recoveryd resumes it by the rules file given to dev, and
    the new run carries on from the failed step to the end."""
    start_run(session.printed, '{"order": 2, "failures": 5}')  # 4 attempts, then 1 more
    run_id = run_of(session.app, 2)
    [token] = re.findall(r"export QSTASH_TOKEN=(\S+)", session.printed)
    emulator = session.url("emulator")

    def dead_letter() -> str | None:
        listed = httpx.get(
            f"{emulator}/v2/dlq", headers={"Authorization": f"Bearer {token}"}, timeout=10
        ).json()
        found = [m["dlqId"] for m in listed["messages"] if m.get("workflowRunId") == run_id]
        return found[0] if found else None

    dlq_id = wait_for(dead_letter, 60, "the dead letter")

    def resumed() -> dict[str, Any] | None:
        found = [run for run in session.runs() if run["sourceDlqId"] == dlq_id]
        return found[0] if found and found[0]["status"] == "completed" else None

    wait_for(resumed, 60, "the resumed run to complete")
    [admin] = re.findall(r"admin (http://\S+)/api/v1/status", session.printed)
    record = httpx.get(f"{admin}/api/v1/dlq/{dlq_id}", verify=LOOPBACK_TLS, timeout=10).json()
    assert (record["rule"], record["action"], record["state"]) == (
        "resume-the-payment-step", "resume", "done",
    )  # fmt: skip
    logs = session.app.logs()
    assert f"run {run_id} failed (500): payment API down (attempt 4)" in logs
    assert logs.count("stock reserved for order 2") == 1  # resumed at step two
    assert logs.count("order 2 charged, confirmed") == 1
    decided = f"decided   {dlq_id}  resume-the-payment-step -> resume"
    wait_for(lambda: decided in session.dev.printed(), 10, "the decision's line")


def test_by_default_it_runs_until_interrupted_then_sums_up(tmp_path: Path) -> None:
    """With no app listening yet and no --duration, dev --app waits for runs until
    Ctrl-C, then prints its summary and exits 0."""
    with dev("--app", f"http://127.0.0.1:{free_port()}/workflow") as running:
        running.banner()
        assert running.process.poll() is None
        printed = running.interrupted()
    assert re.search(r"\nsummary after .*\n  runs +0 ", printed), printed


def test_a_fixed_port_and_credentials_keep_the_apps_environment_the_same() -> None:
    """With --port and the EMULATOR_* credentials set, the environment printed for the app
    is theirs (so it stays right from one start to the next), and the emulator takes them."""
    port = free_port()
    fixed = {
        "EMULATOR_TOKEN": "tok_fixed_for_dev",
        "EMULATOR_SIGNING_KEY_CURRENT": "sig_fixed_current",
        "EMULATOR_SIGNING_KEY_NEXT": "sig_fixed_next",
    }
    with dev("--app", "http://127.0.0.1:9/workflow", "--port", str(port), **fixed) as running:
        printed = running.banner()
        listed = httpx.get(
            f"http://127.0.0.1:{port}/v2/dlq",
            headers={"Authorization": "Bearer tok_fixed_for_dev"},
            timeout=10,
        )
        running.interrupted()
    exported = dict(re.findall(r"^  export (QSTASH_\w+)=(\S+)$", printed, re.MULTILINE))
    assert exported == {
        "QSTASH_URL": f"http://127.0.0.1:{port}",
        "QSTASH_TOKEN": "tok_fixed_for_dev",
        "QSTASH_CURRENT_SIGNING_KEY": "sig_fixed_current",
        "QSTASH_NEXT_SIGNING_KEY": "sig_fixed_next",
    }
    assert listed.status_code == 200, listed.text


def test_a_port_in_use_is_refused_naming_it() -> None:
    """--port on a port something listens on stops it before it starts, saying why."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner(catch_exceptions=False).invoke(
            cli, ["dev", "--app", "http://127.0.0.1:9/workflow", "--port", str(port)]
        )
    assert result.exit_code == 1
    assert f"--port {port}: cannot listen on 127.0.0.1: Address already in use" in result.stderr


@pytest.mark.parametrize("url", ["localhost:8000/workflow", "ftp://127.0.0.1/workflow", "/wf"])
def test_an_app_url_that_is_not_an_http_url_is_refused(url: str) -> None:
    """A bad --app is a usage error that says what is expected, before anything starts."""
    result = CliRunner(catch_exceptions=False).invoke(cli, ["dev", "--app", url])
    assert result.exit_code == 2
    expected = "Invalid value for '--app': must be the absolute http(s) URL of your workflow"
    assert expected in result.stderr
    assert repr(url) in result.stderr
    assert result.stdout == ""


def test_the_options_of_app_are_refused_without_it() -> None:
    """--rules and --port belong to --app: the demo refuses them rather than ignore them."""
    result = CliRunner(catch_exceptions=False).invoke(cli, ["dev", "--port", "8081"])
    assert result.exit_code == 2
    assert "--port goes with --app" in result.stderr
    assert result.stdout == ""
