"""Both listeners publish OpenAPI at /openapi.json, and the running daemon keeps to it:
schemathesis, over real sockets, finds no 500 and no status, content type or body that
the published document does not name."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.specs.openapi.schemas import OpenApiSchema

from daemon.http.public_api import CALLBACK
from daemon.ingest.callback import FailureCallback
from tests.processes import Served, emulator_process, serving
from tests.support import LOOPBACK_TLS, SAMPLES, callback_json, emulator_config, signed

ADMIN_TOKEN = "adm_openapi-tests-token"
BEARER = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
LIST_GONE = {"states": ["gone"], "dryRun": True}  # a redrive that only lists

# What keeping to the document means. Of schemathesis' other checks, left out:
# negative_data_rejection and positive_data_acceptance (whether a callback is taken turns
# on what no schema says: its signature, a dlqId stored already), missing_required_header
# and ignored_auth (the token is tested in tests/admin/test_token.py, the signature in
# tests/ingest), use_after_free and ensure_resource_availability (no call here creates or
# deletes a resource), and max_response_time (that measures the machine's load).
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Enough cases to reach each status an operation has, few enough that the module runs in
# seconds on two cores.
EXAMPLES = settings(
    max_examples=25,
    deadline=None,  # a commit waits for the disk, whatever the code does
    database=None,  # nothing kept in .hypothesis: every run starts fresh
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def exercise(schema: OpenApiSchema, headers: dict[str, str] | None = None) -> Counter[str]:
    """Every operation of `schema` called with valid and invalid data (`headers` fixed),
    each answer checked against the document; how often each operation answered each
    status.

    Driven through Hypothesis rather than schemathesis' pytest plugin: the plugin's
    `from_fixture`, needed for a daemon started by a fixture, fails on pytest 9."""
    answered: Counter[str] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        modes = [operation.as_strategy(mode, headers=headers) for mode in GenerationMode]

        @EXAMPLES
        @given(st.one_of(modes))
        def call(case: Case) -> None:
            response = case.call_and_validate(checks=CHECKS)
            answered[f"{case.operation.label} {response.status_code}"] += 1

        call()
    return answered


def load(url: str, **headers: str) -> OpenApiSchema:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=headers)
    assert isinstance(schema, OpenApiSchema)
    return schema


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    """The service: a dlqId it has no message of ends `gone`, a final state, so there are
    records to read and redrive."""
    with emulator_process(emulator_config()) as url:
        yield url


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, emulator: str) -> Iterator[Served]:
    """Signed callbacks only, the admin API behind a token. No account username and
    password, so `/-/rotate-token` is refused (409) before it calls anything: the run
    covers that answer without rotating the emulator's token."""
    path = tmp_path_factory.mktemp("signed")
    with serving(path, SERVICE_URL=emulator, ADMIN_TOKEN=ADMIN_TOKEN) as served:
        yield served


@pytest.fixture(scope="module")
def unsigned_daemon(tmp_path_factory: pytest.TempPathFactory, emulator: str) -> Iterator[Served]:
    """No signing keys, unsigned callbacks allowed: generated bodies get past the
    signature to the parser and the store."""
    path = tmp_path_factory.mktemp("unsigned")
    keys = {"SIGNING_KEY_CURRENT": "", "SIGNING_KEY_NEXT": ""}
    with serving(path, SERVICE_URL=emulator, ALLOW_UNSIGNED="true", **keys) as served:
        yield served


@pytest.fixture(scope="module")
def records(daemon: Served) -> list[str]:
    """dlqIds the daemon has records of, `gone` (final: the emulator has no message of
    theirs), for the record and the redrive to show."""
    dlq_ids = [f"openapi-{n}" for n in range(3)]
    for dlq_id in dlq_ids:
        body = callback_json(dlq_id)
        answer = httpx.post(
            f"{daemon.url}/callbacks", content=body, headers=signed(body), verify=LOOPBACK_TLS
        )
        assert answer.status_code == 200, answer.text
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        listed = httpx.post(
            f"{daemon.admin_url}/api/v1/redrive",
            json=LIST_GONE,
            headers=BEARER,
            verify=LOOPBACK_TLS,
        ).json()
        if listed["count"] == len(dlq_ids):
            return dlq_ids
        time.sleep(0.05)
    raise AssertionError(f"not all gone: {listed}")


def test_the_public_listener_keeps_to_its_document(daemon: Served) -> None:
    answered = exercise(load(daemon.url))
    assert answered["POST /callbacks 401"]  # unsigned: refused before the body is parsed


def test_unsigned_callbacks_reach_the_store_and_keep_to_the_document(
    unsigned_daemon: Served,
) -> None:
    answered = exercise(load(unsigned_daemon.url).include(path="/callbacks"))
    assert answered["POST /callbacks 200"]  # stored
    assert answered["POST /callbacks 400"]  # parsed, and refused naming a field


def test_the_admin_listener_keeps_to_its_document(daemon: Served, records: list[str]) -> None:
    rotation = httpx.post(f"{daemon.admin_url}/-/rotate-token", headers=BEARER, verify=LOOPBACK_TLS)
    assert rotation.status_code == 409, rotation.text  # see `daemon`: nothing is rotated
    schema = load(daemon.admin_url, **BEARER)
    answered = exercise(schema, BEARER)
    assert answered["GET /api/v1/status 200"]
    for listing in ("/api/v1/dlq", "/api/v1/batches", "/api/v1/groups"):
        assert answered[f"GET {listing} 200"], answered
    assert answered["GET /api/v1/dlq 400"]  # a state, cursor or duration refused
    record = schema["/api/v1/dlq/{dlq_id}"]["GET"]  # a random dlqId is never one stored
    for dlq_id in records:
        case = record.Case(path_parameters={"dlq_id": dlq_id}, headers=BEARER)
        assert case.call_and_validate(checks=CHECKS).status_code == 200


def test_the_admin_listener_keeps_to_its_document_from_one_call_to_the_next(
    daemon: Served, records: list[str]
) -> None:
    """Stateful: a redrive's answer leads to the records of the dlqIds it lists (the
    document's link), and those records keep to it too."""
    schema = load(daemon.admin_url, **BEARER)
    answered: Counter[str] = Counter()

    @schema.hook
    def before_generate_body(context: Any, bodies: st.SearchStrategy[Any]) -> Any:
        # A random filter hardly ever lists the records there are: one body in two does.
        if context.operation is not None and context.operation.path == "/api/v1/redrive":
            return st.one_of(bodies, st.just(LIST_GONE))
        return bodies

    class Calls(schema.as_state_machine()):
        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            return {"headers": BEARER}

        def after_call(self, response: Any, case: Case) -> None:
            answered[f"{case.operation.label} {response.status_code}"] += 1

        def validate_response(self, response: Any, case: Case, **kwargs: Any) -> None:
            case.validate_response(response, checks=CHECKS, headers=BEARER)

    Calls.run(settings=settings(EXAMPLES, max_examples=15, stateful_step_count=4))
    assert answered["GET /api/v1/dlq/{dlq_id} 200"]  # the link was followed to a record


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        # isdigit() takes "²", and int() then refused it.
        ("GET", "/api/v1/sweeps?runs=%C2%B2", b""),
        # Nested deeper than json.loads recurses: a RecursionError, not a ValueError.
        ("POST", "/api/v1/redrive", b"[" * 100_000),
    ],
    ids=["runs-superscript-digit", "redrive-deep-json"],
)
def test_inputs_once_answered_500_are_refused_with_400(
    daemon: Served, method: str, path: str, body: bytes
) -> None:
    """Found by hand: random generation rarely makes them."""
    url = f"{daemon.admin_url}{path}"
    answer = httpx.request(method, url, content=body, headers=BEARER)
    assert answer.status_code == 400, answer.text
    assert "error" in answer.json()


def test_both_documents_are_served_and_the_admin_one_needs_the_token(daemon: Served) -> None:
    public = httpx.get(f"{daemon.url}/openapi.json", verify=LOOPBACK_TLS).json()
    assert public["openapi"].startswith("3.1")
    callbacks = public["paths"]["/callbacks"]["post"]
    (signature,) = callbacks["parameters"]
    assert signature | {"name": "Service-Signature", "in": "header", "required": True} == signature
    # The listener's own refusals, which schemathesis' few cases never provoke.
    assert {"408", "413", "431", "503"} <= set(callbacks["responses"])
    assert httpx.get(f"{daemon.admin_url}/openapi.json", verify=LOOPBACK_TLS).status_code == 401
    admin = httpx.get(
        f"{daemon.admin_url}/openapi.json", headers=BEARER, verify=LOOPBACK_TLS
    ).json()
    assert admin["openapi"].startswith("3.1")
    assert "401" in admin["paths"]["/api/v1/status"]["get"]["responses"]
    assert "401" not in admin["paths"]["/metrics"]["get"]["responses"]  # the scrape is open


def test_with_unsigned_callbacks_allowed_the_signature_is_optional(
    unsigned_daemon: Served,
) -> None:
    document = httpx.get(f"{unsigned_daemon.url}/openapi.json", verify=LOOPBACK_TLS).json()
    (signature,) = document["paths"]["/callbacks"]["post"]["parameters"]
    assert signature["required"] is False


def test_the_callback_schema_names_every_field_the_parser_knows() -> None:
    known = {field.alias or name for name, field in FailureCallback.model_fields.items()}
    assert set(CALLBACK["properties"]) == known


@pytest.mark.parametrize(
    "sample", sorted(SAMPLES.glob("failure-callback*.json")), ids=lambda path: path.name
)
def test_every_sample_callback_fits_the_schema(sample: Path) -> None:
    # jsonschema_rs: the validator schemathesis checks answers with.
    jsonschema_rs.validator_for(CALLBACK).validate(json.loads(sample.read_text()))
