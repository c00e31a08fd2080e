"""bench.receiver_only, the ceiling row of bench.ingest: recoveryd's receiver behind
recoveryd's own listener protocol, so that its rate bounds what `recoveryd serve` could
reach with any store. Started as bench.ingest starts it."""

from __future__ import annotations

from pathlib import Path

import httpx

from bench.servers import receiver_server

KEY = "bench-signing-key-0123456789abcdef"


def test_the_ceiling_runs_behind_recoveryds_listener(tmp_path: Path) -> None:
    with receiver_server(tmp_path, KEY, "Service") as server:
        url = f"http://{server.host}:{server.port}/callbacks"
        # The listener's header limit (16 KiB by default) answers 431 before the app
        # sees the request; plain uvicorn would have passed it to the receiver.
        too_long = httpx.post(url, content=b"{}", headers={"x-pad": "a" * 20_000})
        assert too_long.status_code == 431, too_long.text
        # Behind it, the receiver itself: an unsigned callback is refused by name.
        unsigned = httpx.post(url, json={"dlqId": "1"})
        assert unsigned.status_code == 401
        assert "Service-Signature" in unsigned.json()["error"]
