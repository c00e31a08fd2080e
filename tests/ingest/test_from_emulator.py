"""A failure callback from the emulator's real delivery path is accepted and stored."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from daemon.app import running
from daemon.emulator import create_app
from daemon.http.serving import bind, serve
from daemon.settings import load_settings
from tests.emulator.support import Sink
from tests.support import daemon_env, emulator_config


async def test_a_dead_lettered_delivery_comes_back_signed_and_is_stored(tmp_path: Path) -> None:
    """Publish to a destination that answers 503: the emulator retries, dead-letters the
    message and sends the signed failure callback, which recoveryd verifies and stores."""
    sock = bind("127.0.0.1", 0)
    callback_url = f"http://127.0.0.1:{sock.getsockname()[1]}/callbacks"
    settings = load_settings(daemon_env(tmp_path, PUBLIC_URL=callback_url))
    destination = Sink(statuses={"/work": 503})
    config = emulator_config(delivery_retry_delay=0.01)
    async with (
        running(settings, registry=CollectorRegistry()) as daemon,
        serve(daemon.public, sock=sock),
        serve(destination) as destination_url,
        serve(create_app(config)) as emulator_url,
        httpx.AsyncClient(base_url=emulator_url, timeout=10) as emulator,
    ):
        response = await emulator.post(
            "/_emulator/publish",
            params={"wait": "true"},
            json={"url": f"{destination_url}/work", "body": '{"order": 42}', "maxRetries": 1,
                  "failureCallback": callback_url},
        )  # fmt: skip
        response.raise_for_status()
        [callback] = (await emulator.get("/_emulator/callbacks")).json()
        assert callback["state"] == "delivered"
        stored = await daemon.store.get_callback(callback["dlqId"])
    assert stored is not None
    assert json.loads(stored.body)["url"] == f"{destination_url}/work"
