"""`run`: serve the emulator with uvicorn, as `recoveryd emulator` does."""

from __future__ import annotations

from daemon.emulator.app import create_app
from daemon.emulator.config import EmulatorConfig
from daemon.http.serving import run_until_stopped


def run(host: str, port: int, config: EmulatorConfig) -> None:
    """Serve until interrupted. Credentials that were generated (not configured) are printed
    once, so a developer can use them; configured ones are never printed."""
    for name in sorted(config.generated):
        print(f"emulator {name}: {getattr(config, name)}", flush=True)
    print(f"emulator username: {config.username}", flush=True)
    run_until_stopped(create_app(config), host, port)
