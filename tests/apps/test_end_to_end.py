"""The acceptance tests of issue 40, end to end: a user's workflow app written with each
official SDK, the emulator speaking the workflow protocol, and recoveryd as a process of
its own. A run's second step fails while the app's switch is on; the run fails its
retries, lands in the DLQ, the failure callback reaches the app's failure function and
(as a copy) recoveryd, whose rule resumes or restarts it; the switch is off by then, so
the recovered run completes.

The copy goes to a relay (a recorder standing in front of recoveryd, whose public URL it
is): the test turns the switch off once the copy has arrived and only then hands it to
recoveryd, byte for byte, with its signature. So the switch is off before recoveryd can
act, whatever the machine's load, and the test knows when recoveryd answered.

The apps' /sleepy runs a step, `context.sleep` for a second and a step: the emulator holds
the step after the sleep back for the delay the SDK published it with."""

from __future__ import annotations

import itertools
import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.http.serving import serve_in_thread
from tests.apps.support import App
from tests.emulator.support import Received, Sink
from tests.processes import Served, emulator_process, serving
from tests.support import LOOPBACK_TLS, TOKEN, emulator_config, wait_for

INITIAL = '{"order":42}'
RETRIES = 1  # the run's own: it fails after two deliveries of step two
RESUME_RETRIES = 2  # the rule's override
RETRY_DELAY = "pow(2, retried) * 200"  # the rule's override, ms: 200 then 400
WAITS = (0.2, 0.4)  # seconds; the emulator's own backoff here would be 0.01, 0.02
# recoveryd sends its resume or restart this long after deciding (the rule's batch), which
# leaves the SIGKILL test the time between its answer and its call.
BATCH_WAIT = "1s"
FAILED = "step 2 is switched to fail"
# What each SDK answers a failed step with.
ERROR_CONTENT_TYPE = {"python": "application/json", "node": "text/plain;charset=UTF-8"}

# The apps' `context.sleep("nap", 1)`: a second, as the SDKs spell it in `Delay`; under
# the emulator's max_delay_seconds (1 s), so the emulator waits all of it.
SLEEP = 1.0
SLEEP_DELAY = "1s"

pytestmark = pytest.mark.timeout(120)


@dataclass
class Relay:
    """Where the emulator sends its copy of each failure callback: recorded, answered 200."""

    sink: Sink
    url: str  # recoveryd's public URL: the copy is signed for it

    def copies(self) -> list[Received]:
        return self.sink.at("/callbacks")


@pytest.fixture(scope="module")
def relay() -> Iterator[Relay]:
    sink = Sink()
    with serve_in_thread(sink) as url:
        yield Relay(sink, f"{url}/callbacks")


@pytest.fixture(scope="module")
def emulator(relay: Relay) -> Iterator[str]:
    """The emulator, as QStash spells its headers (the SDKs verify the issuer `Upstash`),
    copying every workflow failure callback to the relay; one for the module's tests (a
    process takes a second or more to start on a loaded machine)."""
    config = emulator_config(
        header_prefix="Upstash", failure_callback_copy=relay.url, delivery_retry_delay=0.01
    )
    with emulator_process(config) as url:
        yield url


@pytest.fixture
def service_url(emulator: str, relay: Relay) -> str:
    """The emulator and the relay, emptied for the test (its app and recoveryd are new)."""
    httpx.post(f"{emulator}/_emulator/reset", timeout=10).raise_for_status()
    relay.sink.received.clear()
    return emulator


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"WORKFLOW_RETRIES": str(RETRIES)}  # the Python app's; Node's come at the trigger


@pytest.fixture
def service(service_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=service_url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
        verify=LOOPBACK_TLS,
    ) as client:
        yield client


def rules(tmp_path: Path, action: str) -> Path:
    """A rules file that recovers every workflow with `action` and the overrides."""
    path = tmp_path / "rules.yaml"
    path.write_text(
        f"""version: 1
rules:
  - name: recover-workflows
    match: {{workflow: true}}
    action: {action}
    overrides: {{retries: {RESUME_RETRIES}, retryDelay: "{RETRY_DELAY}"}}
    batch: {{maxSize: 50, maxWait: {BATCH_WAIT}}}
"""
    )
    return path


def recoveryd_settings(
    tmp_path: Path, service_url: str, relay: Relay, action: str
) -> dict[str, str]:
    return {
        "SERVICE_URL": service_url,
        "HEADER_PREFIX": "Upstash",
        "PUBLIC_URL": relay.url,
        "RULES": str(rules(tmp_path, action)),
    }


def start_run(app: App, service: httpx.Client) -> None:
    """A run of the app's workflow: the Node app triggers it with the SDK's client (its
    retries and failure URL go there); the Python app's SDK starts it itself on a plain
    message to its endpoint (its retries come from `serve`, its failure URL is itself)."""
    if app.sdk == "node":
        options = {"body": INITIAL, "retries": RETRIES, "failureUrl": app.workflow_url}
        response = httpx.post(f"{app.url}/trigger", json=options, timeout=10)
    else:
        headers = {"Content-Type": "application/json"}
        response = service.post(f"/v2/publish/{app.workflow_url}", content=INITIAL, headers=headers)
    assert response.status_code == 200, response.text


def fail_a_run(app: App, service: httpx.Client, relay: Relay) -> Received:
    """A run whose step two fails its retries; once its failure callback's copy has come,
    the switch is turned off. The copy."""
    app.switch(fail=True)
    start_run(app, service)
    [copy] = wait_for(relay.copies, what="the failure callback's copy")
    app.switch(fail=False)
    return copy


def hand_over(copy: Received, recoveryd: Served) -> httpx.Response:
    """The copy, as the emulator sent it, to recoveryd's /callbacks."""
    headers = {name: copy.headers[name] for name in ("content-type", "upstash-signature")}
    return httpx.post(
        f"{recoveryd.url}/callbacks", content=copy.body, headers=headers, verify=LOOPBACK_TLS
    )


def workflows(service: httpx.Client) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = service.get("/_emulator/workflows").raise_for_status().json()
    return listed


def recovered_runs(service: httpx.Client, dlq_id: str) -> list[dict[str, Any]]:
    return [run for run in workflows(service) if run["sourceDlqId"] == dlq_id]


def completed(service: httpx.Client, dlq_id: str) -> dict[str, Any] | None:
    """The run recovered from `dlq_id`, once it has completed."""
    runs = recovered_runs(service, dlq_id)
    return next((run for run in runs if run["status"] == "completed"), None)


def recovery_calls(service: httpx.Client, action: str) -> list[dict[str, Any]]:
    """recoveryd's bulk resume or restart calls, from the emulator's journal."""
    journal: list[dict[str, Any]] = service.get("/_emulator/journal").raise_for_status().json()
    path = f"/v2/workflows/dlq/{action}"
    return [call for call in journal if call["method"] == "POST" and call["path"] == path]


def recover(app: App, service: httpx.Client, relay: Relay, tmp_path: Path, action: str) -> str:
    """A failed run recovered by recoveryd with `action`, completed: the new run's id."""
    copy = fail_a_run(app, service, relay)
    dlq_id = json.loads(copy.body)["dlqId"]
    settings = recoveryd_settings(tmp_path, str(service.base_url), relay, action)
    with serving(tmp_path, **settings) as recoveryd:
        assert hand_over(copy, recoveryd).is_success
        run = wait_for(lambda: completed(service, dlq_id), what="the recovered run")
    run_id: str = run["workflowRunId"]
    return run_id


def step_deliveries(app: App, run_id: str) -> list[dict[str, Any]]:
    """The deliveries of `run_id`'s steps to the app (not its failure callback)."""
    delivered: list[dict[str, Any]] = app.steps()["deliveries"]
    return [
        d
        for d in delivered
        if d["headers"].get("upstash-workflow-runid") == run_id
        and "upstash-workflow-is-failure" not in d["headers"]
    ]


def test_a_resumed_run_completes_without_running_its_first_step_again(
    app: App, service: httpx.Client, relay: Relay, tmp_path: Path
) -> None:
    """Resumed by recoveryd, the run goes on from step two: step one ran once, step three once."""
    run_id = recover(app, service, relay, tmp_path, "resume")
    runs = app.steps()["runs"]
    assert runs == {"step-1": 1, "step-2": 1 + RETRIES + 1, "step-3": 1}
    # The new run: step two delivered again, then step three, then the SDK's end of it.
    assert [d["steps"] for d in step_deliveries(app, run_id)] == [["step-2"], ["step-3"], []]


def test_a_resumed_run_takes_the_rules_retries_and_retry_delay(
    app: App, service: httpx.Client, relay: Relay, tmp_path: Path
) -> None:
    """recoveryd's resume carries the rule's overrides; the new run's steps are retried by them."""
    copy = fail_a_run(app, service, relay)
    app.switch(fail=True)  # the resumed step fails again: its retries show
    dlq_id = json.loads(copy.body)["dlqId"]
    settings = recoveryd_settings(tmp_path, str(service.base_url), relay, "resume")
    with serving(tmp_path, **settings) as recoveryd:
        assert hand_over(copy, recoveryd).is_success
        wait_for(lambda: len(relay.copies()) == 2, what="the resumed run's failure")
    [call] = recovery_calls(service, "resume")
    assert call["headers"]["upstash-retries"] == str(RESUME_RETRIES)
    assert call["headers"]["upstash-retry-delay"] == RETRY_DELAY
    [run] = recovered_runs(service, dlq_id)
    assert run["status"] == "failed"
    attempts = step_deliveries(app, run["workflowRunId"])
    assert [d["headers"]["upstash-retried"] for d in attempts] == ["0", "1", "2"]
    assert all(d["steps"] == ["step-2"] and d["status"] != 200 for d in attempts)
    gaps = [later["at"] - earlier["at"] for earlier, later in itertools.pairwise(attempts)]
    assert all(gap >= wait for gap, wait in zip(gaps, WAITS, strict=True)), gaps


def test_a_restarted_run_runs_its_first_step_again(
    app: App, service: httpx.Client, relay: Relay, tmp_path: Path
) -> None:
    """Restarted by recoveryd, the run starts over: step one runs twice in all, step three once."""
    run_id = recover(app, service, relay, tmp_path, "restart")
    runs = app.steps()["runs"]
    assert runs == {"step-1": 2, "step-2": 1 + RETRIES + 1, "step-3": 1}
    delivered = [d["steps"] for d in step_deliveries(app, run_id)]
    assert delivered == [["step-1"], ["step-2"], ["step-3"], []]


def test_the_failure_function_gets_the_run_its_status_answer_and_headers(
    app: App, service: httpx.Client, relay: Relay
) -> None:
    """The SDK calls the failure function once with the run id, 500, the step's error, headers."""
    copy = fail_a_run(app, service, relay)
    run_id = json.loads(copy.body)["workflowRunId"]
    [failure] = wait_for(lambda: app.steps()["failures"], what="the failure function's call")
    assert failure["workflowRunId"] == run_id
    assert failure["status"] == 500
    assert failure["response"] == FAILED
    # The failed answer's headers, as the service passes them on: name -> values.
    headers = {name.lower(): values for name, values in failure["headers"].items()}
    assert headers["content-type"] == [ERROR_CONTENT_TYPE[app.sdk]]
    if app.sdk == "node":  # the JavaScript SDK names the failed step in its answer
        assert headers["upstash-error-step-name"] == ["step-2"]


def test_a_recoveryd_killed_after_answering_the_callback_resumes_the_run_once(
    app: App, service: httpx.Client, relay: Relay, tmp_path: Path
) -> None:
    """SIGKILL between the callback's 2xx and the resume: restarted on its store, one resume."""
    copy = fail_a_run(app, service, relay)
    dlq_id = json.loads(copy.body)["dlqId"]
    settings = recoveryd_settings(tmp_path, str(service.base_url), relay, "resume")
    with serving(tmp_path, **settings) as first:
        assert hand_over(copy, first).is_success
        first.stop(signal.SIGKILL)
    assert recovery_calls(service, "resume") == []  # killed before its batch was sent
    with serving(tmp_path, **settings):
        wait_for(lambda: completed(service, dlq_id), what="the resumed run")
    assert len(recovery_calls(service, "resume")) == 1
    assert len(recovered_runs(service, dlq_id)) == 1
    assert app.steps()["runs"] == {"step-1": 1, "step-2": 1 + RETRIES + 1, "step-3": 1}


def start_sleepy_run(app: App, service: httpx.Client) -> None:
    """A run of the app's /sleepy, started as `start_run` starts one of /workflow."""
    if app.sdk == "node":
        options = {"body": INITIAL, "path": "/sleepy"}
        response = httpx.post(f"{app.url}/trigger", json=options, timeout=10)
    else:
        headers = {"Content-Type": "application/json"}
        response = service.post(f"/v2/publish/{app.url}/sleepy", content=INITIAL, headers=headers)
    assert response.status_code == 200, response.text


def sleep_publishes(service: httpx.Client) -> list[tuple[float, dict[str, str]]]:
    """The `context.sleep` steps the SDK published (both SDKs batch their steps), from the
    emulator's journal: when each call came, and the step's headers (names lowercased)."""
    journal: list[dict[str, Any]] = service.get("/_emulator/journal").raise_for_status().json()
    published = []
    for call in journal:
        if call["method"] != "POST" or call["path"] != "/v2/batch":
            continue
        for item in json.loads(call["body"]):
            if json.loads(item["body"]).get("stepType") == "SleepFor":
                headers = {name.lower(): value for name, value in item["headers"].items()}
                published.append((call["at"], headers))
    return published


def test_a_run_sleeps_before_the_step_after_its_sleep(app: App, service: httpx.Client) -> None:
    """`context.sleep` of a second: the next step comes a second after the sleep, each step once."""
    start_sleepy_run(app, service)
    [run] = wait_for(
        lambda: [run for run in workflows(service) if run["status"] == "completed"],
        what="the run's end",
    )
    assert run["steps"] == 3  # before, nap, after: the SDK's history
    assert app.steps()["runs"] == {"step-1": 0, "step-2": 0, "step-3": 0, "before": 1, "after": 1}
    # The steps' deliveries: "before" run, the sleep published, "after" run, the SDK's end.
    delivered = step_deliveries(app, run["workflowRunId"])
    assert [d["steps"] for d in delivered] == [["before"], [], ["after"], []]
    assert all(d["path"] == "/sleepy" and d["status"] == 200 for d in delivered)
    [(published_at, headers)] = sleep_publishes(service)
    assert headers["upstash-delay"] == SLEEP_DELAY
    assert delivered[1]["at"] <= published_at  # published while the second delivery was served
    assert delivered[2]["at"] - published_at >= SLEEP
