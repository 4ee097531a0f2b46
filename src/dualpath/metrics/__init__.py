"""Metrics shared by the runtime and the simulator: the same names and the same JSON."""

from .recorder import TurnRecorder
from .summary import Distribution, distribution, snic_balance, turn_latencies

__all__ = ["Distribution", "TurnRecorder", "distribution", "snic_balance", "turn_latencies"]
