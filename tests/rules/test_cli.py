"""`recoveryd check`, `explain` and `test` as users run them: exit statuses and output."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from daemon.cli import main

REPOSITORY = Path(__file__).parents[2]
RULES = REPOSITORY / "rules.yaml"
SAMPLES = REPOSITORY / "tests" / "testdata" / "samples"
EXAMPLES = REPOSITORY / "examples"
BAD = Path(__file__).parent / "testdata" / "bad"

# Settings the commands read from the environment, unset so the defaults apply.
UNSET: dict[str, str | None] = {"RECOVERYD_RULES": None, "RECOVERYD_HEADER_PREFIX": None}

TWO_RULES = """\
version: 1
rules:
  - name: restart-on-503
    match: {workflow: true, responseStatus: 503}
    action: restart
    overrides: {retries: 4, delay: 10s}
  - name: ignore-canaries
    match: {labels: {any: [canary]}}
    action: ignore
"""


def invoke(*args: str | Path, env: dict[str, str | None] | None = None) -> Result:
    runner = CliRunner(catch_exceptions=False)
    return runner.invoke(main, [str(arg) for arg in args], env=UNSET | (env or {}))


def run(*args: str | Path, cwd: Path = REPOSITORY) -> subprocess.CompletedProcess[str]:
    """`python -m daemon ARGS` in a real process, as a shell would run it."""
    return subprocess.run(
        [sys.executable, "-m", "daemon", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def workflow_message(header_prefix: str = "Service") -> dict[str, Any]:
    """The workflow sample, its headers named with `header_prefix`."""
    message: dict[str, Any] = json.loads((SAMPLES / "dlq-message-workflow.json").read_text())
    message["header"] = {
        name.replace("Service-", f"{header_prefix}-"): values
        for name, values in message["header"].items()
    }
    return message


def expected_errors(path: Path) -> list[str]:
    """The .err lines of a bad file, as they read when the file is named by `path`."""
    lines = path.with_suffix(".err").read_text(encoding="utf-8").splitlines()
    return [f"{path}{line.removeprefix(path.name)}" for line in lines]


# check


def test_check_accepts_a_valid_file_with_a_summary_on_stdout(tmp_path: Path) -> None:
    """A valid file exits 0 and says how many rules and sweeps it has."""
    rules = write(tmp_path / "rules.yaml", TWO_RULES)
    result = invoke("check", rules)
    assert result.exit_code == 0
    assert result.stdout == f"{rules}: ok: 2 rules, 0 sweeps\n"
    assert result.stderr == ""


def test_check_has_nothing_to_warn_about_in_the_shipped_rules() -> None:
    """The shipped rules.yaml uses every action and a sweep, all carried out by this
    version: valid (exit 0), and no warning of anything only recorded."""
    rules = REPOSITORY / "rules.yaml"
    result = invoke("check", rules)
    assert result.exit_code == 0
    assert result.stderr == ""


def test_check_refuses_an_invalid_file_with_every_problem_on_stderr() -> None:
    """An invalid file exits 1 with each problem as PATH:LINE:COL: yaml.path: message."""
    path = BAD / "several-errors.yaml"
    result = invoke("check", path)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == expected_errors(path)
    assert result.stdout == ""


def test_check_of_a_missing_file_exits_2_saying_it_cannot_read_it(tmp_path: Path) -> None:
    """A path with no file behind it is unreadable, not invalid."""
    missing = tmp_path / "nowhere.yaml"
    result = invoke("check", missing)
    assert result.exit_code == 2
    assert result.stderr == f"{missing}: cannot read: No such file or directory\n"


def test_check_of_a_directory_exits_2(tmp_path: Path) -> None:
    """A directory given as the rules file is a usage error that names it."""
    result = invoke("check", tmp_path)
    assert result.exit_code == 2
    assert "is a directory" in result.stderr


def test_check_of_a_file_that_is_not_utf8_exits_2(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 make the file unreadable."""
    rules = tmp_path / "rules.yaml"
    rules.write_bytes(b"version: 1\nrules: []\n# \xff\xfe\n")
    result = invoke("check", rules)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"{rules}: cannot read: ")


def test_check_without_a_path_reads_the_file_named_by_recoveryd_rules(tmp_path: Path) -> None:
    """With no PATH, `check` validates RECOVERYD_RULES."""
    rules = write(tmp_path / "mine.yaml", TWO_RULES)
    result = invoke("check", env={"RECOVERYD_RULES": str(rules)})
    assert result.exit_code == 0
    assert result.stdout.startswith(f"{rules}: ok: ")


def test_check_in_a_real_process_exits_0_for_the_repository_rules() -> None:
    """`python -m daemon check` with no PATH validates ./rules.yaml."""
    result = run("check", cwd=REPOSITORY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("rules.yaml: ok: ")


def test_check_in_a_real_process_exits_1_with_the_problems_on_stderr() -> None:
    """The exit status and stderr a shell sees for an invalid file."""
    path = BAD / "several-errors.yaml"
    result = run("check", path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == expected_errors(path)


def test_check_in_a_real_process_exits_2_for_a_missing_file(tmp_path: Path) -> None:
    """The exit status a shell sees for a file that is not there."""
    result = run("check", tmp_path / "nowhere.yaml")
    assert result.returncode == 2
    assert "cannot read" in result.stderr


# explain


def test_explain_prints_the_restart_call_with_its_exact_override_headers() -> None:
    """The workflow sample explains as a bulk restart with its dlqId and exact headers."""
    message = SAMPLES / "dlq-message-workflow.json"
    result = invoke("explain", RULES, message)
    assert result.exit_code == 0, result.stderr
    explained = json.loads(result.stdout)
    assert (explained["rule"], explained["action"]) == ("restart-billing-on-5xx", "restart")
    [step] = explained["matched"]
    assert step["call"] == {
        "method": "POST",
        "path": "/v2/workflows/dlq/restart",
        "query": {"dlqIds": ["1763712000456-0"]},
        "headers": {
            "Service-Retries": "5",
            "Service-Delay": "30s",
            "Service-Retry-Delay": "pow(2, retried) * 1000",
            "Service-Flow-Control-Key": "billing",
            "Service-Flow-Control-Value": "parallelism=5, rate=10, period=1m",
            "Service-Label": "billing,auto-restarted",
        },
    }
    assert step["budget"]["maxRecoveries"] == 3
    assert step["budget"]["withinSeconds"] == 86400
    assert "every run a resume or restart made from it" in step["budget"]["counts"]
    assert step["reads"] == ["labels", "responseStatus", "workflow"]
    assert step["decidableFromCallback"] is True


def test_explain_names_the_rules_file_and_its_digest() -> None:
    """The explanation says which version of which rules file decided."""
    result = invoke("explain", RULES, SAMPLES / "dlq-message-workflow.json")
    assert json.loads(result.stdout)["rules"] == {
        "source": str(RULES),
        "sha256": hashlib.sha256(RULES.read_bytes()).hexdigest(),
    }


def test_explain_of_a_message_no_rule_matches_says_so(tmp_path: Path) -> None:
    """No matching rule is an answer, exit 0, with no rule, no action and no call."""
    rules = write(tmp_path / "rules.yaml", TWO_RULES)
    message = write(tmp_path / "m.json", json.dumps({"dlqId": "d1", "responseStatus": 500}))
    result = invoke("explain", rules, message)
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "dlqId": "d1",
        "rule": None,
        "action": None,
        "matched": [],
        "rules": {"source": str(rules), "sha256": hashlib.sha256(TWO_RULES.encode()).hexdigest()},
    }


def test_explain_of_a_removal_at_one_failure_counts_it_in_the_singular(tmp_path: Path) -> None:
    """A remove-endpoint threshold of one failure is "after 1 failure", not "1 failures"."""
    rules = write(
        tmp_path / "rules.yaml",
        "version: 1\nrules:\n  - name: prune\n    match: {responseStatus: 410}\n"
        "    action: remove-endpoint\n    threshold: {failures: 1, within: 10m}\n"
        "    keepLastEndpoint: false\n",
    )
    message = {"dlqId": "d1", "topicName": "orders", "url": "https://a", "responseStatus": 410}
    result = invoke("explain", rules, write(tmp_path / "m.json", json.dumps(message)))
    [step] = json.loads(result.stdout)["matched"]
    assert step["when"] == "after 1 failure within 600s"


def test_explain_with_header_prefix_upstash_reads_and_writes_upstash_headers(
    tmp_path: Path,
) -> None:
    """--header-prefix Upstash reads Upstash-Workflow-RunId and writes Upstash-* headers."""
    message = write(tmp_path / "m.json", json.dumps(workflow_message("Upstash")))
    result = invoke("explain", RULES, message, "--header-prefix", "Upstash")
    assert result.exit_code == 0, result.stderr
    [step] = json.loads(result.stdout)["matched"]
    assert step["rule"] == "restart-billing-on-5xx"
    assert step["call"]["headers"] == {
        "Upstash-Retries": "5",
        "Upstash-Delay": "30s",
        "Upstash-Retry-Delay": "pow(2, retried) * 1000",
        "Upstash-Flow-Control-Key": "billing",
        "Upstash-Flow-Control-Value": "parallelism=5, rate=10, period=1m",
        "Upstash-Label": "billing,auto-restarted",
    }


def test_explain_with_the_default_prefix_does_not_see_upstash_headers(tmp_path: Path) -> None:
    """Under the default prefix an Upstash-Workflow-RunId header is not a workflow run."""
    rules = write(tmp_path / "rules.yaml", TWO_RULES)
    upstash = {"dlqId": "d1", "responseStatus": 503, "header": {"Upstash-Workflow-RunId": ["w"]}}
    message = write(tmp_path / "m.json", json.dumps(upstash))
    assert json.loads(invoke("explain", rules, message).stdout)["rule"] is None
    prefixed = invoke("explain", rules, message, "--header-prefix", "Upstash")
    assert json.loads(prefixed.stdout)["rule"] == "restart-on-503"


# The examples a user runs from a clone: each file, the rules it matches (in order).
SHIPPED = {
    "workflow-503.json": ["resume-transient-failures"],
    "billing-workflow-503.json": ["restart-billing-on-5xx"],
    "workflow-422.json": ["page-on-workflow-4xx", "everything-else"],
    "endpoint-404.json": ["prune-dead-endpoints"],
    "upstash-workflow-503.json": ["everything-else"],  # under the default prefix
}


def matched(result: Result) -> list[str]:
    assert result.exit_code == 0, result.stderr
    return [step["rule"] for step in json.loads(result.stdout)["matched"]]


def test_every_shipped_example_is_tested_and_listed_in_its_readme() -> None:
    """No example goes untested or unexplained to the user."""
    assert sorted(path.name for path in EXAMPLES.glob("*.json")) == sorted(SHIPPED)
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    for name in SHIPPED:
        assert f"| `{name}` |" in readme
        assert f"recoveryd explain rules.yaml examples/{name}" in readme


@pytest.mark.parametrize(("name", "rules"), SHIPPED.items())
def test_explain_of_each_shipped_example_names_its_rule(name: str, rules: list[str]) -> None:
    """Each example explains with the repository's rules, as its README says."""
    assert matched(invoke("explain", RULES, EXAMPLES / name)) == rules


def test_the_readme_explain_command_works_from_the_top_of_a_clone() -> None:
    """`recoveryd explain rules.yaml examples/workflow-503.json`, relative paths and all, in
    a real process, shows the resume call."""
    result = run("explain", "rules.yaml", "examples/workflow-503.json")
    assert result.returncode == 0, result.stderr
    [step] = json.loads(result.stdout)["matched"]
    assert step["call"]["path"] == "/v2/workflows/dlq/resume"


def test_explain_reads_the_header_prefix_from_the_daemons_setting() -> None:
    """With RECOVERYD_HEADER_PREFIX=Upstash, as the daemon runs, an Upstash workflow run
    matches the workflow rule and gets Upstash-* headers, not the catch-all."""
    upstash = EXAMPLES / "upstash-workflow-503.json"
    result = invoke("explain", RULES, upstash, env={"RECOVERYD_HEADER_PREFIX": "Upstash"})
    assert matched(result) == ["resume-transient-failures"]
    [step] = json.loads(result.stdout)["matched"]
    assert step["call"]["headers"] == {"Upstash-Retries": "3", "Upstash-Label": "auto-resumed"}


def test_explain_header_prefix_flag_wins_over_the_setting() -> None:
    """--header-prefix beats RECOVERYD_HEADER_PREFIX, both ways."""
    upstash, service = EXAMPLES / "upstash-workflow-503.json", EXAMPLES / "workflow-503.json"
    env: dict[str, str | None] = {"RECOVERYD_HEADER_PREFIX": "Upstash"}
    result = invoke("explain", RULES, upstash, "--header-prefix", "Service", env=env)
    assert matched(result) == ["everything-else"]
    result = invoke("explain", RULES, service, "--header-prefix", "Service", env=env)
    assert matched(result) == ["resume-transient-failures"]
    env = {"RECOVERYD_HEADER_PREFIX": "Service"}
    result = invoke("explain", RULES, upstash, "--header-prefix", "Upstash", env=env)
    assert matched(result) == ["resume-transient-failures"]


def test_an_empty_header_prefix_setting_counts_as_unset() -> None:
    """As for the daemon, a variable set to "" leaves the default, Service."""
    env: dict[str, str | None] = {"RECOVERYD_HEADER_PREFIX": ""}
    result = invoke("explain", RULES, EXAMPLES / "workflow-503.json", env=env)
    assert matched(result) == ["resume-transient-failures"]


@pytest.mark.parametrize("command", ["explain", "test"])
@pytest.mark.parametrize("source", ["flag", "setting"])
def test_a_header_prefix_that_is_not_one_word_is_refused_as_the_daemon_refuses_it(
    tmp_path: Path, command: str, source: str
) -> None:
    """The daemon's own check and message, naming the flag, or the variable as serve
    names it; exit 2."""
    tests = write(tmp_path / "tests.yaml", PASSING)
    second = EXAMPLES / "workflow-503.json" if command == "explain" else tests
    flag = ["--header-prefix", "X-Service"] if source == "flag" else []
    env: dict[str, str | None] = {} if flag else {"RECOVERYD_HEADER_PREFIX": "X-Service"}
    result = invoke(command, RULES, second, *flag, env=env)
    assert result.exit_code == 2
    assert result.stdout == ""
    named = "Invalid value for '--header-prefix'" if flag else "RECOVERYD_HEADER_PREFIX"
    assert result.stderr.endswith(
        f"Error: {named}: must be one word of letters, e.g. Service or Upstash; got 'X-Service'\n"
    )


@pytest.mark.parametrize("command", ["explain", "test"])
def test_help_names_the_header_prefix_setting(command: str) -> None:
    """--help says where the prefix comes from when the flag is not given."""
    result = invoke(command, "--help")
    assert "Default: RECOVERYD_HEADER_PREFIX, or Service." in result.stdout


def test_explain_with_invalid_rules_exits_1_with_the_problems(tmp_path: Path) -> None:
    """Rules with mistakes are refused before any message is read."""
    path = BAD / "unknown-action.yaml"
    message = write(tmp_path / "m.json", json.dumps({"dlqId": "d1"}))
    result = invoke("explain", path, message)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == expected_errors(path)
    assert result.stdout == ""


def test_explain_of_a_message_that_is_not_a_json_object_exits_2(tmp_path: Path) -> None:
    """A JSON array is not a DLQ message."""
    message = write(tmp_path / "m.json", '[{"dlqId": "d1"}]')
    result = invoke("explain", RULES, message)
    assert result.exit_code == 2
    assert result.stderr == f"{message}: a DLQ message is a JSON object\n"


def test_explain_of_a_message_that_is_not_json_exits_2(tmp_path: Path) -> None:
    """Text that does not parse as JSON is refused with the parser's reason."""
    message = write(tmp_path / "m.json", "dlqId: d1\n")
    result = invoke("explain", RULES, message)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"{message}: cannot read a JSON message: ")


def test_explain_of_a_missing_message_file_exits_2(tmp_path: Path) -> None:
    """A message file that is not there is unreadable."""
    result = invoke("explain", RULES, tmp_path / "nowhere.json")
    assert result.exit_code == 2
    assert "cannot read a JSON message" in result.stderr


def test_explain_of_a_missing_rules_file_exits_2(tmp_path: Path) -> None:
    """A rules file that is not there is unreadable."""
    result = invoke("explain", tmp_path / "nowhere.yaml", SAMPLES / "dlq-message-workflow.json")
    assert result.exit_code == 2
    assert result.stderr == f"{tmp_path / 'nowhere.yaml'}: cannot read: No such file or directory\n"


# test

PASSING = """\
tests:
  - name: a 503 on a run restarts it
    message: {dlqId: d1, responseStatus: 503, header: {Service-Workflow-RunId: [wfr_1]}}
    expect: {rule: restart-on-503, action: restart, headers: {Service-Retries: "4"}}
  - name: a canary is ignored
    message: {dlqId: d2, labels: [canary]}
    expect: {rule: ignore-canaries, headers: {Service-Retries: null}}
"""

FAILING = """\
tests:
  - name: a 503 on a run restarts it
    message: {dlqId: d1, responseStatus: 503, header: {Service-Workflow-RunId: [wfr_1]}}
    expect: {rule: restart-on-503}
  - name: a 503 on a run is resumed three times
    message: {dlqId: d2, responseStatus: 503, header: {Service-Workflow-RunId: [wfr_2]}}
    expect: {action: resume, headers: {Service-Retries: "3", Service-Delay: null}}
"""


def test_test_exits_0_when_every_test_passes(tmp_path: Path) -> None:
    """Each test is listed as PASS with its line, then the totals."""
    rules = write(tmp_path / "rules.yaml", TWO_RULES)
    tests = write(tmp_path / "tests.yaml", PASSING)
    result = invoke("test", rules, tests)
    assert result.exit_code == 0
    assert result.stdout == (
        f"{tests}:2: PASS a 503 on a run restarts it\n"
        f"{tests}:5: PASS a canary is ignored\n"
        "2 tests, 2 passed, 0 failed\n"
    )


def test_test_exits_1_naming_everything_that_differed(tmp_path: Path) -> None:
    """A failing test is listed as FAIL with one line per expectation that did not hold."""
    rules = write(tmp_path / "rules.yaml", TWO_RULES)
    tests = write(tmp_path / "tests.yaml", FAILING)
    result = invoke("test", rules, tests)
    assert result.exit_code == 1
    assert result.stdout == (
        f"{tests}:2: PASS a 503 on a run restarts it\n"
        f"{tests}:5: FAIL a 503 on a run is resumed three times\n"
        "    expected action 'resume', got 'restart'\n"
        "    expected header Service-Retries: '3', got '4'\n"
        "    expected header Service-Delay: no such header, got '10s'\n"
        "2 tests, 1 passed, 1 failed\n"
    )


def test_test_reports_a_message_no_rule_matches_as_none(tmp_path: Path) -> None:
    """Expecting a rule where none matches names the rule and says none matched."""
    rules = write(tmp_path / "rules.yaml", TWO_RULES)
    tests = write(
        tmp_path / "tests.yaml",
        "tests:\n  - name: n\n    message: {dlqId: d1}\n    expect: {rule: ignore-canaries}\n",
    )
    result = invoke("test", rules, tests)
    assert result.exit_code == 1
    assert "    expected rule 'ignore-canaries', got none (no rule matches)\n" in result.stdout


def test_test_refuses_a_tests_file_expecting_a_rule_that_does_not_exist(tmp_path: Path) -> None:
    """Expecting a rule no rule is named is a typo, refused at its line with the nearest
    name before any test runs."""
    rules = write(tmp_path / "rules.yaml", TWO_RULES)
    tests = write(
        tmp_path / "tests.yaml",
        PASSING.replace("rule: ignore-canaries", "rule: ignore-canary"),
    )
    result = invoke("test", rules, tests)
    assert result.exit_code == 1
    assert result.stderr == (
        f"{tests}:7:20: tests[1].expect.rule: no rule is named 'ignore-canary' in {rules}; "
        "did you mean 'ignore-canaries'?\n"
    )
    assert result.stdout == ""


def test_test_refuses_a_tests_file_with_an_unknown_key(tmp_path: Path) -> None:
    """A tests file is checked as strictly as a rules file."""
    rules = write(tmp_path / "rules.yaml", TWO_RULES)
    tests = write(
        tmp_path / "tests.yaml", PASSING.replace("expect: {rule: ignore", "expects: {rule: ignore")
    )
    result = invoke("test", rules, tests)
    assert result.exit_code == 1
    assert f"{tests}:7:5: tests[1].expects: unknown key 'expects'; did you mean 'expect'?" in (
        result.stderr.splitlines()
    )


UPSTASH_TESTS = """\
tests:
  - name: an Upstash run that answered 503 restarts
    message: {dlqId: d1, responseStatus: 503, header: {Upstash-Workflow-RunId: [wfr_1]}}
    expect: {rule: restart-on-503, headers: {Upstash-Retries: "4"}}
"""


def test_test_reads_the_header_prefix_from_the_daemons_setting(tmp_path: Path) -> None:
    """`recoveryd test` decides as the daemon would under RECOVERYD_HEADER_PREFIX, and the
    flag still wins."""
    rules = write(tmp_path / "rules.yaml", TWO_RULES)
    tests = write(tmp_path / "tests.yaml", UPSTASH_TESTS)
    env: dict[str, str | None] = {"RECOVERYD_HEADER_PREFIX": "Upstash"}
    result = invoke("test", rules, tests, env=env)
    assert result.exit_code == 0, result.stdout
    assert result.stdout.endswith("1 test, 1 passed, 0 failed\n")
    flagged = invoke("test", rules, tests, "--header-prefix", "Service", env=env)
    assert flagged.exit_code == 1
    assert "    expected rule 'restart-on-503', got none (no rule matches)\n" in flagged.stdout


def test_test_of_a_missing_tests_file_exits_2(tmp_path: Path) -> None:
    """A tests file that is not there is unreadable."""
    rules = write(tmp_path / "rules.yaml", TWO_RULES)
    result = invoke("test", rules, tmp_path / "nowhere.yaml")
    assert result.exit_code == 2
    assert result.stderr == f"{tmp_path / 'nowhere.yaml'}: cannot read: No such file or directory\n"


def test_test_with_a_missing_rules_file_exits_2(tmp_path: Path) -> None:
    """Rules that cannot be read stop the tests before they are loaded."""
    tests = write(tmp_path / "tests.yaml", PASSING)
    result = invoke("test", tmp_path / "nowhere.yaml", tests)
    assert result.exit_code == 2
    assert "cannot read" in result.stderr


def test_test_with_invalid_rules_exits_1_with_their_problems(tmp_path: Path) -> None:
    """Rules with mistakes are refused with every problem, and no test runs."""
    path = BAD / "several-errors.yaml"
    tests = write(tmp_path / "tests.yaml", PASSING)
    result = invoke("test", path, tests)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == expected_errors(path)
    assert result.stdout == ""


def test_the_repository_rule_tests_pass() -> None:
    """`recoveryd test rules.yaml rules.test.yaml` passes on the shipped files."""
    result = invoke("test", RULES, REPOSITORY / "rules.test.yaml")
    assert result.exit_code == 0, result.stdout
    assert result.stdout.endswith(" passed, 0 failed\n")
