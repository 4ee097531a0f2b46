"""transport/mooncake.py and engine/peers.py's MooncakePeers: two Mooncake Transfer Engines in one
process over loopback TCP. The bytes of a span list land where the pieces say and nowhere else, and
a peer's message comes after them; a peer that is not there, or an address outside what it
registered, is a clear error (counted by the peers, who go on); without the package, one InputError
saying what to install. Tests that need the engine skip where it does not load (the default
install lacks it)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import numpy as np
import pytest

from dualpath.config import RuntimeConfig
from dualpath.config.overrides import apply_overrides
from dualpath.core.lanes import LaneWeights
from dualpath.errors import InputError
from dualpath.runtime.clock import MonotonicClock
from dualpath.runtime.cluster import LocalCluster
from dualpath.runtime.engine.peers import MooncakePeers, RemotePeers, peers_for
from dualpath.runtime.transport import LinkArbiter, ShmRegion
from dualpath.runtime.transport.integrity import bad_pieces
from dualpath.runtime.transport.messages import Stop
from dualpath.runtime.transport.mooncake import (INSTALL_HINT, MooncakeAddress, MooncakeSpanWrite, MooncakeTransfer,
                                                 MooncakeWriteError, MAX_PIECES_PER_CALL, address_of, engine_class,
                                                 kv_lane_env, mooncake_loads, rdma_devices)


needs_mooncake = pytest.mark.skipif(not mooncake_loads(), reason="Mooncake Transfer Engine does not load: pip install "
                                    "'dualpath[mooncake]' and apt-get install libibverbs1 librdmacm1 libnuma1")


@pytest.fixture(scope="module")
def pair():
    a, b = MooncakeTransfer.start(), MooncakeTransfer.start()
    yield a, b
    a.close()
    b.close()


@needs_mooncake
def test_a_span_list_lands_in_the_peers_segments_and_nowhere_else(pair):
    a, b = pair
    landing, buffer = np.zeros(8192, dtype=np.uint8), np.zeros(4096, dtype=np.uint8)
    b.register("landing", landing)
    b.register("buffer", buffer)
    src = np.random.default_rng(1).integers(0, 256, 16384, dtype=np.uint8)
    peer = MooncakeAddress.from_text(b.address().to_text())  # as a message carries it
    assert peer.segments == {"landing": (address_of(landing), 8192), "buffer": (address_of(buffer), 4096)}
    s = address_of(src)
    a.write(peer, [(s + 100, "landing", 1000, 3000), (s + 9000, "landing", 6000, 1), (s, "buffer", 4000, 96),
                   (s, "buffer", 0, 0)])
    assert bytes(landing[1000:4000]) == bytes(src[100:3100]) and landing[6000] == src[9000]
    assert bytes(buffer[4000:]) == bytes(src[:96])
    untouched = np.ones(landing.size, dtype=bool)
    untouched[1000:4000] = untouched[6000] = False
    assert not landing[untouched].any() and not buffer[:4000].any()  # nothing outside the pieces


@needs_mooncake
def test_a_write_of_more_pieces_than_one_call_takes_lands_whole(pair):
    """One batch call of 2,730 pieces fails (mooncake.py: MAX_PIECES_PER_CALL): `write` splits it."""
    a, b = pair
    n, piece = MAX_PIECES_PER_CALL + 682, 64
    src = np.random.default_rng(3).integers(0, 256, n * piece, dtype=np.uint8)
    dst = np.zeros_like(src)
    a.register("many_src", src)
    b.register("many_dst", dst)
    sent = a.sent_bytes
    a.write(b.address(), [(address_of(src) + k * piece, "many_dst", (n - 1 - k) * piece, piece) for k in range(n)])
    assert np.array_equal(dst.reshape(n, piece), src.reshape(n, piece)[::-1])  # every piece where it was sent
    assert a.sent_bytes - sent == n * piece


@needs_mooncake
def test_an_absent_peer_a_foreign_address_and_an_unknown_segment_are_clear_errors(pair):
    a, b = pair
    dst = np.zeros(64, dtype=np.uint8)
    b.register("dst", dst)
    src = np.full(64, 7, dtype=np.uint8)
    with pytest.raises(MooncakeWriteError, match="to 127.0.0.1:1 failed"):  # nobody answers there
        a.write(MooncakeAddress("127.0.0.1:1", {"dst": (address_of(dst), 64)}), [(address_of(src), "dst", 0, 64)])
    stray = np.zeros(64, dtype=np.uint8)  # memory the peer never registered: it refuses the write
    with pytest.raises(MooncakeWriteError, match="refused"):
        a.write(MooncakeAddress(b.session, {"dst": (address_of(stray), 64)}), [(address_of(src), "dst", 0, 64)])
    assert not stray.any() and not dst.any()
    with pytest.raises(ValueError, match="registered no segment 'landing2'"):
        a.write(b.address(), [(address_of(src), "landing2", 0, 8)])
    with pytest.raises(ValueError, match="outside segment dst"):
        a.write(b.address(), [(address_of(src), "dst", 60, 8)])
    a.write(b.address(), [(address_of(src), "dst", 0, 64)])  # the engine still works after the refusals
    assert bytes(dst) == bytes(src)


@needs_mooncake
def test_a_source_outside_registered_memory_goes_through_the_staging_buffer_where_rdma_needs_it(pair, monkeypatch):
    a, b = pair
    landing = np.zeros(200000, dtype=np.uint8)
    b.register("staged", landing)
    own = np.zeros(4096, dtype=np.uint8)
    a.register("own", own)
    src = np.random.default_rng(3).integers(0, 256, 100000, dtype=np.uint8)  # registered nowhere
    seen: list[tuple[int, int]] = []  # (source address, nbytes) of every piece Mooncake was given
    stages: list[tuple[int, int]] = []  # the staging buffer's (address, nbytes) at each write
    write = a.write

    def spy(peer, pieces):
        seen.extend((p[0], p[3]) for p in pieces)
        stages.extend([(address_of(a._stage), a._stage.nbytes) if a._stage is not None else (0, 0)] * len(pieces))
        write(peer, pieces)

    monkeypatch.setattr(a, "write", spy)
    monkeypatch.setattr(a, "stages_sources", True)  # as with protocol rdma (over TCP here)
    job = MooncakeSpanWrite(a, b.address(), src, [(0, 30000), (50000, 50000)], ShmRegion("staged", 100, 90000),
                            [(0, 80000)])
    for offset in range(0, job.nbytes, 8192):  # as the arbiter's 8 KiB chunks
        job(offset, min(8192, job.nbytes - offset))
    job(0, job.nbytes)  # one chunk larger than the staging buffer: it grows
    assert bytes(landing[100:80100]) == bytes(src[:30000]) + bytes(src[50000:]) and not landing[80100:].any()
    assert not landing[:100].any() and seen and all(a.owns(addr, n) is False for addr, n in seen)
    assert all(base <= addr and addr + n <= base + size for (addr, n), (base, size) in zip(seen, stages))
    assert stages[0][1] < 80000 <= stages[-1][1]  # grown for the whole-transfer chunk
    seen.clear()  # a source in registered memory is written from where it is
    own[:] = 9
    MooncakeSpanWrite(a, b.address(), own, [(0, 4096)], ShmRegion("staged", 0, 4096), [(0, 4096)])(0, 4096)
    assert seen == [(address_of(own), 4096)] and (landing[:4096] == 9).all()


@needs_mooncake
@pytest.mark.skipif(os.path.isdir("/sys/class/infiniband"), reason="this host has RDMA devices")
def test_rdma_without_rdma_devices_is_refused_not_quietly_tcp():
    with pytest.raises(InputError, match="found no RDMA device"):
        MooncakeTransfer.start(protocol="rdma")


def test_without_the_package_one_input_error_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # as if it were not installed: import fails
    for call in (engine_class, MooncakeTransfer.start):
        with pytest.raises(InputError) as err:
            call()
        assert INSTALL_HINT in str(err.value) and "dualpath[mooncake]" in str(err.value)
        assert "libibverbs1 librdmacm1 libnuma1" in str(err.value)


def test_addresses_round_trip_and_a_missing_one_is_named():
    addr = MooncakeAddress("10.0.0.2:15001", {"seg": (140000000000, 4096)})
    assert MooncakeAddress.from_text(addr.to_text()) == addr
    with pytest.raises(ValueError, match="needs the peer's address"):
        MooncakeAddress.from_text("")  # a peer of ours, not of Mooncake's
    with pytest.raises(ValueError, match="not a Mooncake address"):
        MooncakeAddress.from_text("127.0.0.1:5000")


def test_the_rdma_devices_are_read_from_the_engines_topology():
    class Engine:
        def __init__(self, topology: str) -> None:
            self.get_local_topology = lambda: topology

    assert rdma_devices(Engine('{"cpu:0": [["mlx5_0"], ["mlx5_1"]], "cuda:0": [["mlx5_0"], []]}')) == {"mlx5_0", "mlx5_1"}
    assert rdma_devices(Engine('{\n\t"cpu:0" : \n\t[\n\t\t[],\n\t\t[]\n\t]\n}\n')) == set()  # as 0.3.13 prints none


def test_the_kv_lane_is_the_low_priority_service_level_and_traffic_class():
    assert kv_lane_env(2) == {"MC_IB_SL": "2", "MC_IB_TC": "32"}  # DSCP CS1 (8) << 2


class _Engine:
    """What MooncakePeers asks of an engine: an arbiter, and mail to a peer's control endpoint
    (a dict of fake engines here), which records what had landed when each message came."""

    def __init__(self, post: dict, name: str, landing: np.ndarray | None = None) -> None:
        self.arbiter = LinkArbiter(f"cnic-{name}", None, LaneWeights(), MonotonicClock())
        self.inbox: list = []
        self.landed_at_message: list[bytes] = []
        self.got = threading.Event()
        self.mail, self._post, self.landing = self, post, landing
        post[name] = self

    def send(self, endpoint: str, msg) -> None:
        self._post[endpoint].receive(msg)

    def receive(self, msg) -> None:
        self.landed_at_message.append(bytes(self.landing) if self.landing is not None else b"")
        self.inbox.append(msg)
        self.got.set()


@needs_mooncake
def test_mooncake_peers_land_the_bytes_then_the_reply_and_a_vanished_peer_costs_nothing():
    post: dict = {}
    landing = np.zeros(65536, dtype=np.uint8)
    sender, receiver = _Engine(post, "a"), _Engine(post, "b", landing)
    a, b = MooncakePeers(sender, MooncakeTransfer.start()), MooncakePeers(receiver, MooncakeTransfer.start())
    try:
        b.expose("landing", landing)
        src = np.random.default_rng(2).integers(0, 256, 65536, dtype=np.uint8)
        done, sent = threading.Event(), []

        def on_sent(sums):
            sent.append(sums)
            done.set()

        # many arbiter chunks (8 KiB each): every one a batch write of its pieces
        spans = [(0, 20000), (30000, 20000)]
        sums = a.write("b", b.data_endpoint, src, spans, ShmRegion("landing", 4096, 61440), [(0, 40000)], on_sent,
                       reply=lambda s: Stop(f"{len(s)} sums"))
        assert done.wait(10) and receiver.got.wait(10)
        assert receiver.inbox == [Stop(f"{len(sums)} sums")] and sent == [sums]
        want = bytes(src[:20000]) + bytes(src[30000:50000])
        assert bytes(landing[4096:44096]) == want and not landing[:4096].any() and not landing[44096:].any()
        assert receiver.landed_at_message[0] == bytes(landing)  # the message came after every byte
        assert bad_pieces(landing, sums, base_bytes=4096) == []  # the sums are of what landed
        assert a.sent_bytes() == 40000 and a.failures == 0

        b.close()  # the peer unregisters its memory (as a gone peer): the write is refused, counted, books go on
        again = threading.Event()
        a.write("b", b.data_endpoint, src, [(0, 1024)], ShmRegion("landing", 0, 1024), [(0, 1024)],
                lambda s: again.set(), reply=lambda s: Stop("never"))
        assert again.wait(10) and a.failures == 1 and len(receiver.inbox) == 1
        gone = threading.Event()  # a peer that never existed: the same
        a.write("b", MooncakeAddress("127.0.0.1:1", {"x": (1 << 20, 8)}).to_text(), src, [(0, 8)], ShmRegion("x", 0, 8),
                [(0, 8)], lambda s: gone.set())
        assert gone.wait(10) and a.failures == 2
        with pytest.raises(ValueError, match="needs the peer's address"):  # a peer of the other transfer
            a.write("b", "", src, [(0, 8)], ShmRegion("x", 0, 8), [(0, 8)], lambda s: None)
    finally:
        a.close()
        sender.arbiter.close()
        receiver.arbiter.close()


@needs_mooncake
def test_peers_for_chooses_mooncake_by_the_transfer_and_our_writes_otherwise():
    post: dict = {}
    eng = _Engine(post, "e")
    cfg = apply_overrides(RuntimeConfig(model="tiny"), ["transport.kind=tcp", "transport.transfer=mooncake"])
    peers = peers_for(eng, True, None, "127.0.0.1", 0, 0, cfg.transport)
    ours = peers_for(eng, True, None, "127.0.0.1", 0, 0, apply_overrides(cfg, ["transport.transfer=remote-write"]).transport)
    try:
        assert isinstance(peers, MooncakePeers) and isinstance(ours, RemotePeers)
        assert MooncakeAddress.from_text(peers.data_endpoint).session == peers.transfer.session
    finally:
        peers.close()
        ours.close()
        eng.arbiter.close()


def test_a_cluster_with_the_kv_through_mooncake_refuses_to_start_where_it_does_not_load(monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)
    cfg = apply_overrides(RuntimeConfig(model="tiny"), ["transport.kind=tcp", "transport.transfer=mooncake"])
    with pytest.raises(InputError, match=r"pip install 'dualpath\[mooncake\]'"):
        asyncio.run(LocalCluster(cfg).start())  # before any engine, store or router exists
