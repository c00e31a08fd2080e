"""The rules stage: `rules.yaml` loaded and checked, and the decision for a message."""

from daemon.rules.fields import FIELDS, Kind, facts
from daemon.rules.ruleset import BatchPolicy, Decision, Rule, Ruleset, load_rules, parse_rules
from daemon.rules.yamlfile import FileError, Problem, Unreadable

__all__ = [
    "FIELDS",
    "BatchPolicy",
    "Decision",
    "FileError",
    "Kind",
    "Problem",
    "Rule",
    "Ruleset",
    "Unreadable",
    "facts",
    "load_rules",
    "parse_rules",
]
