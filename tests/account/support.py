"""What the rotation tests share: the settings that turn rotation on, and `recoveryd serve`
as a process beside the emulator, driven and read from outside."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from daemon.emulator import Emulator, create_app
from daemon.http.serving import serve_in_thread
from tests.pipeline.support import RESUME_ALL
from tests.processes import Served
from tests.support import LOOPBACK_TLS, PASSWORD, USERNAME, callback_json, emulator_config, signed

RESET = "/service/user/rotatetoken"


def rotation_settings(credentials: Path, **more: str) -> dict[str, str]:
    """Settings for a daemon that can rotate, saving to `credentials`."""
    return {
        "CREDENTIALS_FILE": str(credentials),
        "ACCOUNT_USERNAME": USERNAME,
        "ACCOUNT_PASSWORD": PASSWORD,
        **more,
    }


@contextlib.contextmanager
def emulator() -> Iterator[tuple[str, httpx.Client, Emulator]]:
    """The emulator on its own thread: its URL, a client for it, and its state."""
    app = create_app(emulator_config(execute_runs=False))
    with (
        serve_in_thread(app) as service_url,
        httpx.Client(base_url=service_url, timeout=10) as control,
    ):
        yield service_url, control, app.state.emulator


def served_settings(tmp_path: Path, service_url: str, credentials: Path) -> dict[str, str]:
    """`recoveryd serve` settings: the emulator, RESUME_ALL, rotation saving to `credentials`."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RESUME_ALL)
    return {"SERVICE_URL": service_url, "RULES": str(rules), **rotation_settings(credentials)}


def status(served: Served) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(
        f"{served.admin_url}/api/v1/status", timeout=5, verify=LOOPBACK_TLS
    ).json()
    return answer


def rotate_in_background(served: Served) -> None:
    """Ask for a rotation without waiting for the answer (the process will be killed)."""

    def ask() -> None:
        with contextlib.suppress(httpx.HTTPError):  # killed mid-answer, as intended
            httpx.post(f"{served.admin_url}/-/rotate-token", timeout=30, verify=LOOPBACK_TLS)

    threading.Thread(target=ask, daemon=True).start()


def send_callbacks(served: Served, dlq_ids: list[str]) -> None:
    for dlq_id in dlq_ids:
        body = callback_json(dlq_id, "failure-callback-workflow.json")
        url = f"{served.url}/callbacks"
        answer = httpx.post(
            url, content=body, headers=signed(body), timeout=10, verify=LOOPBACK_TLS
        )
        assert answer.status_code == 200
