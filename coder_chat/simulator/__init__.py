"""A faithful simulator of Coder's chat API (era C), for tests, benchmarks and demos.

Use it in-process::

    async with serve_simulator() as sim:
        ...  # talk to sim.base_url with sim.token

or as a command: ``prefect-coder simulator --port 3000``.
"""

from .config import EraB, SimulatorConfig
from .directives import DirectiveError, Script, parse
from .faults import ROUTES, FaultPlan, HeldRequest
from .records import Records
from .server import Simulator, serve_simulator

__all__ = [
    "ROUTES",
    "DirectiveError",
    "EraB",
    "FaultPlan",
    "HeldRequest",
    "Records",
    "Script",
    "Simulator",
    "SimulatorConfig",
    "parse",
    "serve_simulator",
]
