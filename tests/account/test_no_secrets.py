"""No token or password, old or new, in anything recoveryd says: every log line, every
answer of both listeners (errors, metrics, /api/v1) and its database, across rotations
that succeed and fail."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx

from tests.account.support import (
    RESET,
    emulator,
    send_callbacks,
    served_settings,
    status,
)
from tests.processes import serving
from tests.support import (
    PASSWORD,
    SIGNING_KEY_CURRENT,
    SIGNING_KEY_NEXT,
    TOKEN,
    wait_for,
    workflows,
)


def test_no_secret_in_logs_answers_metrics_or_the_store(tmp_path: Path) -> None:
    secrets = {TOKEN, PASSWORD, SIGNING_KEY_CURRENT, SIGNING_KEY_NEXT}
    answers: list[str] = []
    with emulator() as (service_url, control, service):
        settings = served_settings(tmp_path, service_url, tmp_path / "credentials.json")
        with serving(tmp_path, **settings) as served:
            admin = httpx.Client(base_url=served.admin_url, timeout=30)
            public = httpx.Client(base_url=served.url, timeout=10)
            dlq_ids: list[str] = control.post(
                "/_emulator/dlq", json={"messages": workflows(20)}
            ).json()["dlqIds"]
            for wave in range(4):
                send_callbacks(served, dlq_ids[wave * 5 : (wave + 1) * 5])
                answer = admin.post("/-/rotate-token")
                assert answer.status_code == 200, answer.text
                answers.append(answer.text)
                secrets |= {service.account.token, service.account.password}
            # A reset answered 503 (unknown outcome, checked) and one refused outright.
            fault = {"kind": "status", "status": 503, "times": 10, "paths": [RESET]}
            control.post("/_emulator/faults", json=fault).raise_for_status()
            answers.append(admin.post("/-/rotate-token").text)
            control.delete("/_emulator/faults")
            wait_for(lambda: status(served)["states"]["done"] == 20)

            for path in ["/metrics", "/api/v1/status", "/api/v1/dlq/unknown", "/nope"]:
                answers.append(admin.get(path).text)
            answers += [admin.get(f"/api/v1/dlq/{dlq_id}").text for dlq_id in dlq_ids]
            answers.append(admin.post("/-/reload").text)
            for path in ["/healthz", "/readyz", "/nope"]:
                answers.append(public.get(path).text)
            answers.append(public.post("/callbacks", content=b"{}").text)  # unsigned
            answers.append(
                public.post(
                    "/callbacks", content=b"[]", headers={"Content-Type": "application/json"}
                ).text
            )
            admin.close()
            public.close()
            exit_status, logs = served.stop(signal.SIGTERM)
        assert exit_status == 0

    assert len(secrets) == 4 + 2 * 4  # every rotation gave a new token and password
    assert "token rotated" in logs
    assert json.loads((tmp_path / "credentials.json").read_text())["token"] in secrets
    database = (tmp_path / "recoveryd.db").read_bytes()
    everything = {"logs": logs, "answers": "\n".join(answers)}
    for where, text in everything.items():
        leaked = [secret for secret in secrets if secret in text]
        assert not leaked, f"a secret in the {where}"
    assert not [secret for secret in secrets if secret.encode() in database]
