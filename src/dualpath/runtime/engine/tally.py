"""What an engine counts during one mode (its `Counters` to the router, protocol.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EngineTally:
    """What an engine counts during one mode, reported to the router as `Counters` (protocol.py
    says what each one is)."""

    storage_read_bytes: int = 0
    dram_read_bytes: int = 0
    storage_write_bytes: int = 0
    read_busy_s: float = 0.0
    read_latency_s: float = 0.0
    busy_s: float = 0.0
    forwards: int = 0
    forward_items: int = 0
    served_mid_step: int = 0
    fit_items: int = 0  # the terms of the profile's fit (Counters.fit_terms)
    fit_ctx: int = 0
    fit_keys: int = 0
    layer_checksum_failures: int = 0  # INTEGRITY_COUNTERS
    layer_retransmits: int = 0
    pd_checksum_failures: int = 0
    kv_recomputes: int = 0
    kv_flips_injected: int = 0
