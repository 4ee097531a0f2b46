"""Entry point of an engine process (the multiprocessing target, runtime/cluster.py): the factory
that stands above both roles, so neither role's module imports the other or this one."""

from __future__ import annotations

import os

from ..protocol import EngineRole
from .base import EngineSpec
from .cpus import apply_affinity
from .decode import DecodeEngine
from .prefill import PrefillEngine


def engine_main(spec: EngineSpec) -> None:
    # a process forked from the forkserver has that server's environment: take the cluster's
    if spec.environ:
        os.environ.clear()
        os.environ.update(spec.environ)
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
    apply_affinity(spec.cpus)  # before the engine starts its threads: they inherit the CPU set
    engine = PrefillEngine(spec) if spec.role == EngineRole.PREFILL else DecodeEngine(spec)
    engine.run()
