"""The generated blocks, one module per subject; importing this package registers them all."""

from ..registry import REGISTRY
from . import beyond, faults, lanes, paper, plan, readme, runtime, simspeed, store  # each registers its blocks

__all__ = ["REGISTRY", "beyond", "faults", "lanes", "paper", "plan", "readme", "runtime", "simspeed", "store"]
