"""The operator's console at /ui/ on the admin listener (docs/console.md).

Server-rendered pages (Jinja2, autoescaped) over the store, the rules, the account and
the sweeps, with the admin API's actions behind a confirmation. `app.py` holds the
routes, `views.py` what the pages show made from the store's values (no I/O),
`security.py` the session, the CSRF token and the headers; the templates and the
stylesheet and script they load are package data, shipped in the wheel.
"""

from daemon.admin.console.app import Parts, console_app

__all__ = ["Parts", "console_app"]
