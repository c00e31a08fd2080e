"""Rules files as users write them: testdata/bad/ refused exactly as .err says, good/ loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from daemon.cli import main
from daemon.rules import FileError, load_rules
from daemon.rules.conditions import ALL_OPERATORS
from daemon.rules.yamlfile import read_document

TESTDATA = Path(__file__).parent / "testdata"
BAD = TESTDATA / "bad"
GOOD = TESTDATA / "good"
REPOSITORY = Path(__file__).parents[2]


def _params(folder: Path) -> list[object]:
    """A parameter per YAML file of `folder`, named by the file."""
    return [pytest.param(path, id=path.stem) for path in sorted(folder.glob("*.yaml"))]


@pytest.mark.parametrize("path", _params(BAD))
def test_a_bad_file_is_refused_with_exactly_its_expected_errors(path: Path) -> None:
    """Loading a bad file raises FileError whose lines are the .err file, in order."""
    with pytest.raises(FileError) as refused:
        load_rules(path, name=path.name)
    expected = path.with_suffix(".err").read_text(encoding="utf-8").splitlines()
    assert [str(problem) for problem in refused.value.problems] == expected


def test_every_bad_file_has_an_err_file_and_every_err_file_a_bad_file() -> None:
    """testdata/bad/ pairs NAME.yaml with NAME.err, with nothing left over."""
    yamls = {path.stem for path in BAD.glob("*.yaml")}
    errs = {path.stem for path in BAD.glob("*.err")}
    assert yamls == errs
    assert len(yamls) >= 30


def test_the_several_errors_file_reports_each_of_its_mistakes_at_once() -> None:
    """One load reports the mistakes of every section of the file, not just the first."""
    with pytest.raises(FileError) as refused:
        load_rules(BAD / "several-errors.yaml")
    paths = [problem.path for problem in refused.value.problems]
    assert paths == [
        "defaults.batch.maxSize",
        "rules[0].match.responseStatus.gte",
        "rules[0].overrides.delay",
        "rules[1].threshold",
        "rules[1].match.topicName.exist",
        "rules[2].name",
        "sweeps[0].schedule",
    ]


def test_problems_name_the_file_by_its_path_when_no_name_is_given() -> None:
    """Without `name`, each problem starts with the path the file was loaded from."""
    path = BAD / "unknown-action.yaml"
    with pytest.raises(FileError) as refused:
        load_rules(path)
    assert str(refused.value).startswith(f"{path}:5:13: rules[0].action: ")


@pytest.mark.parametrize("path", _params(GOOD))
def test_a_good_file_loads(path: Path) -> None:
    """Every file in testdata/good/ loads into a Ruleset."""
    ruleset = load_rules(path)
    assert ruleset.source == str(path)


def test_the_every_operator_file_uses_every_operator_and_every_action() -> None:
    """good/every-operator-and-action.yaml keeps covering what its name says."""
    path = GOOD / "every-operator-and-action.yaml"
    rules = read_document(path).data["rules"]
    keys: set[str] = set()
    pending = [rule["match"] for rule in rules]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            keys |= set(node)
            pending += node.values()
        elif isinstance(node, list):
            pending += node
    assert set(ALL_OPERATORS) <= keys
    assert {"all", "any", "not", "header", "responseHeader"} <= keys
    actions = {rule.action for rule in load_rules(path).rules}
    assert actions == {"resume", "restart", "remove-endpoint", "notify", "ignore"}


def test_anchors_and_merge_keys_are_resolved_before_validation() -> None:
    """A rule built from `<<: *anchor` gets the anchored keys plus its own."""
    ruleset = load_rules(GOOD / "anchors.yaml")
    resume = ruleset.rule("resume-billing")
    assert resume is not None
    assert resume.spec.overrides is not None
    assert resume.spec.overrides.headers() == {
        "Service-Retries": "3",
        "Service-Delay": "10s",
        "Service-Label": "resumed",
    }
    assert resume.matches({"workflow": True, "labels": ("billing",), "responseStatus": 429})
    assert not resume.matches({"workflow": True, "labels": ("other",), "responseStatus": 429})


def test_the_repository_rules_pass_check() -> None:
    """`recoveryd check rules.yaml` accepts the rules shipped in the repository."""
    result = CliRunner().invoke(main, ["check", str(REPOSITORY / "rules.yaml")])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{REPOSITORY / 'rules.yaml'}: ok: ")
