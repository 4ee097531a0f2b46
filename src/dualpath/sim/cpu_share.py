"""One machine's cores shared by an engine's compute and its own KV copies: the `local` preset's
decode steps slow down while their engine copies KV.

On the local runtime cluster an engine is one process: its decode loop computes on the engine's
cores while its link threads copy KV through its CNIC arbiter (the H2D of a prompt's KV into the
cache, the layer stream to a PE, the D2H of a full block to persist), chunk by chunk, checksumming
every piece. So a decode group's steps take `1 + decode_io_slowdown` times their measured time
while one of its engines' CNICs carries a flow (links.py watchers): the factor is fitted on the
calibration runs' steps against the same share of each step (fidelity/speed.py, calibration.py:
`step_records`). The node's SNIC traffic does not count: a read or a write holds the SNIC for its
block-times mostly asleep in the token bucket, one store call per block inside (runtime/engine/
storage.py); counted, it covered every decode step of a loaded Mooncake slice, beyond any share
the calibration runs had (docs/results.md, fidelity). A step already running is stretched from the
change on (fluid progress, decode.py); a join waiting for the step's end keeps the time it was
given, so it may come a fraction of a step early or late.

Chosen once (`cpu_share_for`): the paper presets' GPUs compute apart from their NICs, and a `local`
preset without a measured slowdown gets `NO_CPU_SHARE`, which slows nothing.
"""

from __future__ import annotations

from ..config import SimConfig


class CpuShare:
    def __init__(self, decode_io_slowdown: float) -> None:
        self.decode_io_slowdown = decode_io_slowdown

    def slows_decode(self) -> bool:
        return True


class NoCpuShare(CpuShare):
    """Compute apart from I/O: decode steps take their measured time."""

    def __init__(self) -> None:
        super().__init__(0.0)

    def slows_decode(self) -> bool:
        return False


NO_CPU_SHARE = NoCpuShare()


def cpu_share_for(cfg: SimConfig) -> CpuShare:
    """The run's machine, chosen once: shared cores for a `local` preset with a measured decode
    slowdown, nothing shared otherwise."""
    if cfg.local is not None and cfg.local.decode_io_slowdown > 0:
        return CpuShare(cfg.local.decode_io_slowdown)
    return NO_CPU_SHARE
