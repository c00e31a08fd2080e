"""The workflow apps the end-to-end tests drive, written with the official SDKs: each
starts, answers its test hooks, and its SDK checks the signature of every delivery as it
does against the service (a request unsigned, signed with another key or by another issuer
is refused; the same request signed reaches the failure function); the Node app's
packages install from its lock offline once cached."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import httpx
import pytest

from daemon.emulator.signing import sign
from tests.apps import support
from tests.support import SIGNING_KEY_CURRENT, SIGNING_KEY_NEXT

RUN = "wfr_tests_failed_run"
REFUSED = "Failed to verify that the Workflow request comes from QStash"
# The SDKs check the issuer against this name, whatever the service calls itself.
ISSUER = "Upstash"
STEP_FAILED = "step 2 is switched to fail"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def failure_callback(app: support.App) -> bytes:
    """A workflow run's failure callback, as the SDKs read it: step two's 500 answer."""
    return json.dumps(
        {
            "status": 500,
            "header": {"Content-Type": ["application/json"]},
            "body": b64(json.dumps({"error": "Error", "message": STEP_FAILED})),
            "url": app.workflow_url,
            "sourceBody": b64('{"hello":"world"}'),
            "workflowRunId": RUN,
            "workflowCreatedAt": int(time.time() * 1000),
        }
    ).encode()


def deliver(app: support.App, body: bytes, signature: str | None) -> httpx.Response:
    """POST `body` to the workflow endpoint as the failure callback of RUN."""
    headers = {
        "Content-Type": "application/json",
        "Upstash-Workflow-Is-Failure": "true",
        "Upstash-Workflow-Failure-Callback": "true",
        "Upstash-Workflow-RunId": RUN,
    }
    if signature is not None:
        headers["Upstash-Signature"] = signature
    return httpx.post(app.workflow_url, content=body, headers=headers, timeout=30)


def signed(app: support.App, body: bytes, *, key: str, issuer: str = ISSUER) -> str:
    return sign(body, url=app.workflow_url, key=key, issuer=issuer, now=time.time())


def assert_refused_by_the_sdk(app: support.App, answer: httpx.Response) -> None:
    """The SDK's own answer to a delivery it cannot verify, and nothing of the app run."""
    assert answer.status_code == 500, answer.text
    assert answer.json()["error"] == "WorkflowError"
    assert answer.json()["message"].startswith(REFUSED), answer.text
    recorded = app.steps()
    assert recorded["failures"] == []
    assert recorded["runs"] == {"step-1": 0, "step-2": 0, "step-3": 0}
    assert recorded["deliveries"][-1]["status"] == 500


def test_the_app_answers_its_switch_and_its_steps(app: support.App) -> None:
    """The switch turns step two's failure on and off; /steps shows it and no step run."""
    assert app.steps() == {
        "fail": False,
        "runs": {"step-1": 0, "step-2": 0, "step-3": 0},
        "deliveries": [],
        "failures": [],
    }
    assert app.switch(fail=True) == {"fail": True}
    assert app.steps()["fail"] is True
    assert app.switch(fail=False) == {"fail": False}
    assert app.steps()["fail"] is False


def test_an_unsigned_delivery_is_refused_by_the_sdk(app: support.App) -> None:
    """A delivery without a signature gets the SDK's 500, the failure function not run."""
    answer = deliver(app, failure_callback(app), signature=None)
    assert_refused_by_the_sdk(app, answer)
    assert "`Upstash-Signature` header is not passed" in answer.json()["message"]


def test_a_delivery_signed_with_another_key_is_refused_by_the_sdk(app: support.App) -> None:
    """A signature made with neither signing key gets the SDK's 500."""
    body = failure_callback(app)
    other_key = "sig_other_tests_key_0123456789abcdefghij"
    assert_refused_by_the_sdk(app, deliver(app, body, signed(app, body, key=other_key)))


def test_a_delivery_signed_by_another_issuer_is_refused_by_the_sdk(app: support.App) -> None:
    """A signature with the right key but an issuer other than `Upstash` gets the SDK's 500."""
    body = failure_callback(app)
    signature = signed(app, body, key=SIGNING_KEY_CURRENT, issuer="Service")
    assert_refused_by_the_sdk(app, deliver(app, body, signature))


def test_a_delivery_whose_body_is_not_the_one_signed_is_refused_by_the_sdk(
    app: support.App,
) -> None:
    """A signature made for another body gets the SDK's 500."""
    body = failure_callback(app)
    signature = signed(app, body.replace(b"500", b"503"), key=SIGNING_KEY_CURRENT)
    assert_refused_by_the_sdk(app, deliver(app, body, signature))


@pytest.mark.parametrize("key", [SIGNING_KEY_CURRENT, SIGNING_KEY_NEXT], ids=["current", "next"])
def test_a_signed_failure_callback_reaches_the_failure_function(app: support.App, key: str) -> None:
    """Signed with either key, the same failure callback is let through to the failure
    function, with the failed step's status and message; no step runs."""
    body = failure_callback(app)  # made once: it carries the time, to the millisecond
    answer = deliver(app, body, signed(app, body, key=key))
    assert answer.status_code == 200, answer.text
    recorded = app.steps()
    assert [
        (failure["workflowRunId"], failure["status"], failure["response"])
        for failure in recorded["failures"]
    ] == [(RUN, 500, STEP_FAILED)]
    assert recorded["runs"] == {"step-1": 0, "step-2": 0, "step-3": 0}
    assert recorded["deliveries"][-1]["headers"]["upstash-workflow-runid"] == RUN


@pytest.mark.needs("node", "npm")
def test_npm_ci_installs_the_node_app_offline_from_its_lock_once_cached(
    node_installed: Path, npm_cache: Path, tmp_path: Path
) -> None:
    """Once the session's `npm ci` has filled the cache, `npm ci --offline` installs the
    lock's versions from it alone (and from an empty cache it cannot)."""
    support.install_node_app(tmp_path / "offline", npm_cache, offline=True)
    lock = json.loads((support.NODE_APP / "package-lock.json").read_text())
    for name, pinned in lock["packages"].items():
        if name:
            installed = json.loads((tmp_path / "offline" / name / "package.json").read_text())
            assert installed["version"] == pinned["version"], name

    (tmp_path / "empty").mkdir()
    for name in support.NODE_FILES:
        (tmp_path / "empty" / name).write_bytes((support.NODE_APP / name).read_bytes())
    empty = support.npm_ci(tmp_path / "empty", tmp_path / "empty-cache", offline=True)
    assert empty.returncode != 0
    assert "ENOTCACHED" in empty.stdout + empty.stderr
