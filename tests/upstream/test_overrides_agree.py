"""The client's typed overrides and the service agree: whatever the model accepts, the
service accepts, so a rule that loads cannot fail at the first real call."""

from __future__ import annotations

import asyncio

import httpx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from daemon.emulator import create_app
from daemon.upstream import Credentials, CredentialsHolder, FlowControl, Overrides, ServiceClient
from daemon.upstream.models import DURATION, HEADER_WORD, LABEL
from tests.support import TOKEN, emulator_config, workflows

durations = st.from_regex(DURATION, fullmatch=True)
labels = st.from_regex(LABEL, fullmatch=True)
header_words = st.from_regex(HEADER_WORD, fullmatch=True)
retry_delays = st.one_of(
    st.sampled_from(
        [
            "1000",
            "pow(2, retried) * 1000",
            "min(60000, 1000 * pow(2, retried))",
            "floor(sqrt(retried)) + 5",
            "max(1, abs(retried - 3)) * 250",
        ]
    ),
    st.text(alphabet="0123456789 +-*/.,()", min_size=1, max_size=24),
)
failure_callbacks = st.one_of(
    st.from_regex(
        r"https?://[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?(:[0-9]{1,5})?(/[A-Za-z0-9._~%/-]*)?",
        fullmatch=True,
    ),
    header_words,
)


@st.composite
def overrides(draw: st.DrawFn) -> Overrides | None:
    """Candidate overrides; those the model refuses come out as None."""
    flow: FlowControl | None = None
    if draw(st.booleans()):
        limits = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "parallelism": st.integers(1, 10_000),
                    "rate": st.integers(1, 10_000),
                    "period": durations,
                },
            )
        )
        try:
            flow = FlowControl(key=draw(header_words), **limits)
        except ValueError:
            return None
    try:
        return Overrides(
            retries=draw(st.none() | st.integers(0, 1000)),
            delay=draw(st.none() | durations),
            retry_delay=draw(st.none() | retry_delays),
            flow_control=flow,
            labels=tuple(draw(st.lists(labels, max_size=4))),
            failure_callback=draw(st.none() | failure_callbacks),
        )
    except ValueError:
        return None


async def resume_with(value: Overrides) -> int:
    app = create_app(emulator_config(execute_runs=False))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http:
        seeded = await http.post("http://svc.test/_emulator/dlq", json={"messages": workflows(1)})
        client = ServiceClient(
            http, base_url="http://svc.test", credentials=CredentialsHolder(Credentials(TOKEN))
        )
        result = await client.bulk("resume", dlq_ids=seeded.json()["dlqIds"], overrides=value)
        return len(result.workflow_runs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overrides())
def test_overrides_the_model_accepts_the_service_accepts(value: Overrides | None) -> None:
    """Any override value that passes the typed model is taken by the service (no 400)."""
    event("refused by the model" if value is None else "sent to the service")
    if value is not None:
        assert asyncio.run(resume_with(value)) == 1
