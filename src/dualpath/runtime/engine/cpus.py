"""Which CPUs each engine process runs on, so that engines do not take each other's cores.

Rule (`plan_cpus`): the CPUs this process may use are split into equal, contiguous sets, one per
engine, in engine order; when there are more CPUs than engines need, one CPU is left to the router
and the I/O threads first (the router's loop is light, but it must not queue behind a forward).
Each engine's torch thread count is the size of its set unless the config fixes it. With fewer
CPUs than engines no affinity is set (engines share every CPU) and the plan says so, so the
output can warn that engines will slow each other down.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True)
class CpuPlan:
    cpus_by_engine: dict[int, tuple[int, ...]]  # engine -> its CPU set; empty: no affinity
    threads_by_engine: dict[int, int]  # torch threads per engine process
    router_cpus: tuple[int, ...]  # left to the router and I/O threads (may be empty)
    note: str  # one line for the output: what was done, or why not

    @property
    def pinned(self) -> bool:
        return any(self.cpus_by_engine.values())


def available_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def plan_cpus(engines: Sequence[int], cpus: Sequence[int], threads: int | None = None) -> CpuPlan:
    """One CPU set per engine (see the module docstring); `threads` overrides the per-engine count."""
    cpus = tuple(sorted(cpus))
    n = len(engines)
    if n == 0:
        return CpuPlan({}, {}, cpus, "no engines")
    if len(cpus) < n:
        t = threads or 1
        return CpuPlan({e: () for e in engines}, {e: t for e in engines}, cpus,
                       f"{len(cpus)} CPU(s) for {n} engines: no CPU sets, engines share the CPUs and slow each other down")
    spare = 1 if len(cpus) > n else 0
    share = (len(cpus) - spare) // n
    router = cpus[:spare]
    sets = {e: cpus[spare + i * share: spare + (i + 1) * share] for i, e in enumerate(engines)}
    note = ("engine CPU sets: " + ", ".join(f"e{e}={_span(s)}" for e, s in sets.items())
            + (f"; router/I-O on {_span(router)}" if router else "; router/I-O share the engines' CPUs"))
    return CpuPlan(sets, {e: threads or share for e in engines}, router, note)


def _span(cpus: Sequence[int]) -> str:
    return f"{cpus[0]}" if len(cpus) == 1 else f"{cpus[0]}-{cpus[-1]}"


def apply_affinity(cpus: Sequence[int]) -> None:
    """Pin the calling process (every thread it starts later inherits the set)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
