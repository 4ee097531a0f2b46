"""How an engine's KV bytes reach another engine's memory, and the message that must follow them.

Two engines write into each other's memory twice per request: the DE answers a `LayerPull` by
writing a layer into the PE's landing zone (then `LayerReady`), and the PE writes the prompt's KV
into the DE's host buffer (then, once every copy is done, `PromptReady`). The receiver reads the
bytes when the message comes, so the message must not overtake them.

- One host (`transport.kind` local): the destination is a view of the peer's shared-memory
  segment (shm.SharedSegments); the copy has landed when the link reports it done, and the message
  goes over the control channel.
- Across hosts (`"tcp"`, also on loopback to exercise it): every engine runs a `WriteTarget`
  exposing its own segments, and writes to a peer through a `WriteInitiator` to the peer's data
  endpoint (carried in the messages: `PrefillAssign.de_data`, `LayerPull.reply_data`). The message
  rides the same KV-lane connection as an immediate after the writes (RDMA WRITE_WITH_IMM), and
  the receiver's target hands it to its own inbox: it cannot arrive before the bytes.

- Across hosts through Mooncake Transfer Engine (`transport.transfer` mooncake, transport/mooncake.py):
  every engine registers its segments with its own Mooncake engine and publishes their addresses as
  its data endpoint, carried the same way; a batch write returns once the bytes are in the peer's
  memory, and the message then goes over the control channel, as on one host.

Either way the sender's checksums of what it sent (transport/integrity.py) go with the message.
The three are `LocalPeers`, `RemotePeers` and `MooncakePeers`, one interface, chosen once when the
engine starts (`peers_for`).

A peer that cannot be reached, or whose connection breaks mid-transfer, costs the bytes and the
message to it, never this engine: the failure is logged and counted (`failures`), the local books
(`on_sent`) go on, and the router, which sees the dead peer by its exit or its missing heartbeats
(router/liveness.py), migrates or fails the requests that needed it, as on one host.
In-flight bit flips (`kv_corrupt_probability`) are injected on the local path only: a remote
write's destination is not in this process to flip.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import numpy as np

from ...config import KvTransfer, TransportConfig
from ...core.lanes import Lane
from ..transport.integrity import piece_sums
from ..transport.messages import decode, encode
from ..transport.mooncake import MooncakeAddress, MooncakeSpanWrite, MooncakeTransfer, kv_lane_env
from ..transport.remote_write import RemoteSpanWrite, WriteInitiator, WriteTarget
from ..transport.shm import ShmRegion

log = logging.getLogger(__name__)

Reply = Callable[[list[int]], Any]  # the sender's sums -> the message the peer gets after the bytes


def parse_data_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


class LocalPeers:
    """One host: a peer's segment is mapped here; the message follows on the control channel."""

    data_endpoint = ""  # peers write to this engine by mapping its segment

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.failures = 0  # a local copy does not fail for a peer's sake
        self.bad_immediates = 0

    def expose(self, name: str, array: np.ndarray) -> None:
        """Peers map the segment themselves (shm.SharedSegments): nothing to register."""

    def write(self, peer_control: str, peer_data: str, src: np.ndarray, src_spans: list, region: ShmRegion,
              dst_spans: list, on_sent: Callable[[list[int]], None], reply: Reply | None = None) -> list[int]:
        """Copy `src_spans` of `src` to `dst_spans` (relative to `region`) of a peer's segment; when
        sent, `on_sent(sums)` here and, with `reply`, `reply(sums)` to the peer after the bytes.
        Returns the sums (destination offsets relative to `region`)."""
        eng = self._engine
        dst = eng.attached_view(region)

        def done(sums: list[int]) -> None:
            if reply is not None:
                eng.mail.send(peer_control, reply(sums))
            on_sent(sums)

        return eng.copy_checked(src, src_spans, dst, dst_spans, done)

    def sent_bytes(self) -> int:
        return 0  # nothing crosses TCP

    def send_after_writes(self, peer_control: str, peer_data: str, msg: Any) -> None:
        """`msg` to a peer, after every byte this engine has written to it (a done copy has landed)."""
        self._engine.mail.send(peer_control, msg)

    def fence(self, engine: int, incarnation: int = 0) -> None:
        """Nothing writes into this engine's memory from outside it on one host."""

    def close(self) -> None:
        pass


class RemotePeers:
    """Across hosts: a `WriteTarget` for peers' writes here, a `WriteInitiator` per peer written to;
    the message rides the KV lane as an immediate after the writes."""

    def __init__(self, engine: Any, token: bytes | None, host: str = "127.0.0.1", me: int = -1,
                 incarnation: int = 0) -> None:
        self._engine, self.me = engine, me  # me: this engine's id, named to every peer it writes to
        self.incarnation = incarnation  # ... with which holder of that id this process is (wire.py)
        self._token = token
        self._initiators: dict[str, WriteInitiator] = {}
        self._lock = threading.Lock()
        self.bad_immediates = 0
        self.failures = 0  # writes, immediates or connections to a peer that failed (peer gone)
        self.target = WriteTarget(host, 0, token, on_immediate=self._on_immediate)
        h, p = self.target.address
        self.data_endpoint = f"[{h}]:{p}" if ":" in h else f"{h}:{p}"  # where peers write to this engine

    def expose(self, name: str, array: np.ndarray) -> None:
        """Let peers write into `array` (this engine's host buffer, landing zone) as segment `name`."""
        self.target.register(name, array)

    def write(self, peer_control: str, peer_data: str, src: np.ndarray, src_spans: list, region: ShmRegion,
              dst_spans: list, on_sent: Callable[[list[int]], None], reply: Reply | None = None) -> list[int]:
        """As LocalPeers.write, through the peer's WriteTarget, the reply an immediate after the bytes."""
        eng = self._engine
        init = self._reach(peer_data)
        job = RemoteSpanWrite(init, Lane.KV, src, src_spans, region, dst_spans)  # type: ignore[arg-type]
        sums = piece_sums(job)  # type: ignore[arg-type]  # its src and pieces, as a SpanCopy's
        if init is None:  # the peer cannot be reached (gone): nothing to send, the local books go on
            on_sent(sums)
            return sums
        failed: list[OSError] = []

        def chunk(offset: int, nbytes: int) -> None:
            if not failed:
                try:
                    job(offset, nbytes)
                except OSError as exc:  # the peer went away mid-transfer: drop the rest (see class doc)
                    failed.append(exc)
                    self._failed("a write", peer_data, exc)

        def done(_res: object) -> None:
            if reply is not None and not failed:
                try:
                    init.immediate(Lane.KV, encode(reply(sums)))
                except OSError as exc:
                    self._failed("an immediate", peer_data, exc)
            on_sent(sums)

        eng.arbiter.submit(Lane.KV, job.nbytes, chunk, done)
        return sums

    def sent_bytes(self) -> int:
        """Payload bytes written into peers over TCP so far, both lanes."""
        with self._lock:
            initiators = list(self._initiators.values())
        return sum(sum(i.stats().sent_bytes) for i in initiators)

    def send_after_writes(self, peer_control: str, peer_data: str, msg: Any) -> None:
        """`msg` to a peer, after every byte this engine has written to it on the KV lane."""
        init = self._reach(peer_data)
        try:
            if init is not None:
                init.immediate(Lane.KV, encode(msg))
        except OSError as exc:
            self._failed("an immediate", peer_data, exc)

    def _reach(self, peer_data: str) -> WriteInitiator | None:
        """The peer's initiator, or None (counted) when it cannot be connected to."""
        try:
            return self._initiator(peer_data)
        except OSError as exc:
            self._failed("a connection", peer_data, exc)
            return None

    def _failed(self, what: str, peer_data: str, exc: OSError) -> None:
        self.failures += 1
        log.warning("%s to the peer at %s failed (%s); the router's liveness decides its requests", what, peer_data, exc)
        with self._lock:
            broken = self._initiators.pop(peer_data, None)  # a later write connects afresh
        if broken is not None:
            broken.close()

    def _initiator(self, peer_data: str) -> WriteInitiator:
        if not peer_data:
            raise RuntimeError("a remote write needs the peer's data endpoint (transport.kind mismatch?)")
        with self._lock:
            init = self._initiators.get(peer_data)
            if init is None:
                host, port = parse_data_endpoint(peer_data)
                init = self._initiators[peer_data] = WriteInitiator(host, port, self._token, peer=self.me,
                                                                     incarnation=self.incarnation)
            return init

    def fence(self, engine: int, incarnation: int = 0) -> None:
        """The router fenced `engine`'s `incarnation` (EngineDown): its writes into this engine's
        memory stop here; a successor under a later incarnation is accepted (EngineUp)."""
        self.target.fence(engine, incarnation)

    def _on_immediate(self, lane: Lane, data: bytes) -> None:
        """A peer's message after its writes (on the target's receiver thread): into our inbox."""
        try:
            msg = decode(data)
        except Exception as exc:  # a bad message from an authenticated peer: a bug to see, not a crash
            self.bad_immediates += 1
            log.warning("dropped a malformed immediate of %d bytes: %s", len(data), exc)
            return
        self._engine.mail.to_self(msg)

    def close(self) -> None:
        with self._lock:
            initiators, self._initiators = list(self._initiators.values()), {}
        for init in initiators:
            init.close()
        self.target.close()


class MooncakePeers:
    """Across hosts through Mooncake Transfer Engine (transport.transfer mooncake): the bytes go by
    the engine's batch writes into the peer's registered segment, chunk by chunk on the KV lane of
    the arbiter; each write returns once its bytes are in the peer's memory, so the message then
    goes over the control channel, as on one host, and cannot overtake them. The data endpoint is
    this engine's `MooncakeAddress` as JSON text (its session and segments' addresses)."""

    def __init__(self, engine: Any, transfer: MooncakeTransfer) -> None:
        self._engine, self.transfer = engine, transfer
        self.failures = 0  # writes to a peer that failed (peer gone): counted, the local books go on
        self.bad_immediates = 0  # no immediates here: the messages come on the control channel
        self.fenced: dict[int, int] = {}  # engine id -> its last fenced incarnation (see fence)
        self.data_endpoint = transfer.address().to_text()  # where peers write to this engine

    def expose(self, name: str, array: np.ndarray) -> None:
        """Register `array` (this engine's host buffer, landing zone) as segment `name`."""
        self.transfer.register(name, array)
        self.data_endpoint = self.transfer.address().to_text()

    def write(self, peer_control: str, peer_data: str, src: np.ndarray, src_spans: list, region: ShmRegion,
              dst_spans: list, on_sent: Callable[[list[int]], None], reply: Reply | None = None) -> list[int]:
        """As LocalPeers.write, through Mooncake into the peer's segment, the reply after the bytes."""
        eng = self._engine
        job = MooncakeSpanWrite(self.transfer, MooncakeAddress.from_text(peer_data), src, src_spans, region, dst_spans)
        sums = piece_sums(job)  # type: ignore[arg-type]  # its src and pieces, as a SpanCopy's
        failed: list[OSError] = []

        def chunk(offset: int, nbytes: int) -> None:
            if not failed:
                try:
                    job(offset, nbytes)
                except OSError as exc:  # the peer went away mid-transfer: drop the rest (see the module doc)
                    failed.append(exc)
                    self.failures += 1
                    log.warning("a write to the peer at %s failed (%s); the router's liveness decides its requests",
                                job.peer.session, exc)

        def done(_res: object) -> None:
            if reply is not None and not failed:
                eng.mail.send(peer_control, reply(sums))
            on_sent(sums)

        eng.arbiter.submit(Lane.KV, job.nbytes, chunk, done)
        return sums

    def sent_bytes(self) -> int:
        """Payload bytes written into peers through Mooncake so far."""
        return self.transfer.sent_bytes

    def send_after_writes(self, peer_control: str, peer_data: str, msg: Any) -> None:
        """`msg` to a peer, after every byte this engine has written to it (a returned write has landed)."""
        self._engine.mail.send(peer_control, msg)

    def fence(self, engine: int, incarnation: int = 0) -> None:
        """Noted only: Mooncake's engine takes a write into registered memory from whoever knows its
        address, so a fenced peer that wakes is not cut off at the data plane as our WriteTarget does."""
        self.fenced[engine] = max(incarnation, self.fenced.get(engine, incarnation))

    def close(self) -> None:
        self.transfer.close()


def peers_for(engine: Any, remote: bool, token: bytes | None, host: str = "127.0.0.1", me: int = -1,
              incarnation: int = 0, transport: TransportConfig | None = None) -> LocalPeers | RemotePeers | MooncakePeers:
    """The engine's peers, chosen once: remote (transport.kind tcp), by our remote writes or, with
    transport.transfer mooncake, by Mooncake Transfer Engine at `host`; or on one host."""
    if not remote:
        return LocalPeers(engine)
    if transport is not None and transport.transfer is KvTransfer.MOONCAKE:
        return MooncakePeers(engine, MooncakeTransfer.start(host, str(transport.mooncake_protocol), transport.mooncake_devices,
                                                            kv_lane_env(transport.mooncake_kv_sl)))
    return RemotePeers(engine, token, host, me, incarnation)
