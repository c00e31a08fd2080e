"""A call a latency fault holds is carried out even when its client goes away meanwhile,
as the service acts on a request whose body it has (a client killed mid-call)."""

from __future__ import annotations

import time

import httpx
import pytest

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from tests.emulator.support import BEARER
from tests.support import emulator_config


def test_a_held_delete_whose_client_left_is_carried_out() -> None:
    group = {
        "name": "orders",
        "endpoints": [{"name": "a", "url": "https://a.example.com/"}, {"url": "https://b/"}],
    }
    with (
        serve_in_thread(create_app(emulator_config())) as url,
        httpx.Client(base_url=url, timeout=10) as control,
    ):
        control.post("/_emulator/url-groups", json=group).raise_for_status()
        fault = {"kind": "latency", "seconds": 0.5, "paths": ["/v2/topics/orders/endpoints"]}
        control.post("/_emulator/faults", json=fault).raise_for_status()
        with pytest.raises(httpx.ReadTimeout):
            httpx.request(
                "DELETE", f"{url}/v2/topics/orders/endpoints", headers=BEARER,
                json={"endpoints": [{"name": "a"}]}, timeout=0.1,
            )  # fmt: skip
        deadline = time.monotonic() + 5
        while len(control.get("/_emulator/url-groups").json()[0]["endpoints"]) == 2:
            assert time.monotonic() < deadline, "the held DELETE was not carried out"
            time.sleep(0.05)
        [left] = control.get("/_emulator/url-groups").json()
    assert left["endpoints"] == [{"url": "https://b/"}]
