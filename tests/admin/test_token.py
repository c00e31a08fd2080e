"""RECOVERYD_ADMIN_TOKEN: the admin API needs the bearer token, the probes and the scrape
do not, and the commands that ask the running daemon send it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from tests.processes import recoveryd
from tests.support import REPO_RULES, running_recoveryd

ADMIN_TOKEN = "adm_s3cret-Token"
BEARER = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
GUARDED = [
    ("GET", "/api/v1/status"),
    ("GET", "/api/v1/dlq/1-0"),
    ("GET", "/api/v1/sweeps"),
    ("GET", "/api/v1/removals"),
    ("POST", "/api/v1/redrive"),
    ("POST", "/-/reload"),
    ("POST", "/-/rotate-token"),
    ("GET", "/no/such/path"),
]


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {ADMIN_TOKEN}"])
async def test_without_the_token_every_admin_path_is_401(
    tmp_path: Path, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    async with running_recoveryd(tmp_path, ADMIN_TOKEN=ADMIN_TOKEN) as daemon:
        for method, path in GUARDED:
            response = await daemon.admin.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert "RECOVERYD_ADMIN_TOKEN" in response.json()["error"]
            assert ADMIN_TOKEN not in response.text


async def test_with_the_token_the_admin_api_answers_and_probes_need_none(tmp_path: Path) -> None:
    async with running_recoveryd(tmp_path, ADMIN_TOKEN=ADMIN_TOKEN) as daemon:
        status = await daemon.admin.get("/api/v1/status", headers=BEARER)
        assert status.status_code == 200
        assert "states" in status.json()
        assert (await daemon.admin.post("/-/reload", headers=BEARER)).status_code == 200
        metrics = await daemon.admin.get("/metrics")
        assert metrics.status_code == 200
        assert "recoveryd_dlq_ids" in metrics.text
        assert ADMIN_TOKEN not in metrics.text
        assert (await daemon.public.get("/healthz")).status_code == 200
        assert (await daemon.public.get("/readyz")).status_code == 200


async def test_without_a_token_set_the_admin_api_stays_open(tmp_path: Path) -> None:
    async with running_recoveryd(tmp_path) as daemon:
        assert (await daemon.admin.get("/api/v1/status")).status_code == 200


async def removals(
    tmp_path: Path, admin: httpx.AsyncClient, token: str
) -> subprocess.CompletedProcess[str]:
    """`recoveryd removals` as a user runs it, asking the daemon behind `admin`."""
    url = admin.base_url
    return await recoveryd(
        tmp_path, "removals", "--json", ADMIN_LISTEN=f"{url.host}:{url.port}", ADMIN_TOKEN=token
    )


async def test_the_commands_send_the_token_and_a_wrong_one_is_refused_not_worked_around(
    tmp_path: Path,
) -> None:
    """With the daemon's token the command gets its answer; with another, it reports the
    refusal and does not fall back to the store the daemon owns."""
    async with running_recoveryd(tmp_path, ADMIN_TOKEN=ADMIN_TOKEN) as daemon:
        allowed = await removals(tmp_path, daemon.admin, ADMIN_TOKEN)
        refused = await removals(tmp_path, daemon.admin, "not-the-token")
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.strip() == "[]"
    assert refused.returncode == 1
    assert "RECOVERYD_ADMIN_TOKEN" in refused.stderr
    assert ADMIN_TOKEN not in refused.stdout + refused.stderr


async def test_replay_sends_the_token_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    """`recoveryd replay` asks the daemon with its token; with another it reports the
    refusal (exit 3: no replay was made) rather than reading the store the daemon owns."""
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(REPO_RULES.read_text())
    async with running_recoveryd(tmp_path, ADMIN_TOKEN=ADMIN_TOKEN) as daemon:
        url = daemon.admin.base_url
        listen = f"{url.host}:{url.port}"
        allowed = await recoveryd(
            tmp_path, "replay", str(candidate), ADMIN_LISTEN=listen, ADMIN_TOKEN=ADMIN_TOKEN
        )
        refused = await recoveryd(
            tmp_path, "replay", str(candidate), ADMIN_LISTEN=listen, ADMIN_TOKEN="not-the-token"
        )
    assert allowed.returncode == 0, allowed.stderr
    assert "replayed on 0 records" in allowed.stdout
    assert refused.returncode == 3  # not 1, which says the candidate would change something
    assert "RECOVERYD_ADMIN_TOKEN" in refused.stderr
    assert ADMIN_TOKEN not in refused.stdout + refused.stderr
