"""One typed config tree (simulator and runtime), validated on construction. Every number has its
unit in its name and its source in a comment; the CLI derives its options from these fields. A
knob's comment opens with `fitted (FIGURE; hardware-only: section.field=value):` when fitted to the
paper's own data, `choice:` when it is this project's choice, else cites its source (experiments/knobs.py).

  features.py   the modes (which mechanisms run), both worlds
  scheduler.py  the scheduling pass's constants, both worlds
  sim.py        the simulator's sections and SimConfig
  runtime.py    RuntimeConfig and its sections (links, engines, store, transport, faults); choices as enums
  tp.py         the runtime's tensor-parallel section
  overrides.py  `--set section.field=value` for both worlds; config trees to and from JSON
"""

from __future__ import annotations

from ..parsing import parse_device, parse_pd
from .features import MODE_PRESETS, Features, parse_mode
from .runtime import (CNIC_PER_SNIC, DEMO_AGENTS, RUNTIME_BASIC_TOKENS_PER_FORWARD, EngineConfig, EngineTransport,
                      FaultConfig, FaultPolicy, ForcedSide, KvDtype, KvTransfer, LinkConfig, MooncakeProtocol,
                      RuntimeConfig, StoreConfig, TransportConfig)
from .scheduler import SchedulerConfig
from .sim import (MODEL_PRESETS, ClusterConfig, ComputeKnobs, MetricsConfig, SimConfig, WorkloadConfig,
                  paper_cluster)
from .tp import TensorParallelConfig

__all__ = ["CNIC_PER_SNIC", "DEMO_AGENTS", "MODEL_PRESETS", "MODE_PRESETS", "RUNTIME_BASIC_TOKENS_PER_FORWARD",
           "ClusterConfig", "ComputeKnobs", "EngineConfig", "EngineTransport", "FaultConfig", "FaultPolicy",
           "Features", "ForcedSide", "KvDtype", "KvTransfer", "LinkConfig", "MetricsConfig", "MooncakeProtocol",
           "RuntimeConfig", "SchedulerConfig", "SimConfig", "StoreConfig", "TensorParallelConfig", "TransportConfig",
           "WorkloadConfig", "paper_cluster", "parse_device", "parse_mode", "parse_pd"]
