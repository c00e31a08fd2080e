"""Shadow rules: a candidate rules file that decides every dlqId beside the live rules
and has its decision recorded, never acted on (docs/rules.md, "Changing rules safely").
"""

from __future__ import annotations

import json

from daemon.rules.model import RECOVERIES
from daemon.rules.ruleset import Decision


def shadow_text(decision: Decision) -> str:
    """What a decision is compared by, as compact JSON: the deciding rule, its action, and
    a recovery's overrides (Rule.overrides_key), each null when there is none. The store
    keeps the shadow's so, beside the live decision's rule, action and overrides."""
    rule = decision.rule
    overrides = rule.overrides_key if rule is not None and rule.action in RECOVERIES else None
    return json.dumps(
        {
            "rule": rule.name if rule else None,
            "action": rule.action if rule else None,
            "overrides": overrides,
        },
        separators=(",", ":"),
    )
