"""Mooncake Transfer Engine: the field's KV data plane (RDMA where the NICs have it, TCP otherwise).

The third way an engine's KV bytes reach a peer's memory (engine/peers.py): one host maps the
peer's shared memory, our remote writes go through the peer's `WriteTarget` (remote_write/), and
here every engine process owns one Mooncake `TransferEngine`:

1. `MooncakeTransfer.start(host, protocol, devices, env)`: import the binding lazily (a missing
   package or system library is one InputError naming what to install), put the KV lane's marks in
   the environment the engine reads when it starts (`kv_lane_env`), and initialise it in P2P
   handshake mode: no metadata server; it listens on an RPC port of its own, and a peer reaches
   it as "HOST:RPC_PORT" (its session).
2. `register(name, array)`: one of the engine's segments (its host buffer, a PE's landing zone)
   registered with the engine (with RDMA pinned and given a key), its base address kept by name.
   Only registered memory can be written into: a peer's engine refuses an address outside every
   buffer it registered (the write returns non-zero).
3. `address()`: a `MooncakeAddress` (session and each segment's base address and size), as JSON
   text in the messages that already carry a peer's data endpoint (Hello, `PrefillAssign.de_data`,
   `LayerPull.reply_data`).
4. `write(peer, pieces)` (or `MooncakeSpanWrite`, a span copy's `do_chunk` for a LinkArbiter): pieces of (source address, destination segment, offset, nbytes) into the
   peer's segments, one batch, synchronous. When it returns the bytes are in the peer's memory (the
   peer acknowledges each write after placing it), so a message sent afterwards on any channel
   cannot overtake them. A non-zero return raises `MooncakeWriteError` (an OSError: the peer is
   gone or refused, as a broken connection of ours). The binding releases the GIL meanwhile.
5. `close()`: unregister the segments (the engine itself goes with the process).

Over TCP any local source address will do; with RDMA the source must lie in registered memory too,
so a `MooncakeSpanWrite` from anywhere else goes through a registered staging buffer (`write_staged`).
Unlike our `WriteTarget`, Mooncake authenticates no peer, and its handshake and TCP data ports
listen on every interface (0.0.0.0) whatever host `start` is given: a deployment keeps them on the
cluster's own network.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...core.lanes import Lane
from ...errors import InputError
from .remote_write.initiator import byte_view
from .shm import ShmRegion
from .tcp import lane_socket_options
from .transfer import SpanCopy

INSTALL_HINT = ("pip install 'dualpath[mooncake]' (mooncake-transfer-engine-non-cuda) and its system libraries: "
                "apt-get install libibverbs1 librdmacm1 libnuma1")
# P2P handshake: each engine answers handshakes on its own RPC port; no etcd or metadata server
P2P_HANDSHAKE = "P2PHANDSHAKE"
# The staging buffer's least size: the arbiter's default chunk (LinkConfig.chunk_bytes, 8 KiB) x 8, so
# a chunk never grows it, and a larger chunk (an uncapped link's whole transfer) grows it once
STAGE_MIN_BYTES = 64 * 1024


def engine_class() -> Any:
    """Mooncake's `TransferEngine` class, or an InputError naming what to install: without the
    package, or without a system library its binary links (libibverbs.so.1, librdmacm, libnuma),
    the import fails."""
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise InputError(f"transport.transfer mooncake needs Mooncake Transfer Engine, which does not load here "
                         f"({exc}): {INSTALL_HINT}") from None
    return TransferEngine


def mooncake_loads() -> bool:
    """Whether Mooncake's binding loads here (tests that need it skip otherwise)."""
    try:
        engine_class()
    except InputError:
        return False
    return True


def require_mooncake() -> None:
    """One clear error before any engine starts, not a traceback in each (as require_device)."""
    engine_class()


def kv_lane_env(kv_service_level: int) -> dict[str, str]:
    """The environment that puts Mooncake's queue pairs on the KV lane (it reads both when its engine
    starts, one value per process: every byte it moves is KV).
    - MC_IB_SL, InfiniBand: the service level (TransportConfig.mooncake_kv_sl: 2, docs/paper.md §2.3's KV
      VL2 under OpenSM's default SL -> VL table), which the switches map to the low-priority VL.
    - MC_IB_TC, RoCE: the GRH traffic class byte, DSCP << 2, with the KV lane's DSCP (CS1 = 8, so 32)
      that our own KV sockets carry (transport/tcp.py), which the fabric maps to a low-weight TC."""
    return {"MC_IB_SL": str(kv_service_level), "MC_IB_TC": str(lane_socket_options(Lane.KV).ip_tos)}


def rdma_devices(engine: Any) -> set[str]:
    """The RDMA NICs a started engine found: its topology is JSON, per CPU or GPU location a pair of
    lists (preferred, other NICs); with none, an engine started for rdma falls back to TCP."""
    topology = json.loads(engine.get_local_topology())
    return {nic for lists in topology.values() for nics in lists for nic in nics}


# The most pieces one synchronous batch write takes: on mooncake-transfer-engine-non-cuda 0.3.13.post1
# (tcp, loopback) a call of 2,049 pieces landed and one of 2,730 returned -1 ("Local segment
# descriptor not found"), whatever the piece size (measured: 4 KiB to 96 KiB pieces; test_mooncake_transfer.py
# writes more than this in one `write`). Longer writes go as several calls.
MAX_PIECES_PER_CALL = 2048


class MooncakeWriteError(OSError):
    """A write through Mooncake that did not land: the peer is gone, unreachable, or refused it."""


@dataclass(frozen=True, slots=True)
class MooncakeAddress:
    """What a peer needs to write into an engine: its session ("HOST:RPC_PORT") and, by segment name,
    each registered segment's (base address, nbytes) in that engine's process."""

    session: str
    segments: dict[str, tuple[int, int]]

    def to_text(self) -> str:
        return json.dumps({"session": self.session, "segments": {k: list(v) for k, v in self.segments.items()}},
                          separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> "MooncakeAddress":
        if not text:
            raise ValueError("a Mooncake write needs the peer's address (transport.transfer mismatch?)")
        try:
            d = json.loads(text)
            return cls(str(d["session"]), {str(k): (int(b), int(n)) for k, (b, n) in d["segments"].items()})
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a Mooncake address: {text[:80]!r} ({exc})") from None


def address_of(array: np.ndarray) -> int:
    """The address of an array's first byte in this process (what Mooncake registers and writes)."""
    return int(array.__array_interface__["data"][0])


# A piece of a write: (source address here, destination segment name, offset_bytes in it, nbytes)
Piece = tuple[int, str, int, int]


class MooncakeTransfer:
    """One Mooncake TransferEngine of this process and the segments it registered."""

    def __init__(self, engine: Any, host: str, protocol: str = "tcp") -> None:
        self._engine = engine
        self.session = f"[{host}]:{engine.get_rpc_port()}" if ":" in host else f"{host}:{engine.get_rpc_port()}"
        self._segments: dict[str, tuple[int, int]] = {}
        self._arrays: list[np.ndarray] = []  # registered memory stays alive while registered
        self.sent_bytes = 0  # payload bytes that landed in peers
        # RDMA reads a source through its registration key: a source outside every registered segment
        # (a PE's per-layer KV, fresh each layer) is copied into a registered staging buffer first
        self.stages_sources = protocol == "rdma"
        self._stage: np.ndarray | None = None
        self._stage_lock = threading.Lock()

    @classmethod
    def start(cls, host: str = "127.0.0.1", protocol: str = "tcp", devices: str = "",
              env: dict[str, str] | None = None) -> "MooncakeTransfer":
        """A started engine listening at `host` (step 1 of the module doc); `env` (kv_lane_env) is set
        in this process's environment first: the engine reads it when constructed."""
        te_class = engine_class()
        os.environ.update(env or {})
        # its INFO lines (a dozen per engine at start, one per new peer) only when asked for: MC_LOG_LEVEL=INFO
        os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
        engine = te_class()
        rc = engine.initialize(host, P2P_HANDSHAKE, protocol, devices)
        if rc != 0:
            raise InputError(f"Mooncake Transfer Engine did not start at {host} with protocol {protocol!r} and "
                             f"devices {devices or '(all found)'!r} (initialize returned {rc}; its log above says why)")
        if protocol == "rdma" and not rdma_devices(engine):  # it would move the bytes over TCP, saying so only in its log
            raise InputError(f"transport.mooncake_protocol rdma: Mooncake found no RDMA device "
                             f"({devices or 'any'}) on this host; use transport.mooncake_protocol tcp here")
        return cls(engine, host, protocol)

    def register(self, name: str, array: np.ndarray) -> None:
        """Let peers write into `array` (contiguous bytes of this process) as segment `name`."""
        if not array.flags.c_contiguous:
            raise ValueError(f"segment {name}: only contiguous memory can be registered")
        base, nbytes = address_of(array), array.nbytes
        rc = self._engine.register_memory(base, nbytes)
        if rc != 0:
            raise MooncakeWriteError(f"Mooncake could not register segment {name} ({nbytes} bytes): returned {rc}")
        self._segments[name] = (base, nbytes)
        self._arrays.append(array)

    def address(self) -> MooncakeAddress:
        return MooncakeAddress(self.session, dict(self._segments))

    def write(self, peer: MooncakeAddress, pieces: Sequence[Piece]) -> None:
        """Write every piece into the peer's segments; returns once all have landed there."""
        srcs, dsts, lengths = [], [], []
        for src, segment, offset_bytes, nbytes in pieces:
            base, size = _segment(peer, segment)
            if offset_bytes < 0 or nbytes < 0 or offset_bytes + nbytes > size:
                raise ValueError(f"bytes [{offset_bytes}, {offset_bytes + nbytes}) outside segment {segment} of {size}")
            if nbytes:
                srcs.append(src)
                dsts.append(base + offset_bytes)
                lengths.append(nbytes)
        for i in range(0, len(lengths), MAX_PIECES_PER_CALL):
            part = slice(i, i + MAX_PIECES_PER_CALL)
            rc = self._engine.batch_transfer_sync_write(peer.session, srcs[part], dsts[part], lengths[part])
            if rc != 0:
                raise MooncakeWriteError(f"Mooncake write of {sum(lengths[part])} bytes in {len(lengths[part])} pieces "
                                         f"to {peer.session} failed (returned {rc}: the peer is gone or refused the "
                                         f"addresses)")
            self.sent_bytes += sum(lengths[part])  # one writer: the link's arbiter thread

    def owns(self, address: int, nbytes: int) -> bool:
        """Whether [address, address + nbytes) lies in one segment this engine registered."""
        return any(base <= address and address + nbytes <= base + size for base, size in self._segments.values())

    def write_staged(self, peer: MooncakeAddress, pieces: Sequence[tuple[np.ndarray, str, int]]) -> None:
        """As `write`, with each source (a uint8 array, its destination segment and offset) first
        copied into this engine's registered staging buffer (`stages_sources`)."""
        with self._stage_lock:  # one staging buffer: a writer at a time
            stage = self._staging(sum(src.nbytes for src, _, _ in pieces))
            out: list[Piece] = []
            at, base = 0, address_of(stage)
            for src, segment, offset_bytes in pieces:
                stage[at:at + src.nbytes] = src
                out.append((base + at, segment, offset_bytes, src.nbytes))
                at += src.nbytes
            self.write(peer, out)

    def _staging(self, nbytes: int) -> np.ndarray:
        """The registered staging buffer, grown (a new one registered) when `nbytes` do not fit."""
        if self._stage is None or self._stage.nbytes < nbytes:
            if self._stage is not None:
                self._engine.unregister_memory(address_of(self._stage))
            stage = np.empty(max(nbytes, STAGE_MIN_BYTES), dtype=np.uint8)
            rc = self._engine.register_memory(address_of(stage), stage.nbytes)
            if rc != 0:
                raise MooncakeWriteError(f"Mooncake could not register a staging buffer of {stage.nbytes} bytes: returned {rc}")
            self._stage = stage
        return self._stage

    def close(self) -> None:
        for name, (base, _) in list(self._segments.items()):
            self._engine.unregister_memory(base)
            del self._segments[name]
        self._arrays = []
        with self._stage_lock:
            if self._stage is not None:
                self._engine.unregister_memory(address_of(self._stage))
                self._stage = None


class MooncakeSpanWrite:
    """The `do_chunk` that writes `src_spans` of `src` to `dst_spans` of the peer's region `dst`
    through Mooncake (RemoteSpanWrite's counterpart): the two span lists cut into aligned pieces by
    SpanCopy, so integrity.piece_sums works on it, and `__call__(offset, n)` writes the pieces
    overlapping that chunk of the logical stream in one batch, so a `LinkArbiter` interleaves lanes
    between chunks as it does for a local copy. Every destination span lies in [0, dst.nbytes)."""

    def __init__(self, transfer: MooncakeTransfer, peer: MooncakeAddress, src: np.ndarray,
                 src_spans: list[tuple[int, int]], dst: ShmRegion, dst_spans: list[tuple[int, int]]) -> None:
        for off, n in dst_spans:
            if off < 0 or n < 0 or off + n > dst.nbytes:
                raise ValueError(f"destination span [{off}, {off + n}) outside the region of {dst.nbytes} bytes")
        cut = SpanCopy(src, src_spans, None, dst_spans)  # only its piece cutting: dst is in the peer
        self.transfer, self.peer, self.src, self.dst = transfer, peer, src, dst
        self.nbytes, self.pieces = cut.nbytes, cut.pieces  # (logical start, src offset, dst offset in dst, nbytes)
        self._starts = [p[0] for p in self.pieces]
        view = byte_view(src)  # refuses a non-contiguous source
        if any(so < 0 or so + n > view.nbytes for _, so, _, n in self.pieces):
            raise ValueError("a source span lies outside the source array")
        self._src_bytes = np.frombuffer(view, dtype=np.uint8)
        self._src_address = address_of(self._src_bytes) if view.nbytes else 0
        self._staged = transfer.stages_sources and not transfer.owns(self._src_address, view.nbytes)

    def __call__(self, offset_bytes: int, nbytes: int) -> None:
        if offset_bytes < 0 or nbytes < 0 or offset_bytes + nbytes > self.nbytes:
            raise ValueError(f"bytes [{offset_bytes}, {offset_bytes + nbytes}) outside a write of {self.nbytes}")
        end, base = offset_bytes + nbytes, self.dst.offset_bytes
        out: list[Piece] = []
        k = max(0, bisect.bisect_right(self._starts, offset_bytes) - 1)
        while k < len(self.pieces) and self._starts[k] < end:
            start, so, do, n = self.pieces[k]
            lo, hi = max(offset_bytes, start) - start, min(end, start + n) - start
            if hi > lo:
                out.append((so + lo, self.dst.segment, base + do + lo, hi - lo))
            k += 1
        if self._staged:
            self.transfer.write_staged(self.peer, [(self._src_bytes[s:s + n], seg, off) for s, seg, off, n in out])
        else:
            self.transfer.write(self.peer, [(self._src_address + s, seg, off, n) for s, seg, off, n in out])


def _segment(peer: MooncakeAddress, name: str) -> tuple[int, int]:
    try:
        return peer.segments[name]
    except KeyError:
        raise ValueError(f"the peer at {peer.session} registered no segment {name!r} "
                         f"(it has {', '.join(sorted(peer.segments)) or 'none'})") from None
