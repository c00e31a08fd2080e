"""Settings from RECOVERYD_* variables: defaults, one-line errors, and no secret echoed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daemon.settings import SettingsError, load_settings
from tests.support import PASSWORD, SIGNING_KEY_CURRENT, SIGNING_KEY_NEXT, TOKEN

# The least a start needs: a token and a signing key.
BASE = {"RECOVERYD_TOKEN": TOKEN, "RECOVERYD_SIGNING_KEY_CURRENT": SIGNING_KEY_CURRENT}


def environ(**changes: str | None) -> dict[str, str]:
    """BASE with RECOVERYD_<name> set to each change (None removes it)."""
    env = dict(BASE)
    for name, value in changes.items():
        env.pop(f"RECOVERYD_{name}", None)
        if value is not None:
            env[f"RECOVERYD_{name}"] = value
    return env


def error_for(env: dict[str, str], **overrides: Any) -> str:
    with pytest.raises(SettingsError) as caught:
        load_settings(env, **overrides)
    return str(caught.value)


@pytest.mark.parametrize(
    ("attribute", "expected"),
    [
        ("listen", ("0.0.0.0", 8080)),
        ("admin_listen", ("127.0.0.1", 9090)),
        ("STORE", "sqlite:///recoveryd.db"),
        ("HEADER_PREFIX", "Service"),
        ("LOG_FORMAT", "json"),
        ("MAX_BODY_BYTES", 1024 * 1024),
        ("RULES", Path("rules.yaml")),
        ("DRY_RUN", False),
        ("ROTATE_SCHEDULE", ""),
        ("MAX_RPS", None),
        ("PUBLIC_URL", None),
        ("MAX_REMOVALS_PER_HOUR", 10),
        ("RETENTION", 7 * 86400.0),
    ],
)
def test_defaults_match_the_product_contract(attribute: str, expected: object) -> None:
    """Every unset setting takes the default PRODUCT.md section 3 (and 4.5) promises."""
    assert getattr(load_settings(BASE), attribute) == expected


def test_account_url_defaults_to_the_service_url() -> None:
    """Without RECOVERYD_ACCOUNT_URL the token reset goes to the service URL."""
    settings = load_settings(environ(SERVICE_URL="https://service.example.com/"))
    assert settings.account_url == "https://service.example.com"


def test_variables_without_the_prefix_are_ignored() -> None:
    """Only RECOVERYD_* variables are read; the rest of the environment is not ours."""
    settings = load_settings({**BASE, "LISTEN": "nonsense", "PATH": "/usr/bin"})
    assert settings.LISTEN == "0.0.0.0:8080"


@pytest.mark.parametrize(
    ("changes", "variable"),
    [
        pytest.param({"LISTEN": "8080"}, "LISTEN", id="listen without host"),
        pytest.param({"LISTEN": "0.0.0.0:http"}, "LISTEN", id="listen port not a number"),
        pytest.param({"ADMIN_LISTEN": "localhost:99999"}, "ADMIN_LISTEN", id="admin port"),
        pytest.param({"SERVICE_URL": "ftp://service.example.com"}, "SERVICE_URL", id="ftp"),
        pytest.param({"SERVICE_URL": "service.example.com"}, "SERVICE_URL", id="no scheme"),
        pytest.param({"PUBLIC_URL": "https://"}, "PUBLIC_URL", id="public url without host"),
        pytest.param({"STORE": "mysql://db/recoveryd"}, "STORE", id="store scheme"),
        pytest.param({"STORE": "sqlite:///"}, "STORE", id="sqlite without path"),
        pytest.param({"STORE": "postgresql://db:pg/recoveryd"}, "STORE", id="postgres port"),
        pytest.param({"STORE": "postgresql://db/r?nonsense=1"}, "STORE", id="postgres option"),
        pytest.param({"MAX_RPS": "0"}, "MAX_RPS", id="max rps zero"),
        pytest.param({"MAX_RPS": "-5"}, "MAX_RPS", id="max rps negative"),
        pytest.param({"MAX_BODY_BYTES": "0"}, "MAX_BODY_BYTES", id="max body zero"),
        pytest.param({"DRY_RUN": "maybe"}, "DRY_RUN", id="dry run maybe"),
        pytest.param({"LOG_FORMAT": "xml"}, "LOG_FORMAT", id="log format xml"),
        pytest.param({"HEADER_PREFIX": "X-Service"}, "HEADER_PREFIX", id="prefix with dash"),
        pytest.param({"ROTATE_SCHEDULE": "61 * * * *"}, "ROTATE_SCHEDULE", id="bad cron"),
        pytest.param({"ROTATE_SCHEDULE": "0 3 * *"}, "ROTATE_SCHEDULE", id="cron four fields"),
        pytest.param({"TOKEN_FILE": "/run/secrets/token"}, "TOKEN_FILE", id="token and file"),
        pytest.param({"TOKEN": None}, "TOKEN", id="no token"),
        pytest.param({"TOKEN": ""}, "TOKEN", id="empty token"),
        pytest.param({"SIGNING_KEY_CURRENT": None}, "SIGNING_KEY_CURRENT", id="no signing key"),
        pytest.param(
            {"SIGNING_KEY_CURRENT": None, "SIGNING_KEY_NEXT": SIGNING_KEY_NEXT},
            "SIGNING_KEY_CURRENT",
            id="next key without current",
        ),
    ],
)
def test_bad_setting_is_one_line_naming_its_variable(
    changes: dict[str, str | None], variable: str
) -> None:
    """A bad setting stops the start with a line that begins with the variable's name;
    any other line is another problem, naming its own (a schedule also needs a file)."""
    first, *others = error_for(environ(**changes)).splitlines()
    assert first.startswith(f"RECOVERYD_{variable}: ")
    assert [line.split(":")[0] for line in others] in ([], ["RECOVERYD_CREDENTIALS_FILE"])


@pytest.mark.parametrize("schedule", ["0 3 * * 0", "*/15 * * * *", "24h", "10m", ""])
def test_rotate_schedule_takes_cron_interval_or_nothing(schedule: str) -> None:
    """A cron expression, an interval or empty (rotation off) are all accepted as given."""
    env = environ(ROTATE_SCHEDULE=schedule, CREDENTIALS_FILE="/var/lib/recoveryd/credentials")
    assert schedule == load_settings(env).ROTATE_SCHEDULE


def test_rotate_schedule_needs_a_credentials_file() -> None:
    """A rotated token kept only in memory would be lost at the next restart."""
    message = error_for(environ(ROTATE_SCHEDULE="24h"))
    assert message.startswith("RECOVERYD_CREDENTIALS_FILE: required when RECOVERYD_ROTATE_")


PG = "postgresql://recoveryd@127.0.0.1/recoveryd"
FERNET_KEY = "x" * 42 + "A="  # 32 bytes in URL-safe base64, as Fernet wants


@pytest.mark.parametrize(
    ("changes", "first_line"),
    [
        pytest.param(
            {"CREDENTIALS_KEY": "not-a-fernet-key-but-secret"},
            "RECOVERYD_CREDENTIALS_KEY: must be a Fernet key",
            id="bad key",
        ),
        pytest.param(
            {"CREDENTIALS_KEY": FERNET_KEY, "STORE": None},
            "RECOVERYD_CREDENTIALS_KEY: only with a PostgreSQL store",
            id="sqlite",
        ),
        pytest.param(
            {"STORE": PG, "ROTATE_SCHEDULE": "24h"},
            "RECOVERYD_CREDENTIALS_KEY: required when",
            id="rotation without key",
        ),
        pytest.param(
            {"STORE": PG, "CREDENTIALS_KEY": FERNET_KEY, "CREDENTIALS_FILE": "/c"},
            "RECOVERYD_CREDENTIALS_FILE: set RECOVERYD_CREDENTIALS_FILE or",
            id="both",
        ),
        pytest.param({"REPLICA_LEASE": "1s"}, "RECOVERYD_REPLICA_LEASE: ", id="lease too short"),
    ],
)
def test_shared_store_settings_are_checked(changes: dict[str, str | None], first_line: str) -> None:
    """RECOVERYD_CREDENTIALS_KEY seals rotated credentials in a PostgreSQL store: a key
    that is none, a key with SQLite, rotation on PostgreSQL without it, or it beside a
    credentials file, is refused, and the bad key never shown."""
    message = error_for(environ(**changes))
    assert message.startswith(first_line)
    assert "not-a-fernet-key-but-secret" not in message


def test_rotation_on_postgresql_keeps_the_token_in_the_store() -> None:
    settings = load_settings(
        environ(STORE=PG, ROTATE_SCHEDULE="24h", CREDENTIALS_KEY=f" {FERNET_KEY}\n")
    )
    assert settings.CREDENTIALS_KEY is not None
    assert settings.CREDENTIALS_KEY.get_secret_value() == FERNET_KEY  # stripped, as a file has it
    assert settings.CREDENTIALS_FILE is None


def test_credentials_key_takes_several_keys_and_names_the_bad_one() -> None:
    """The first seals, all open (MultiFernet); a bad one is named by its place, never
    shown."""
    other = "y" * 42 + "A="
    settings = load_settings(environ(STORE=PG, CREDENTIALS_KEY=f" {FERNET_KEY} ,{other}\n"))
    assert settings.CREDENTIALS_KEY is not None
    assert settings.CREDENTIALS_KEY.get_secret_value() == f"{FERNET_KEY},{other}"
    message = error_for(environ(STORE=PG, CREDENTIALS_KEY=f"{FERNET_KEY},not-a-key-secret"))
    assert message.startswith("RECOVERYD_CREDENTIALS_KEY: must be a Fernet key, or several")
    assert "key 2 of 2 is not one" in message
    assert "not-a-key-secret" not in message
    assert FERNET_KEY not in message
    assert "holds no key" in error_for(environ(STORE=PG, CREDENTIALS_KEY=" , "))


def test_unsigned_start_needs_no_signing_key_when_allowed() -> None:
    """RECOVERYD_ALLOW_UNSIGNED=true is the explicit opt-out from having a signing key."""
    settings = load_settings(environ(SIGNING_KEY_CURRENT=None, ALLOW_UNSIGNED="true"))
    assert settings.signing_keys == ()


def test_signing_keys_are_current_then_next() -> None:
    """The verifier gets the keys in the order it must try them."""
    settings = load_settings(environ(SIGNING_KEY_NEXT=SIGNING_KEY_NEXT))
    assert settings.signing_keys == (SIGNING_KEY_CURRENT.encode(), SIGNING_KEY_NEXT.encode())


@pytest.mark.parametrize(
    ("changes", "secret"),
    [
        pytest.param({"TOKEN_FILE": "/run/token"}, TOKEN, id="token beside token file"),
        pytest.param({"TOKEN": " \t "}, " \t ", id="blank token"),
        pytest.param({"ACCOUNT_PASSWORD": " \t "}, " \t ", id="blank password"),
        pytest.param(
            {"SIGNING_KEY_CURRENT": None, "SIGNING_KEY_NEXT": SIGNING_KEY_NEXT},
            SIGNING_KEY_NEXT,
            id="next key without current",
        ),
        pytest.param(
            {"ACCOUNT_PASSWORD": PASSWORD, "LISTEN": "8080"}, PASSWORD, id="other bad setting"
        ),
        pytest.param(
            {"STORE": "postgresql+psycopg://recoveryd:pg_s3cret_pw@db/recoveryd"},
            "pg_s3cret_pw",
            id="store url password",
        ),
        pytest.param(
            {"STORE": "postgresql://recoveryd:pg_s3cret_pw@[::1/recoveryd"},
            "pg_s3cret_pw",
            id="malformed postgres url password",
        ),
        pytest.param(
            {"STORE": "postgresql://recoveryd:pg_s3%zzcret@localhost/recoveryd"},
            "s3%zzcret",
            id="undecodable postgres url password",
        ),
    ],
)
def test_errors_never_show_a_secret(changes: dict[str, str | None], secret: str) -> None:
    """No error line contains a secret, even when the secret is the bad value."""
    assert secret not in error_for(environ(**changes))


@pytest.mark.parametrize("name", ["TOKEN", "ACCOUNT_PASSWORD", "SIGNING_KEY_CURRENT"])
def test_secret_of_the_wrong_type_is_not_echoed(name: str) -> None:
    """A secret override that is not even a string is refused without its value."""
    message = error_for(BASE, **{name: 918273645})
    assert message.startswith(f"RECOVERYD_{name}: ")
    assert "918273645" not in message


def test_token_is_read_from_the_token_file(tmp_path: Path) -> None:
    """RECOVERYD_TOKEN_FILE is read when the token is needed, without its newline."""
    path = tmp_path / "token"
    path.write_text("tok_from_file\n")
    settings = load_settings(environ(TOKEN=None, TOKEN_FILE=str(path)))
    assert settings.token() == "tok_from_file"


def test_token_comes_from_the_variable_when_set() -> None:
    """RECOVERYD_TOKEN is the token as given."""
    assert load_settings(BASE).token() == TOKEN


@pytest.mark.parametrize("name", ["missing", "a-directory"])
def test_unreadable_token_file_is_a_one_line_error(tmp_path: Path, name: str) -> None:
    """A token file that cannot be read names RECOVERYD_TOKEN_FILE on one line."""
    (tmp_path / "a-directory").mkdir()
    settings = load_settings(environ(TOKEN=None, TOKEN_FILE=str(tmp_path / name)))
    with pytest.raises(SettingsError) as caught:
        settings.token()
    assert str(caught.value).startswith("RECOVERYD_TOKEN_FILE: cannot read it: ")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("content", ["", "\n", "  \n\n"])
def test_empty_token_file_is_a_one_line_error(tmp_path: Path, content: str) -> None:
    """A token file with nothing but whitespace is an error, not an empty token."""
    path = tmp_path / "token"
    path.write_text(content)
    settings = load_settings(environ(TOKEN=None, TOKEN_FILE=str(path)))
    with pytest.raises(SettingsError, match=r"^RECOVERYD_TOKEN_FILE: .* is empty$"):
        settings.token()


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("RECOVERYD_LISTN", "; did you mean RECOVERYD_LISTEN?"),
        ("RECOVERYD_PUBLC_URL", "; did you mean RECOVERYD_PUBLIC_URL?"),
        ("RECOVERYD_ZZZ", ""),
    ],
)
def test_an_unknown_variable_stops_the_start_with_a_suggestion(name: str, suggestion: str) -> None:
    """A misspelt setting is refused, naming the setting it was probably meant to be: a
    typo in RECOVERYD_PUBLIC_URL must not silently turn the subject check off."""
    with pytest.raises(SettingsError) as caught:
        load_settings({**BASE, name: "x"})
    assert str(caught.value) == f"{name}: not a recoveryd setting{suggestion}"


@pytest.mark.parametrize(
    "name",
    [
        "RECOVERYD_SERVICE_HOST",
        "RECOVERYD_SERVICE_PORT",
        "RECOVERYD_SERVICE_PORT_HTTP",
        "RECOVERYD_PORT",
        "RECOVERYD_PORT_8080_TCP",
        "RECOVERYD_PORT_8080_TCP_ADDR",
        "RECOVERYD_PORT_8080_TCP_PORT",
        "RECOVERYD_PORT_8080_TCP_PROTO",
        "RECOVERYD_PORT_9090_UDP",
    ],
)
def test_kubernetes_service_links_are_not_reported(name: str) -> None:
    """Variables Kubernetes injects for a Service named recoveryd are not settings typos."""
    load_settings({**BASE, name: "10.0.0.1"})


def test_known_and_foreign_variables_are_not_reported() -> None:
    """Real settings and variables without the prefix are never refused as unknown."""
    env = {**BASE, "RECOVERYD_SERVICE_URL": "https://s.example.com", "HOME": "/root"}
    load_settings(env)


def test_the_public_url_is_kept_exactly_and_base_urls_lose_their_slash() -> None:
    """`sub` must equal RECOVERYD_PUBLIC_URL as written; the service URL is a base for paths."""
    settings = load_settings(
        environ(PUBLIC_URL="https://r.example.com/callbacks/", SERVICE_URL="https://s.example.com/")
    )
    assert settings.PUBLIC_URL == "https://r.example.com/callbacks/"
    assert settings.service_url == "https://s.example.com"


def test_an_empty_variable_counts_as_unset() -> None:
    """`RECOVERYD_PUBLIC_URL=` (as a chart renders a value left out) turns the check off."""
    assert load_settings(environ(PUBLIC_URL="", ROTATE_SCHEDULE="")).PUBLIC_URL is None


def test_credentials_in_a_url_that_does_not_parse_are_not_shown() -> None:
    """Even a malformed URL has its user and password masked in the error."""
    with pytest.raises(SettingsError) as caught:
        load_settings(environ(SERVICE_URL="https//user:hunter2@host"))
    assert "hunter2" not in str(caught.value)
    assert "***@host" in str(caught.value)


@pytest.mark.parametrize("name", ["SERVICE_URL", "ACCOUNT_URL"])
@pytest.mark.parametrize("password", [PASSWORD, f"a/b?c#d@{PASSWORD}"])
def test_a_service_url_with_user_info_is_refused_without_showing_it(
    name: str, password: str
) -> None:
    """User info in a service URL would replace the bearer token with basic auth and put
    the password in logs: the start stops, and the password is not echoed, even one
    holding the characters that end a URL's host part."""
    message = error_for(environ(**{name: f"https://ops:{password}@qstash.example.com"}))
    assert message.startswith(f"RECOVERYD_{name}: must not carry a user or password")
    assert PASSWORD not in message
    assert "***@qstash.example.com" in message


def test_retention_is_a_duration() -> None:
    """RECOVERYD_RETENTION takes 30m, 24h, 7d...; anything else names the setting."""
    assert load_settings(environ(RETENTION="36h")).RETENTION == 36 * 3600.0
    assert error_for(environ(RETENTION="a week")).startswith("RECOVERYD_RETENTION: a duration")
    assert error_for(environ(RETENTION="0s")).startswith("RECOVERYD_RETENTION: ")
