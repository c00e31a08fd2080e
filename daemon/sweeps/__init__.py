"""Scheduled sweeps (`sweeps:` in rules.yaml): bulk resume or restart by filter.

`plan.py` fixes what a run does when it starts (pure), `run.py` carries one run out and
records it, `scheduler.py` runs each sweep on its schedule, one run at a time, and
follows reloads; `routes.py` is `GET /api/v1/sweeps`, `command.py` `recoveryd sweep`.
"""

from daemon.sweeps.plan import Plan, plan
from daemon.sweeps.routes import sweep_routes
from daemon.sweeps.run import SweepRunner
from daemon.sweeps.scheduler import Sweeper, SweepTiming

__all__ = ["Plan", "SweepRunner", "SweepTiming", "Sweeper", "plan", "sweep_routes"]
