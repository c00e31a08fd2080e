"""EmulatorConfig: defaults, generated secrets, the environment, and `run`."""

from __future__ import annotations

import re

import pytest

from daemon.emulator import EmulatorConfig
from daemon.emulator.config import EmulatorSettingsError


def test_missing_credentials_are_generated() -> None:
    """Without a token, password or keys, random ones are made and named in `generated`."""
    config = EmulatorConfig(token="tok_given")
    assert config.token == "tok_given"
    assert config.password.startswith("pw_")
    assert config.signing_key_current != config.signing_key_next
    assert config.generated == {"password", "signing_key_current", "signing_key_next"}


def test_repr_shows_no_secret() -> None:
    """A config that ends up in a log line does not leak credentials."""
    config = EmulatorConfig(token="tok_secret", password="pw_secret")
    assert "secret" not in repr(config)


def test_settings_are_read_from_the_environment() -> None:
    """The EMULATOR_* variables set the config; unset ones keep defaults."""
    config = EmulatorConfig.from_env(
        {"EMULATOR_TOKEN": "tok_env", "EMULATOR_HEADER_PREFIX": "Upstash", "EMULATOR_MAX_RPS": "7"}
    )
    assert (config.token, config.header_prefix, config.max_requests_per_second) == (
        "tok_env",
        "Upstash",
        7,
    )
    assert config.username == "ops@example.com"
    assert "token" not in config.generated


@pytest.mark.parametrize("variable", ["EMULATOR_MAX_RPS", "EMULATOR_MAX_REQUESTS_PER_DAY"])
@pytest.mark.parametrize("value", ["0", "many", "-1"])
def test_a_bad_limit_names_its_variable(variable: str, value: str) -> None:
    """The limits must be positive integers."""
    with pytest.raises(ValueError, match=variable):
        EmulatorConfig.from_env({variable: value})


def test_the_daily_limit_is_read_from_the_environment() -> None:
    assert EmulatorConfig.from_env({}).max_requests_per_day is None
    config = EmulatorConfig.from_env({"EMULATOR_MAX_REQUESTS_PER_DAY": "500"})
    assert config.max_requests_per_day == 500


def test_header_prefix_must_be_one_word() -> None:
    """The prefix becomes part of header names."""
    with pytest.raises(ValueError, match="header_prefix"):
        EmulatorConfig(header_prefix="Not A-Word")


def test_the_refusal_of_gone_dlq_ids_is_read_from_the_environment() -> None:
    """EMULATOR_REFUSE_GONE_DLQ_IDS=true switches it on; off by default; else an error."""
    assert EmulatorConfig.from_env({}).refuse_gone_dlq_ids is False
    assert EmulatorConfig.from_env({"EMULATOR_REFUSE_GONE_DLQ_IDS": "true"}).refuse_gone_dlq_ids
    with pytest.raises(ValueError, match="EMULATOR_REFUSE_GONE_DLQ_IDS"):
        EmulatorConfig.from_env({"EMULATOR_REFUSE_GONE_DLQ_IDS": "yes"})


def test_how_the_rate_limit_is_counted_and_told_is_read_from_the_environment() -> None:
    """EMULATOR_RATE_LIMIT_HEADERS and _WINDOW; a value that is not one of theirs is refused."""
    assert (
        EmulatorConfig.from_env({}).rate_limit_headers,
        EmulatorConfig.from_env({}).rate_limit_window,
    ) == ("always", "fixed")
    config = EmulatorConfig.from_env(
        {"EMULATOR_RATE_LIMIT_HEADERS": "on_429", "EMULATOR_RATE_LIMIT_WINDOW": "sliding"}
    )
    assert (config.rate_limit_headers, config.rate_limit_window) == ("on_429", "sliding")
    with pytest.raises(ValueError, match="EMULATOR_RATE_LIMIT_HEADERS"):
        EmulatorConfig.from_env({"EMULATOR_RATE_LIMIT_HEADERS": "never"})


def test_a_mistyped_rate_limit_setting_is_refused_with_the_nearest_value() -> None:
    """A value close to one of the Literal's gets "did you mean" that value."""
    expected = (
        "EMULATOR_RATE_LIMIT_WINDOW: must be fixed or sliding; got 'slidng'; "
        "did you mean 'sliding'?"
    )
    with pytest.raises(EmulatorSettingsError, match=f"^{re.escape(expected)}$"):
        EmulatorConfig.from_env({"EMULATOR_RATE_LIMIT_WINDOW": "slidng"})


def test_the_failure_callback_copy_is_read_from_the_environment() -> None:
    """EMULATOR_FAILURE_CALLBACK_COPY sets the URL; one that is not http(s) is refused."""
    url = "http://127.0.0.1:8080/callbacks"
    config = EmulatorConfig.from_env({"EMULATOR_FAILURE_CALLBACK_COPY": url})
    assert config.failure_callback_copy == url
    with pytest.raises(EmulatorSettingsError, match="EMULATOR_FAILURE_CALLBACK_COPY"):
        EmulatorConfig.from_env({"EMULATOR_FAILURE_CALLBACK_COPY": "ftp://x/callbacks"})


def test_every_bad_variable_is_named_at_once() -> None:
    """As recoveryd's settings: a line per problem, each naming its variable, all at once,
    a misspelt EMULATOR_* variable with the nearest name."""
    with pytest.raises(EmulatorSettingsError) as refused:
        EmulatorConfig.from_env({
            "EMULATOR_MAX_RPS": "many",
            "EMULATOR_HEADER_PREFIX": "Not A-Word",
            "EMULATOR_REFUSE_GONE_DLQ_IDS": "maybe",
            "EMULATOR_RATE_LIMIT_WINDOW": "rolling",
            "EMULATOR_MAX_RSP": "5",
        })  # fmt: skip
    assert str(refused.value).splitlines() == [
        "EMULATOR_MAX_RSP: not an emulator setting; did you mean EMULATOR_MAX_RPS?",
        "EMULATOR_HEADER_PREFIX: must be one word of letters and digits, e.g. Service; "
        "got 'Not A-Word'",
        "EMULATOR_MAX_RPS: must be a positive integer; got 'many'",
        "EMULATOR_REFUSE_GONE_DLQ_IDS: must be true or false; got 'maybe'",
        "EMULATOR_RATE_LIMIT_WINDOW: must be fixed or sliding; got 'rolling'",
    ]
