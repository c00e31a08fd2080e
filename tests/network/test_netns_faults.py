"""Network faults between the daemon and the service, in real network namespaces: the
emulator in one, recoveryd in the other, a veth between them with delay, loss, resets,
a partition or a rate limit on it. Every callback the daemon answered 2xx ends in a
final state, and the service recovered each dlqId exactly once.

The test reaches both sides through Unix sockets, which no network namespace or fault
of the link touches: the veth is the only path between the daemon and the service, and
the service's callbacks cross it too."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.network.support import (
    IMPAIRMENTS,
    Kernel,
    Pair,
    Seen,
    link_counters,
    namespace_pair,
    namespaces_refused,
    probe_kernel,
)
from tests.pipeline.support import BULK_PATHS, FINAL, RESUME_ALL, sent_per_dlq_id
from tests.processes import stop
from tests.support import workflows

CALLBACKS = 300
SEND_FOR = 60.0  # the service retries each callback until answered 2xx, this long at most
IMPAIRED_FOR = 30.0  # the fault stays on until all is final, this long at most
SETTLE = 30.0  # once the fault is off, everything is final within this
BULK_LATENCY = 0.3  # seconds the service holds each bulk call before it acts
NO_ANSWER = ("timeout", "connection", "transport")  # recoveryd_upstream_calls_total statuses
ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.needs("ip", "tc")


@pytest.fixture(scope="module")
def kernel() -> Kernel:
    """What this machine can do to a link; the whole module is skipped, with the reason,
    where it cannot make network namespaces (not root, or a kernel that refuses: no
    package gives that, so even under CI)."""
    refused = namespaces_refused()
    if refused is not None:
        pytest.skip(refused)
    return probe_kernel()


@dataclass
class Node:
    """A program of `tests.network.nodes` running in a namespace."""

    process: subprocess.Popen[bytes]
    log: Path

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def node(namespace: str, log: Path, *args: str) -> Iterator[Node]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERYD_")}
    argv = ["ip", "netns", "exec", namespace, sys.executable, "-m", "tests.network.nodes", *args]
    with log.open("ab") as stderr:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            argv, cwd=ROOT, env=environ, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        yield Node(process, log)
    finally:
        stop(process)


@dataclass
class World:
    pair: Pair
    emulator: httpx.Client  # the emulator's API, control routes included
    admin: httpx.Client  # the daemon's admin listener
    daemon: Node
    tmp_path: Path

    def seed(self, count: int) -> list[str]:
        """`count` failed workflow runs in the DLQ. The service takes its time over each
        bulk call, so calls are out when the link fails: it acts, and the answer is lost."""
        answer = self.emulator.post("/_emulator/dlq", json={"messages": workflows(count)})
        answer.raise_for_status()
        slow = {"kind": "latency", "seconds": BULK_LATENCY, "times": count, "paths": BULK_PATHS}
        self.emulator.post("/_emulator/faults", json=slow).raise_for_status()
        dlq_ids: list[str] = answer.json()["dlqIds"]
        return dlq_ids

    def send_callbacks(self, dlq_ids: list[str]) -> dict[str, Any]:
        """The service's failure callbacks, sent from its namespace across the link."""
        ids, out = self.tmp_path / "dlq-ids.txt", self.tmp_path / "sent.json"
        ids.write_text("\n".join(dlq_ids))
        log = self.tmp_path / "sender.log"
        with node(self.pair.service, log, "send", str(ids), str(out), str(SEND_FOR)) as sender:
            sender.process.wait(timeout=SEND_FOR + 30)
        assert sender.process.returncode == 0, sender.logs()
        sent: dict[str, Any] = json.loads(out.read_text())
        return sent

    def states(self) -> dict[str, int]:
        status = self.admin.get("/api/v1/status").raise_for_status().json()
        return {state: n for state, n in status["states"].items() if n}

    def settled(self, count: int, seconds: float) -> dict[str, int]:
        """The counts by state once `count` dlqIds are final, or after `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            states = self.states()
            if sum(states.get(state, 0) for state in FINAL) >= count:
                return states
            if time.monotonic() > deadline or self.daemon.process.poll() is not None:
                return states
            time.sleep(0.1)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the daemon's samples `name` whose labels include `labels`."""
        metrics = self.admin.get("/metrics").raise_for_status().text
        return sum(
            sample.value
            for family in text_string_to_metric_families(metrics)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def upstream(self) -> tuple[float, float]:
        """The daemon's calls to the service so far that got no answer, and those
        answered within 50 ms."""
        calls = "recoveryd_upstream_calls_total"
        unanswered = sum(self.metric(calls, status=reason) for reason in NO_ANSWER)
        return unanswered, self.metric("recoveryd_upstream_call_duration_seconds_bucket", le="0.05")


def unix_client(path: Path) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(path)), base_url="http://local", timeout=10
    )


def wait_until_answering(served: Node, sock: Path, route: str) -> None:
    with unix_client(sock) as client:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if served.process.poll() is not None:
                raise AssertionError(f"it exited: {served.logs()}")
            if listening(sock) and client.get(route).status_code == 200:
                return
            time.sleep(0.05)
    raise AssertionError(f"no answer on {route}: {served.logs()}")


def listening(sock: Path) -> bool:
    """Whether the Unix socket takes connections. Asked before httpx connects to it:
    httpcore leaves its own socket open when a connection to a path fails."""
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(sock))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def world(tmp_path: Path) -> Iterator[World]:
    """A namespace pair with the emulator in the service's and recoveryd (resuming every
    workflow run, in batches of 10) in the daemon's; all of it gone at the end."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RESUME_ALL)
    with contextlib.ExitStack() as stack:
        pair = stack.enter_context(namespace_pair())
        # A short path: a Unix socket's must fit in 108 bytes, and tmp_path's may not.
        sockets = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rdnet-")))
        emulator_node = stack.enter_context(
            node(pair.service, tmp_path / "emulator.log", "emulator", str(sockets / "service"))
        )
        daemon = stack.enter_context(
            node(pair.daemon, tmp_path / "daemon.log", "daemon", str(tmp_path), str(rules),
                 str(sockets / "admin"))
        )  # fmt: skip
        wait_until_answering(emulator_node, sockets / "service", "/_emulator/stats")
        wait_until_answering(daemon, sockets / "admin", "/api/v1/status")
        emulator = stack.enter_context(unix_client(sockets / "service"))
        admin = stack.enter_context(unix_client(sockets / "admin"))
        yield World(pair, emulator, admin, daemon, tmp_path)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=pytest.mark.needs(*impairment.programs))
     for name, impairment in IMPAIRMENTS.items()],
)  # fmt: skip
def test_every_accepted_callback_ends_final_and_is_recovered_once(
    name: str, kernel: Kernel, tmp_path: Path
) -> None:
    """Under the fault, every callback answered 2xx ends `done`, each dlqId run once."""
    impairment = IMPAIRMENTS[name]
    refused = impairment.refused(kernel)
    if refused is not None:
        pytest.skip(refused)
    with world(tmp_path) as sides:
        dlq_ids = sides.seed(CALLBACKS)
        before, (unanswered_before, quick_before) = link_counters(sides.pair), sides.upstream()
        with impairment.applied(sides.pair):
            sent = sides.send_callbacks(dlq_ids)
            sides.settled(len(sent["accepted"]), IMPAIRED_FOR)
            during = link_counters(sides.pair)
        states = sides.settled(len(sent["accepted"]), SETTLE)
        assert sides.daemon.process.poll() is None, sides.daemon.logs()[-5000:]
        status = sides.admin.get("/api/v1/status").raise_for_status().json()
        records = [sides.admin.get(f"/api/v1/dlq/{dlq_id}").json() for dlq_id in dlq_ids]
        unanswered, quick = sides.upstream()
        crashes = sides.metric("recoveryd_task_crashes_total")
        journal: list[dict[str, Any]] = sides.emulator.get("/_emulator/journal").json()
        runs: list[dict[str, Any]] = sides.emulator.get("/_emulator/runs").json()

    asked = sent_per_dlq_id([call for call in journal if call["path"] in BULK_PATHS])
    lost = sum(times > 1 for times in asked.values())
    failures = sum(sent["failures"].values())
    seen = Seen(
        during - before, int(unanswered - unanswered_before), int(quick - quick_before),
        failures, lost,
    )  # fmt: skip
    checked = sides.daemon.logs().count('"batch checked"')
    print(f"{name}: {seen}; callbacks {sent['failures']}; batches checked: {checked}")
    # The fault hit the traffic: otherwise this would pass for a healthy link too.
    assert impairment.shown(seen), f"no sign of the fault ({impairment.shows}): {seen}"
    # The service, retrying, got every callback accepted...
    assert sorted(sent["accepted"]) == sorted(dlq_ids), sent["failures"]
    # ...and each ended final, recovered: none failed, none left pending.
    not_done = {r["dlqId"]: (r["state"], r["reason"]) for r in records if r["state"] != "done"}
    assert not not_done, not_done
    assert states == {"done": CALLBACKS}, states
    assert status["pendingBatches"] == 0
    # Exactly once, as the service saw it: one run made from each dlqId, and each dlqId
    # in a bulk call it answered 200. (A call whose answer was lost may be made again:
    # the service skips the dlqIds that already left the DLQ, so no second run.)
    assert Counter(run["sourceDlqId"] for run in runs) == Counter(dict.fromkeys(dlq_ids, 1))
    assert set(asked) == set(dlq_ids)
    assert crashes == 0, sides.daemon.logs()[-5000:]
