"""The `recoveryd` command as a user runs it: real subprocesses, real output."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from daemon.store import open_store
from tests.processes import free_port
from tests.store.support import settled
from tests.support import LOOPBACK_TLS, callback_json, running_recoveryd, signed

RECOVERYD = [sys.executable, "-m", "daemon"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RECOVERYD, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def run_in(folder: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """`recoveryd ARGS` run in `folder` with only `settings` of the RECOVERYD_* variables
    (named without the prefix), as in a shell where none is exported."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("RECOVERYD_")}
    env |= {f"RECOVERYD_{name}": value for name, value in settings.items()}
    return subprocess.run(
        [*RECOVERYD, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


# Nothing to ask (port 0): the commands work on the store themselves, as with no daemon.
NO_DAEMON = {"ADMIN_LISTEN": "127.0.0.1:0"}
# What restore-endpoint needs besides, to get as far as the store.
SERVICE = {"SERVICE_URL": "http://127.0.0.1:9", "TOKEN": "tok_cli_tests"}


def test_help_lists_the_commands() -> None:
    """`python -m daemon --help` is the recoveryd command."""
    result = run("--help")
    assert result.returncode == 0
    assert "dev" in result.stdout
    assert "emulator" in result.stdout


def test_help_describes_each_command_in_full_as_the_docs_do() -> None:
    """`recoveryd --help` gives each command the description of docs/cli.md's table,
    whole: none is cut short with "...", even on a narrow terminal."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    table = dict(re.findall(r"^\| \[`recoveryd ([\w-]+)`\]\(#[\w-]+\) \| (.+) \|$", docs, re.M))
    result = subprocess.run(
        [*RECOVERYD, "--help"], env=os.environ | {"COLUMNS": "80"}, capture_output=True,
        text=True, timeout=60, check=True,
    )  # fmt: skip
    listed = result.stdout.split("Commands:\n")[1]
    assert "..." not in listed
    described = dict(re.findall(r"^  ([\w-]+) +(.+(?:\n {4,}\S.*)*)", listed, re.M))
    flat = {name: " ".join(text.split()) for name, text in described.items()}
    assert flat == {name: text[0].upper() + text[1:] + "." for name, text in table.items()}


def test_dev_shows_every_action_and_a_sweep_live_then_sums_up() -> None:
    """`recoveryd dev` runs the real daemon against the emulator: a line per decision,
    service call, notification, endpoint removal and sweep run as they happen, then a
    summary. Within 12s all four actions and a sweep happen (the demo's copy of the rules
    runs the sweep every 8s): runs resumed and restarted, a notification posted, the
    decommissioned endpoint taken out of its URL Group, and the dead letters whose
    failure callbacks were missed swept up. A recovered run is not a success until its
    new run succeeds: the summary splits the recovered and the swept runs by what became
    of them, in numbers that add up and agree with the live lines, which follow the
    emulator's runs; every failure callback received is counted on one line."""
    result = run("dev", "--duration", "12s")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("recoveryd dev: ")  # the banner first, then any line
    header, rest = result.stdout.split(" until 12s:\n")
    live, summary = rest.split("\nsummary after ")
    assert 'sweep nightly-resume runs every 8s (in the file: "0 3 * * *")' in header
    assert re.search(r"notify posts to http://127\.0\.0\.1:\d+/hooks/recoveryd\n", header)

    # resume and restart
    assert re.search(r"dead +wfr_billing_0: POST /billing -> 503 \(3 attempts\)", live)
    assert re.search(r"call +GET /v2/dlq/\S+ -> 200", live)
    assert re.search(r"decided +\S+  restart-billing-on-5xx -> restart\n", live)
    assert re.search(r"decided +\S+  resume-transient-failures -> resume\n", live)
    assert re.search(r"decided +\S+  ignore-canaries -> ignore \(skipped\)", live)
    assert re.search(r"call +POST /v2/workflows/dlq/restart -> 200 \(\d+ dlqIds?: ", live)
    assert re.search(r"sent +restart batch \d+: \d+ dlqIds?, \d+ new runs?", live)
    assert re.search(r"sent +resume batch \d+: \d+ dlqIds?, \d+ new runs?", live)
    assert re.search(r"ok +restarted run of \S+: POST /billing -> 200", live)
    recovered = re.search(
        r"\n  recovered +(\d+)  runs? resumed or restarted: "
        r"(\d+) succeeded, (\d+) failed again, (\d+) still running\n",
        summary,
    )
    assert recovered is not None, summary
    runs, succeeded, failed_again, running = map(int, recovered.groups())
    assert runs == succeeded + failed_again + running
    assert runs == sum(int(n) for n in re.findall(r"sent +\w+ batch \d+: .*, (\d+) new run", live))
    assert succeeded == len(re.findall(r"\bok +(restarted|resumed) run of ", live))
    assert failed_again == len(re.findall(r"\bdead +(restarted|resumed) run of ", live))
    assert succeeded < runs  # /reports fails for good: its resumed runs never succeed

    # notify
    notified = re.findall(
        r"notified +\S+  page-on-workflow-4xx posted to http://127\.0\.0\.1:", live
    )
    assert notified
    assert re.search(
        rf"\n  notified +{len(notified)}  summar(y|ies) delivered to the webhook", summary
    )

    # remove-endpoint
    legacy = re.findall(r"dead +orders/legacy: POST /orders-legacy -> 410 \(3 attempts\)", live)
    assert len(legacy) >= 3  # the rule's threshold
    assert re.search(r"decided +\S+  prune-dead-endpoints -> remove-endpoint \(", live)
    read = live.index("call      GET /v2/topics/orders -> 200")
    deleted = live.index("call      DELETE /v2/topics/orders/endpoints -> 200")
    removed = re.findall(
        r"removed +endpoint legacy from URL Group orders \(prune-dead-endpoints\)\n", live
    )
    assert len(removed) == 1
    assert read < deleted < live.index("removed   endpoint legacy")
    assert re.search(
        r"\n  removed +1  dead endpoint taken out of its URL Group\n"
        r" +legacy from orders after \d+ failures \(410\)\n",
        summary,
    )
    # Its daemon and store are gone once it stops: no hint that would need them. What
    # works after it is said: the command for a deployment, and --forever to try it.
    assert "recoveryd restore-endpoint orders legacy" not in result.stdout
    assert "curl" not in result.stdout
    assert "recoveryd restore-endpoint GROUP NAME" in summary
    assert summary.endswith(
        "`recoveryd dev --forever` keeps it all running until Ctrl-C, to look around.\n"
    )
    assert re.search(rf"\n  counted +{len(legacy)}  failures? of a dead endpoint", summary)

    # the sweep, of the dead letters whose failure callbacks never reached recoveryd
    assert re.search(r"call +POST /v2/workflows/dlq/resume -> 200 \(.*CALLBACK_FAIL", live)
    sweep_runs = re.findall(r"swept +sweep nightly-resume run \d+: (\d+) runs? recovered", live)
    assert sweep_runs
    swept = re.search(
        r"\n  swept +(\d+)  runs? resumed by sweep nightly-resume: "
        r"(\d+) succeeded, (\d+) failed again, (\d+) still running\n",
        summary,
    )
    assert swept is not None, summary
    swept_runs, swept_ok, swept_failed, swept_running = map(int, swept.groups())
    assert swept_runs == sum(map(int, sweep_runs)) >= 1
    assert swept_runs == swept_ok + swept_failed + swept_running
    assert swept_ok == len(re.findall(r"\bok +swept run of \S+: POST /shipping -> 200", live))
    assert swept_failed == len(re.findall(r"\bdead +swept run of ", live))

    # every failure callback received counted once
    counts = dict(
        re.findall(
            r"\n  (stopped|counted|reported|skipped|gone|failed|dry-run|in flight) +(\d+)", summary
        )
    )
    assert set(counts) >= {"stopped", "counted", "skipped", "gone", "failed", "dry-run"}
    assert int(counts["stopped"]) == len(re.findall(r"stopped +\S+  \S+: budget spent", live))
    received = re.search(r"\n  received +(\d+)  failure callbacks?", summary)
    assert received is not None
    assert int(received.group(1)) == runs + sum(map(int, counts.values()))
    assert re.search(r"calls made +\d+ .*: \d+\.\d per recovered run", summary)


def test_dev_forever_keeps_running_until_interrupted() -> None:
    """With --forever the URLs are printed and stay up, with hints that say they work
    while it runs, and do: the removal's undo puts legacy back. Ctrl-C ends it with the
    summary."""
    process = subprocess.Popen(
        [*RECOVERYD, "dev", "--forever"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(60, process.kill)
    watchdog.start()
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while not any(" removed " in line for line in lines):
            line = process.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        [admin] = re.findall(r"admin (http://\S+)", "".join(lines))
        status = httpx.get(admin, verify=LOOPBACK_TLS).json()
        assert sum(status["states"].values()) >= 1
        [undo] = re.findall(r"; undo while the demo runs: curl -X POST (\S+)\n", lines[-1])
        restored = httpx.post(undo, verify=LOOPBACK_TLS)
        assert restored.status_code == 200, restored.text
        assert restored.json()["endpoint"]["name"] == "legacy"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        watchdog.cancel()
        process.kill()
    assert process.returncode == 0, err
    assert "until Ctrl-C" in "".join(lines)
    assert "while it runs" in "".join(lines)
    assert "\nsummary after " in out


def test_dev_refuses_a_malformed_duration() -> None:
    """A bad --duration is a usage error that says what a duration looks like."""
    result = run("dev", "--duration", "30 seconds")
    assert result.returncode == 2
    assert "e.g. 30s" in result.stderr


def test_emulator_names_every_bad_variable_at_once() -> None:
    """`recoveryd emulator` with bad EMULATOR_* variables lists them all, as serve lists
    its settings, and exits 1 without a traceback."""
    env = os.environ | {"EMULATOR_MAX_RPS": "many", "EMULATOR_REFUSE_GONE_DLQ_IDS": "maybe"}
    result = subprocess.run(
        [*RECOVERYD, "emulator", "--port", "0"], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == (
        "Error: EMULATOR_MAX_RPS: must be a positive integer; got 'many'\n"
        "EMULATOR_REFUSE_GONE_DLQ_IDS: must be true or false; got 'maybe'\n"
    )


def test_emulator_serves_until_terminated() -> None:
    """`recoveryd emulator` answers on its port, shows only the credentials it made up,
    and stops cleanly on SIGTERM."""
    port = free_port()
    env = os.environ | {"EMULATOR_TOKEN": "tok-cli", "EMULATOR_PASSWORD": "pw-cli"}
    process = subprocess.Popen(
        [*RECOVERYD, "emulator", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx.get(
                    f"http://127.0.0.1:{port}/v2/dlq/1-0",
                    headers={"Authorization": "Bearer tok-cli"},
                    verify=LOOPBACK_TLS,
                )
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the emulator did not start"
                time.sleep(0.1)
        assert response.status_code == 404
        assert response.json() == {"error": response.json()["error"]}
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert "tok-cli" not in out + err
    assert "pw-cli" not in out + err
    assert "emulator signing_key_current: sig_" in out  # generated, so shown once


@pytest.mark.parametrize(
    ("args", "settings"),
    [
        (("redrive",), NO_DAEMON),
        (("redrive", "--yes"), NO_DAEMON),
        (("removals",), NO_DAEMON),
        (("ls",), NO_DAEMON),
        (("restore-endpoint", "orders", "legacy"), NO_DAEMON | SERVICE),
    ],
)
def test_a_command_that_reads_the_store_refuses_one_not_made_yet(
    tmp_path: Path, args: tuple[str, ...], settings: dict[str, str]
) -> None:
    """In a folder where `serve` never ran, the store's readers say where they looked and
    exit 1, instead of creating an empty store and reporting nothing in it."""
    result = run_in(tmp_path, *args, **settings)
    assert result.returncode == 1, result.stdout
    assert result.stderr == (
        "Error: no store at ./recoveryd.db: is RECOVERYD_STORE set as for serve?\n"
    )
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


# Only --no-check and --from - spare set-token a setting: nothing is read from stdin
# before the settings pass.
@pytest.mark.parametrize(
    ("args", "settings", "named"),
    [
        (("serve",), {}, ["SERVICE_URL", "TOKEN", "SIGNING_KEY_CURRENT"]),
        (
            ("rotate-token",),
            NO_DAEMON,
            ["SERVICE_URL", "CREDENTIALS_FILE", "ACCOUNT_USERNAME", "ACCOUNT_PASSWORD"],
        ),
        (("set-token",), NO_DAEMON, ["SERVICE_URL", "CREDENTIALS_FILE", "TOKEN_FILE"]),
        (("set-token", "--no-check", "--from", "-"), NO_DAEMON, ["CREDENTIALS_FILE"]),
        (("reseal",), NO_DAEMON, ["CREDENTIALS_KEY", "STORE"]),
        (("restore-endpoint", "orders", "legacy"), NO_DAEMON, ["SERVICE_URL", "TOKEN"]),
        (("sweep", "nightly-resume", "--dry-run"), NO_DAEMON, ["SERVICE_URL", "TOKEN"]),
        (
            ("redrive",),
            NO_DAEMON | {"STORE": "mysql://db", "RETENTION": "a week"},
            ["STORE", "RETENTION"],
        ),
        (
            ("removals",),
            NO_DAEMON | {"STORE": "mysql://db", "LOG_FORMAT": "text"},
            ["STORE", "LOG_FORMAT"],
        ),
        (
            ("check", "rules.yaml"),
            {"PUBLC_URL": "https://x", "RULSE": "r.yaml"},
            ["PUBLC_URL", "RULSE"],
        ),
        (
            ("explain", "rules.yaml", "message.json"),
            {"HEADER_PREFX": "Upstash", "HEADER_PREFIX": "two words"},
            ["HEADER_PREFX", "HEADER_PREFIX"],
        ),
        (
            ("test", "rules.yaml", "rules.test.yaml"),
            {"HEADER_PREFX": "Upstash", "HEADER_PREFIX": "two words"},
            ["HEADER_PREFX", "HEADER_PREFIX"],
        ),
    ],
)
def test_a_command_names_every_setting_it_lacks_at_once(
    tmp_path: Path, args: tuple[str, ...], settings: dict[str, str], named: list[str]
) -> None:
    """Each command checks the settings it uses as `serve` does: every problem at once, a
    line each naming its variable, before it does anything (no store made). The rules
    commands, which run anywhere, read only their own and exit 2, as for a bad option."""
    result = run_in(tmp_path, *args, **settings)
    assert result.returncode == (2 if args[0] in ("check", "explain", "test") else 1)
    assert result.stderr.startswith("Error: RECOVERYD_"), result.stderr
    lines = result.stderr.removeprefix("Error: ").splitlines()
    assert [re.sub(r"^RECOVERYD_(\w+): .*", r"\1", line) for line in lines] == named
    assert list(tmp_path.iterdir()) == []


def test_a_command_says_what_a_missing_setting_is_for(tmp_path: Path) -> None:
    """rotate-token's lines say what each setting it lacks is needed for."""
    result = run_in(tmp_path, "rotate-token", **NO_DAEMON)
    assert result.stderr.splitlines() == [
        "Error: RECOVERYD_SERVICE_URL: required",
        "RECOVERYD_CREDENTIALS_FILE: required, or RECOVERYD_CREDENTIALS_KEY: where the "
        "new token is kept (the key seals it into a PostgreSQL store)",
        "RECOVERYD_ACCOUNT_USERNAME: required: the token reset's basic credentials "
        "(a credentials file may hold them instead)",
        "RECOVERYD_ACCOUNT_PASSWORD: required: the token reset's basic credentials "
        "(a credentials file may hold them instead)",
    ]


def test_the_rules_commands_read_no_setting_of_the_daemons_but_their_own(tmp_path: Path) -> None:
    """`check` in an environment made for another daemon (a store it cannot use) checks the
    rules: only RECOVERYD_RULES is its."""
    rules = Path(__file__).resolve().parent.parent / "rules.yaml"
    result = run_in(tmp_path, "check", STORE="mysql://db", RULES=str(rules), LISTEN="nowhere")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{rules}: ok: ")


def test_check_and_test_count_one_rule_one_sweep_one_test_in_the_singular(
    tmp_path: Path,
) -> None:
    """`1 rule, 1 sweep`, `1 test`: never `1 rules`."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "version: 1\n"
        "rules:\n"
        "  - name: everything\n"
        "    match: {}\n"
        "    action: ignore\n"
        "sweeps:\n"
        "  - name: nightly\n"
        "    schedule: 0 3 * * *\n"
        "    action: resume\n"
        "    filter: {fromDate: -24h}\n"
    )
    tests = tmp_path / "rules.test.yaml"
    tests.write_text(
        "tests:\n  - name: all ignored\n    message: {dlqId: d1}\n    expect: {rule: everything}\n"
    )
    checked = run_in(tmp_path, "check", "rules.yaml")
    assert checked.stdout == "rules.yaml: ok: 1 rule, 1 sweep\n", checked.stderr
    tested = run_in(tmp_path, "test", "rules.yaml", "rules.test.yaml")
    assert tested.stdout.splitlines()[-1] == "1 test, 1 passed, 0 failed", tested.stderr


def test_redrive_counts_one_dlq_id_in_the_singular(tmp_path: Path) -> None:
    """`would redrive 1 dlqId`, not `1 dlqId(s)`."""

    async def one_failed() -> None:
        async with open_store(f"sqlite:///{tmp_path / 'recoveryd.db'}") as store:
            await settled(store, ["dlq-1"], "failed", now=time.time())

    asyncio.run(one_failed())
    result = run_in(tmp_path, "redrive", **NO_DAEMON)
    assert result.stdout.splitlines() == [
        "dlq-1",
        "would redrive 1 dlqId in state failed; run again with --yes to do it",
    ], result.stderr


def test_a_postgresql_store_that_cannot_be_reached_is_one_line_saying_why(
    tmp_path: Path,
) -> None:
    """The server's own reason, once, on one line: no warning per connection attempt
    before it, no password in it."""
    store = "postgresql://recoveryd:s3cret@127.0.0.1:1/recoveryd"
    result = run_in(tmp_path, "removals", STORE=store, **NO_DAEMON)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(
        "Error: RECOVERYD_STORE: cannot open the PostgreSQL store "
        "postgresql://***@127.0.0.1:1/recoveryd: connection failed: "
    )
    assert "Connection refused" in line
    assert "s3cret" not in result.stderr


def test_ls_lists_the_records_of_the_store_newest_first(tmp_path: Path) -> None:
    """With no daemon, the store is read: a table for people, filtered by state."""
    now = time.time()

    async def records() -> None:
        async with open_store(f"sqlite:///{tmp_path / 'recoveryd.db'}") as store:
            await settled(store, ["ls-failed"], "failed", now=now - 60)
            await settled(store, ["ls-done"], "done", now=now - 30, body=callback_json("ls-done"))
            await settled(store, ["ls-old"], "failed", now=now - 7200)

    asyncio.run(records())
    listed = run_in(tmp_path, "ls", **NO_DAEMON)
    failed = run_in(tmp_path, "ls", "--state", "failed", "--since", "1h", **NO_DAEMON)
    as_json = run_in(tmp_path, "ls", "--json", "--limit", "1", **NO_DAEMON)
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["RECEIVED", "DLQID", "STATE", "RULE", "ACTION", "STATUS",
                                "URL", "GROUP", "/", "URL"], listed.stderr  # fmt: skip
    assert [line.split()[1] for line in lines[1:]] == ["ls-done", "ls-failed", "ls-old"]
    assert lines[1].split()[2:] == ["done", "rule-a", "resume", "503", "orders/fulfilment"]
    assert [line.split()[1] for line in failed.stdout.splitlines()[1:]] == ["ls-failed"]
    page = json.loads(as_json.stdout)
    assert [item["dlqId"] for item in page["items"]] == ["ls-done"]
    assert page["next"]


async def test_ls_asks_a_running_daemon(tmp_path: Path) -> None:
    """With a daemon on RECOVERYD_ADMIN_LISTEN, its /api/v1/dlq answers, not the store."""
    (tmp_path / "daemon").mkdir()
    async with running_recoveryd(tmp_path / "daemon") as recoveryd:
        body = callback_json("ls-asked")
        sent = await recoveryd.public.post("/callbacks", content=body, headers=signed(body))
        assert sent.status_code == 200, sent.text
        listen = str(recoveryd.admin.base_url).removeprefix("http://").rstrip("/")
        result = await asyncio.to_thread(
            run_in, tmp_path, "ls", "--q", "orders", ADMIN_LISTEN=listen
        )
        refused = await asyncio.to_thread(
            run_in, tmp_path, "ls", "--state", "lost", ADMIN_LISTEN=listen
        )
    assert [line.split()[1] for line in result.stdout.splitlines()[1:]] == ["ls-asked"], (
        result.stderr
    )
    assert refused.returncode == 1
    assert "'lost' is not a state" in refused.stderr
