"""The rules files and the messages that bench.rules times.

The worst case: 200 rules of which only the last matches. The 199 others look like the
rules of a busy account (team by team, 2-4 conditions on the topic, the status, the url,
the labels, the headers), and each holds for the message but for one condition, placed
at random among the rule's conditions, so that most rules do real work before they fail.

The typical case: 20 rules like the repository's rules.yaml (restart and resume by labels
and status, endpoint removal on 404/410, notifications on 5xx, ignore the rest) over a mix
of workflow messages, URL Group messages and plain publishes.

Everything is built from the repository's sample DLQ messages with a fixed seed, so every
run times the same rules and messages.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).resolve().parent.parent / "tests/testdata/samples"
SEED = 20_240_601

Message = dict[str, Any]


def _sample(name: str) -> Message:
    loaded: Message = json.loads((SAMPLES / f"dlq-message-{name}.json").read_text())
    return loaded


# The worst case.


def worst_message() -> Message:
    """A URL Group delivery that failed with a 503: every rule of the worst case looks at it
    in full."""
    return _sample("url-group") | {
        "header": {
            "Content-Type": ["application/json"],
            "Service-Label": ["orders,eu"],
            "X-Tenant": ["acme"],
        },
        "responseStatus": 503,
        "responseHeader": {"Content-Type": ["text/html"], "Retry-After": ["30"]},
        "responseBody": "<html><body>503 Service Unavailable</body></html>",
    }


# Conditions that hold for worst_message(), by the key they sit under in `match`.
_HOLDING: dict[str, list[Any]] = {
    "topicName": [{"exists": True}, {"in": ["orders", "invoices"]}, {"prefix": "ord"}],
    "responseStatus": [{"gte": 500, "lte": 599}, {"in": [502, 503, 504]}, {"gte": 500}],
    "url": [
        {"prefix": "https://fulfilment.example.com/"},
        {"regex": r"https://[a-z-]+\.example\.com/hooks/.+"},
        {"contains": "/hooks/"},
    ],
    "labels": [{"any": ["orders", "billing"]}, {"any": ["eu"]}],
    "header": [
        {"Content-Type": {"prefix": "application/json"}},
        {"X-Tenant": {"in": ["acme", "globex"]}},
    ],
    "responseHeader": [{"Content-Type": {"prefix": "text/"}}, {"Retry-After": {"exists": True}}],
    "method": ["POST", {"in": ["POST", "PUT"]}],
    "endpointName": [{"exists": True}],
    "workflow": [False],
    "not": [{"labels": {"any": ["manual"]}}],
}

# Conditions that fail for worst_message(), each made for rule number n: its key, the
# condition, and the action such a rule would take.
_FAILING: tuple[tuple[str, Callable[[int], Any], str], ...] = (
    ("topicName", lambda n: f"payments-{n}", "notify"),
    ("topicName", lambda n: {"in": [f"refunds-{n}", f"invoices-{n}"]}, "remove-endpoint"),
    ("responseStatus", lambda n: {"in": [404, 410]}, "remove-endpoint"),
    ("responseStatus", lambda n: {"gte": 400, "lt": 500}, "ignore"),
    ("url", lambda n: {"prefix": f"https://svc-{n}.example.com/"}, "notify"),
    ("url", lambda n: {"regex": rf"https://api\.example\.com/v[0-9]+/team-{n}/.*"}, "ignore"),
    ("labels", lambda n: {"any": [f"team-{n}"]}, "resume"),
    ("header", lambda n: {"X-Tenant": f"tenant-{n}"}, "notify"),
    ("endpointName", lambda n: f"worker-{n}", "remove-endpoint"),
    ("workflow", lambda n: True, "restart"),
    ("responseHeader", lambda n: {"Content-Type": {"prefix": "application/problem"}}, "ignore"),
)

_ACTION_KEYS: dict[str, dict[str, Any]] = {
    "resume": {"overrides": {"retries": 3, "labels": ["auto-resumed"]}},
    "restart": {"overrides": {"retries": 5, "delay": "30s"}, "batch": {"maxSize": 20}},
    "remove-endpoint": {"threshold": {"failures": 3, "within": "10m"}},
    "notify": {"notify": {"url": "https://hooks.example.com/recoveryd"}},
    "ignore": {},
}

_LAST_RULE: dict[str, Any] = {
    "name": "notify-orders-outage",
    "match": {
        "topicName": "orders",
        "responseStatus": {"gte": 500, "lte": 599},
        "labels": {"any": ["orders"]},
        "header": {"X-Tenant": {"in": ["acme"]}},
    },
    "action": "notify",
    **_ACTION_KEYS["notify"],
}


@dataclass(frozen=True)
class WorstCase:
    text: str  # the rules file
    rules: list[dict[str, Any]]
    failing_at: list[int]  # per non-matching rule, the 0-based position of its failing condition


def worst_case(count: int = 200) -> WorstCase:
    """`count` rules, only the last of which matches worst_message()."""
    rng = random.Random(SEED)
    rules, failing_at = [], []
    for number in range(1, count):
        key, failing, action = rng.choice(_FAILING)
        size = rng.randint(2, 4)
        others = rng.sample([other for other in _HOLDING if other != key], size - 1)
        conditions = [(other, rng.choice(_HOLDING[other])) for other in others]
        position = rng.randrange(size)
        conditions.insert(position, (key, failing(number)))
        failing_at.append(position)
        rule = {"name": f"{action}-{number:03d}", "match": dict(conditions), "action": action}
        rules.append(rule | _ACTION_KEYS[action])
    rules.append(_LAST_RULE)
    return WorstCase(render(rules), rules, failing_at)


def render(rules: list[dict[str, Any]]) -> str:
    """A rules file, one rule key a line, values in flow style (JSON is YAML)."""
    lines = ["version: 1", "rules:"]
    for rule in rules:
        first, *rest = rule.items()
        lines.append(f"  - {first[0]}: {json.dumps(first[1])}")
        lines += [f"    {key}: {json.dumps(value)}" for key, value in rest]
    return "\n".join(lines) + "\n"


# The typical case.

TYPICAL_RULES = """\
version: 1
defaults:
  batch: {maxSize: 50, maxWait: 5s}
rules:
  - name: ignore-health-checks
    match: {url: {suffix: /health}}
    action: ignore
  - name: ignore-staging
    match: {url: {regex: "https://[^/]*staging[^/]*/.*"}}
    action: ignore
  - name: skip-manual-runs
    match: {workflow: true, labels: {any: [manual]}}
    action: ignore
  - name: restart-billing-on-5xx
    match:
      workflow: true
      labels: {any: [billing]}
      responseStatus: {gte: 500, lte: 599}
    action: restart
    overrides:
      retries: 5
      delay: 30s
      flowControl: {key: billing, parallelism: 5, rate: 10, period: 1m}
      labels: [auto-restarted]
    batch: {maxSize: 20, maxWait: 2s}
    budget: {maxRecoveries: 3, within: 24h}
  - name: restart-payments-on-5xx
    match:
      workflow: true
      labels: {any: [payments]}
      url: {prefix: "https://app.example.com/api/workflows/payments"}
      responseStatus: {gte: 500}
    action: restart
    overrides: {retries: 5, delay: 1m, labels: [auto-restarted]}
    budget: {maxRecoveries: 2, within: 24h}
  - name: resume-onboarding-timeouts
    match:
      workflow: true
      url: {regex: ".*/workflows/onboarding(/.*)?"}
      responseStatus: {in: [408, 504]}
    action: resume
    overrides: {retries: 3, delay: 10s}
  - name: resume-rate-limited
    match: {workflow: true, responseStatus: 429}
    action: resume
    overrides: {retries: 3, delay: 2m, retryDelay: "pow(2, retried) * 1000"}
  - name: resume-flow-controlled
    match: {flowControlKey: {exists: true}, responseStatus: {gte: 500}}
    action: resume
    overrides: {retries: 2, labels: [auto-resumed]}
  - name: resume-transient-failures
    match:
      workflow: true
      responseStatus: {in: [408, 429, 500, 502, 503, 504]}
    action: resume
    overrides: {retries: 3, labels: [auto-resumed]}
    budget: {maxRecoveries: 5, within: 24h}
  - name: notify-workflow-auth
    match: {workflow: true, responseStatus: {in: [401, 403]}}
    action: notify
    notify: {url: "https://hooks.example.com/auth"}
  - name: prune-partner-webhooks
    match:
      topicName: {in: [webhooks, partner-webhooks]}
      responseStatus: {in: [404, 410, 421]}
    action: remove-endpoint
    threshold: {failures: 5, within: 1h}
  - name: prune-dead-endpoints
    match:
      topicName: {exists: true}
      responseStatus: {in: [404, 410]}
    action: remove-endpoint
    threshold: {failures: 3, within: 10m}
    keepLastEndpoint: true
  - name: notify-orders-5xx
    match: {topicName: orders, responseStatus: {gte: 500}}
    action: notify
    notify: {url: "https://hooks.example.com/orders"}
  - name: notify-payments-5xx
    match: {topicName: {prefix: payments}, responseStatus: {gte: 500, lte: 599}}
    action: notify
    notify: {url: "https://hooks.example.com/payments"}
  - name: notify-proxy-errors
    match:
      responseHeader: {Content-Type: {prefix: text/html}}
      responseStatus: {in: [502, 503, 504]}
    action: notify
    notify: {url: "https://hooks.example.com/edge"}
  - name: notify-partner-failures
    match: {header: {X-Partner: {exists: true}}, responseStatus: {gte: 400}}
    action: notify
    notify: {url: "https://hooks.example.com/partners"}
  - name: ignore-conflicts
    match: {responseStatus: 409}
    action: ignore
  - name: ignore-client-errors
    match: {responseStatus: {gte: 400, lt: 500}}
    action: ignore
  - name: page-on-call
    match: {responseStatus: {gte: 500}}
    action: notify
    notify: {url: "https://hooks.example.com/recoveryd"}
  - name: everything-else
    match: {}
    action: ignore
"""


def message_mix(count: int = 100) -> list[Message]:
    """Workflow messages (40%), URL Group messages (40%) and plain publishes (20%)."""
    rng = random.Random(SEED)
    workflow, url_group = _sample("workflow"), _sample("url-group")
    plain = {k: v for k, v in url_group.items() if k not in ("topicName", "endpointName")}
    makers = [
        (_workflow_message, workflow),
        (_workflow_message, workflow),
        (_url_group_message, url_group),
        (_url_group_message, url_group),
        (_plain_message, plain),
    ]
    messages = []
    for number in range(count):
        make, sample = rng.choice(makers)
        ids = {"messageId": f"msg_bench{number:05d}", "dlqId": f"1763712{number:06d}-0"}
        messages.append(sample | ids | make(rng, number))
    return messages


def _workflow_message(rng: random.Random, number: int) -> Message:
    flow = rng.choice(("billing", "payments", "onboarding", "reports"))
    header = {
        "Content-Type": ["application/json"],
        "Service-Workflow-Runid": [f"wfr_{flow}_{number:04x}"],
    }
    labels = rng.choice(([flow], [flow], [flow, "manual"], [], ["eu", flow]))
    if labels:
        header["Service-Label"] = [",".join(labels)]
    if rng.random() < 0.2:
        header["Service-Flow-Control-Key"] = [f"{flow}-fc"]
    return {
        "url": f"https://app.example.com/api/workflows/{flow}",
        "header": header,
        "responseStatus": rng.choice((500, 502, 503, 504, 429, 408, 401, 403, 400, 404)),
    }


def _url_group_message(rng: random.Random, number: int) -> Message:
    topic, endpoint, host = rng.choice(
        (
            ("orders", "fulfilment", "fulfilment.example.com"),
            ("payments-eu", "ledger", "ledger.example.com"),
            ("webhooks", "acme", "hooks.acme.example.net"),
            ("partner-webhooks", "globex", "globex.example.org"),
            ("analytics", "ingest", "ingest.staging.example.com"),
        )
    )
    content_type = rng.choice(("text/plain", "text/html", "application/json"))
    return {
        "topicName": topic,
        "endpointName": endpoint,
        "url": f"https://{host}/hooks/{topic}",
        "responseStatus": rng.choice((404, 410, 500, 502, 503, 400, 409, 429)),
        "responseHeader": {"Content-Type": [content_type]},
    }


def _plain_message(rng: random.Random, number: int) -> Message:
    url = rng.choice(
        (
            "https://hooks.partner.example.net/events",
            "https://api.staging.example.com/jobs",
            "https://worker.example.com/health",
            "https://crm.example.com/sync",
        )
    )
    header = {"Content-Type": ["application/json"]}
    if rng.random() < 0.4:
        header["X-Partner"] = ["globex"]
    return {
        "url": url,
        "header": header,
        "responseStatus": rng.choice((500, 503, 400, 401, 404, 408)),
    }
