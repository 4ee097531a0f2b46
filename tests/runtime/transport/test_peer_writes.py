"""engine/peers.py across hosts: bytes land in a peer's exposed memory and the reply follows them;
a peer that cannot be reached, or goes away, costs the sender nothing but the bytes (counted,
logged; its local books go on), and a later write connects afresh. Loopback only."""

from __future__ import annotations

import threading

import numpy as np

from dualpath.core.lanes import LaneWeights
from dualpath.runtime.clock import MonotonicClock
from dualpath.runtime.engine.peers import RemotePeers
from dualpath.runtime.transport import LinkArbiter, ShmRegion
from dualpath.runtime.transport.messages import Stop


class _Engine:
    """What RemotePeers asks of an engine: an arbiter, and its mail for messages to go to (itself here)."""

    def __init__(self) -> None:
        self.arbiter = LinkArbiter("cnic-test", None, LaneWeights(), MonotonicClock())
        self.inbox: list = []
        self.got = threading.Event()
        self.mail = self

    def to_self(self, msg) -> None:
        self.inbox.append(msg)
        self.got.set()


def _sent(event: threading.Event, store: list):
    def on_sent(sums):
        store.append(sums)
        event.set()
    return on_sent


def test_bytes_land_then_the_reply_and_a_vanished_peer_costs_nothing():
    sender, receiver = _Engine(), _Engine()
    a, b = RemotePeers(sender, None), RemotePeers(receiver, None)
    try:
        landing = np.zeros(4096, dtype=np.uint8)
        b.expose("landing", landing)
        src = np.arange(4096, dtype=np.uint8)
        done, sent = threading.Event(), []
        sums = a.write("ctl", b.data_endpoint, src, [(0, 1024), (2048, 1024)], ShmRegion("landing", 1024, 3072),
                       [(0, 2048)], _sent(done, sent), reply=lambda s: Stop(f"{len(s)} sums"))
        assert done.wait(10) and receiver.got.wait(10)
        assert receiver.inbox == [Stop(f"{len(sums)} sums")] and sent == [sums]
        assert bytes(landing[1024:2048]) == bytes(src[:1024]) and bytes(landing[2048:3072]) == bytes(src[2048:3072])
        assert not landing[:1024].any() and not landing[3072:].any()  # nothing outside the spans
        assert a.sent_bytes() == 2048 and a.failures == 0

        # the peer goes away: the write is dropped and counted, the sender's books go on
        b.close()
        again, later = threading.Event(), []
        a.write("ctl", b.data_endpoint, src, [(0, 1024)], ShmRegion("landing", 0, 1024), [(0, 1024)],
                _sent(again, later), reply=lambda s: Stop("never"))
        assert again.wait(10) and later and a.failures >= 1
        a.send_after_writes("ctl", b.data_endpoint, Stop("after"))  # nobody listens: counted, no raise
        # a peer that never existed: the same
        gone = threading.Event()
        a.write("ctl", "127.0.0.1:1", src, [(0, 8)], ShmRegion("x", 0, 8), [(0, 8)], _sent(gone, []))
        assert gone.wait(10) and a.failures >= 3
    finally:
        a.close()
        b.close()
        sender.arbiter.close()
        receiver.arbiter.close()
