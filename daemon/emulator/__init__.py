"""A faithful local fake of the message delivery service, with a control API for tests.

    from daemon.emulator import EmulatorConfig, create_app, Emulator
    app = create_app(EmulatorConfig(token="tok_..."))
    emulator: Emulator = app.state.emulator

`service_api` holds the service's routes, `control_api` the `/_emulator/*` ones.
"""

from daemon.emulator.app import create_app
from daemon.emulator.config import EmulatorConfig
from daemon.emulator.emulator import Emulator

__all__ = ["Emulator", "EmulatorConfig", "create_app"]
