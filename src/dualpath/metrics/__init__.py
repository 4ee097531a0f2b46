"""Metrics shared by the runtime and the simulator: the same names and the same JSON."""

from .recorder import TurnRecorder
from .summary import Distribution, distribution, snic_balance, turn_latencies
from .timeline import NULL_TIMELINE, Timeline

__all__ = ["Distribution", "NULL_TIMELINE", "Timeline", "TurnRecorder", "distribution", "snic_balance", "turn_latencies"]
