"""A prefill engine's relay of a hit for a request its DE prefills (`+selective` with DualPath's
read-side rule; core/scheduler.py `_decided_local`).

Numbered path (protocol.py, `RelayAssign`):
  1. `start`: read the hit blocks into this node's buffer slots through its SNIC, each block checked
     against its checksum (a block that fails ends the hit there).
  2. `read`: `ReadDone` to the router; the verified blocks written into the DE's region through this
     engine's link (engine/peers.py: shared memory on one host, remote writes across hosts), then
     `HitReady` to the DE with the write's sums, after the bytes.
  3. `sent` (the write's completion, on the engine's loop): `RelayDone` to the router, which frees
     the slots. The relay takes no load of the engine's (tok_e, seq_e): no prefill runs here.
"""

from __future__ import annotations

from typing import Any

from ..protocol import HitReady, ReadDone, RelayAssign, RelayDone
from ..transport import ShmRegion
from .base import CopyDone, CopyKind, ReadFinished


class Relays:
    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._open: dict[int, RelayAssign] = {}  # by rid: read, not yet written

    def __contains__(self, rid: int) -> bool:
        return rid in self._open

    def start(self, a: RelayAssign) -> None:
        eng = self._engine
        self._open[a.rid] = a
        eng.storage.read_blocks(a.rid, a.hit_digests, eng.node, a.pe_offsets[: len(a.hit_digests)])

    def read(self, msg: ReadFinished) -> None:
        eng = self._engine
        a = self._open.pop(msg.rid)
        ok = msg.ok_blocks
        eng.mail.to_router(ReadDone(a.rid, eng.spec.engine, len(a.hit_digests) * eng.cfg.block_tokens, msg.nbytes, ok))
        if not ok:  # nothing verified: the DE computes the whole prompt
            eng.mail.send(a.de_endpoint, HitReady(a.rid, 0))
            eng.mail.to_router(RelayDone(a.rid, eng.spec.engine))
            return
        fbb = eng.layout.full_block_bytes
        src = [(off, fbb) for off in a.pe_offsets[:ok]]
        dst = [(off, fbb) for off in a.de_offsets[:ok]]
        region = ShmRegion(a.de_segment, 0, max(off for off, _ in dst) + fbb)
        rid, done = a.rid, CopyDone(a.rid, CopyKind.RELAY, None)
        eng.peers.write(a.de_endpoint, a.de_data, eng.buffers[eng.node], src, region, dst,
                        lambda _sums: eng.mail.to_self(done), reply=lambda sums: HitReady(rid, ok, sums))

    def sent(self, msg: CopyDone) -> None:
        eng = self._engine
        eng.mail.to_router(RelayDone(msg.rid, eng.spec.engine))
