"""Remote writes against hostile or mistaken peers: every bad frame closes only its own connection,
the registered region stays untouched, the target keeps serving; the token is checked by
challenge-response; without a token the target stays on loopback, since anyone on the network could write its regions."""

import socket
import threading

import numpy as np
import pytest

from dualpath.netaddr import is_loopback

from dualpath.core.lanes import Lane
from dualpath.runtime.transport.remote_write import PeerRefused, WriteInitiator, WriteTarget, wire
from remote_write_helpers import Inbox, closed_by_peer, raw_header, raw_peer, sentinel, wait_until

LC, KV = Lane.LATENCY_CRITICAL, Lane.KV
SIZE = 4_096
W, I = wire.KIND_WRITE, wire.KIND_IMM


@pytest.fixture
def target():
    inbox = Inbox()
    t = WriteTarget("127.0.0.1", 0, on_immediate=inbox)
    region = sentinel(SIZE)
    t.register("seg", region)
    yield t, region, inbox
    t.close()


def still_serving(t, region, inbox):
    """A well-behaved initiator still lands bytes and IMMs after the bad peer was cut off."""
    with WriteInitiator(*t.address, lanes=(KV,)) as ok:
        ok.write(KV, "seg", 10, b"\x01\x02\x03")
        ok.immediate(KV, b"fine")
        assert inbox.get()[:2] == (KV, b"fine")
    assert bytes(region[10:13]) == b"\x01\x02\x03"
    region[10:13] = 0xA5


BAD_FRAMES = {  # name -> the bytes a bad peer sends right after its handshake
    "unknown segment": raw_header(W, 4, 8, 0) + b"nope" + b"X" * 8,
    "past the end": raw_header(W, 3, 8, SIZE - 4) + b"seg" + b"X" * 8,
    "offset past the end": raw_header(W, 3, 1, SIZE) + b"seg" + b"X",
    "negative offset (wraps to 2**64 - 8)": raw_header(W, 3, 8, 2**64 - 8) + b"seg" + b"X" * 8,
    "empty write": raw_header(W, 3, 0, 0) + b"seg",
    "write over the frame limit": raw_header(W, 3, wire.MAX_WRITE_FRAME_BYTES + 1, 0) + b"seg" + b"X" * 64,
    "no segment name": raw_header(W, 0, 8, 0) + b"X" * 8,
    "name not UTF-8": raw_header(W, 2, 8, 0) + b"\xff\xfe" + b"X" * 8,
    "unknown kind": raw_header(7, 0, 8, 0) + b"X" * 8,
    "reserved bits": raw_header(W, 3, 8, 0, reserved=1) + b"seg" + b"X" * 8,
    "IMM over the limit": raw_header(I, 0, wire.MAX_IMM_BYTES + 1, 0),
    "IMM with an offset": raw_header(I, 0, 2, 5) + b"hi",
    "garbage": bytes(range(256)) * 4,
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_a_bad_frame_closes_its_connection_only_and_writes_nothing(target, name):
    t, region, inbox = target
    bystander = raw_peer(t, LC)  # another peer, connected before the bad one
    bad = raw_peer(t, KV)
    bad.sendall(BAD_FRAMES[name])
    assert closed_by_peer(bad)
    assert np.array_equal(region, sentinel(SIZE))  # nothing written, inside or beside the region
    assert wait_until(lambda: t.stats().bad_frames == (0, 1))
    assert t.stats().written_bytes == (0, 0)
    bystander.sendall(raw_header(W, 3, 2, 0) + b"seg" + b"ok")  # the other connection still works
    bystander.sendall(raw_header(I, 0, 1, 0) + b"!")
    assert inbox.get()[:2] == (LC, b"!")
    assert bytes(region[:2]) == b"ok"
    region[:2] = 0xA5
    bystander.close()
    still_serving(t, region, inbox)


def test_good_writes_before_a_bad_frame_stay_and_nothing_after_it_lands(target):
    t, region, inbox = target
    bad = raw_peer(t, KV)
    bad.sendall(raw_header(W, 3, 4, 100) + b"seg" + b"good"
                + raw_header(W, 3, 8, SIZE - 1) + b"seg" + b"Y" * 8
                + raw_header(W, 3, 4, 200) + b"seg" + b"late")  # after the bad frame: never read
    assert closed_by_peer(bad)
    want = sentinel(SIZE)
    want[100:104] = np.frombuffer(b"good", np.uint8)
    assert np.array_equal(region, want)
    assert inbox.items.empty()


def test_a_silent_peer_is_dropped_after_the_handshake_timeout_and_others_get_in():
    with WriteTarget(handshake_timeout_s=0.2) as t:
        t.register("seg", sentinel(SIZE))
        silent = socket.create_connection(t.address)
        assert closed_by_peer(silent)  # the challenge arrives, then EOF once the timeout passes
        assert wait_until(lambda: t.stats().refused_unidentified == 1)
        with WriteInitiator(*t.address) as ok:
            ok.write(KV, "seg", 0, b"z")
        silent.close()


def test_a_malformed_hello_is_refused():
    with WriteTarget() as t:
        s = socket.create_connection(t.address)
        s.recv(wire.CHALLENGE.size)
        s.sendall(b"HTTP/1.1 GET /" + bytes(wire.HELLO.size))
        assert closed_by_peer(s)
        assert wait_until(lambda: t.stats().refused_unidentified == 1)
        s.close()


def test_the_right_token_is_accepted_and_a_wrong_or_missing_one_refused_and_counted():
    inbox = Inbox()
    region = sentinel(SIZE)
    with WriteTarget(token=b"s3cret", on_immediate=inbox) as t:
        t.register("seg", region)
        with pytest.raises(PeerRefused):
            WriteInitiator(*t.address, token=b"wrong", lanes=(KV,))
        with pytest.raises(PeerRefused):
            WriteInitiator(*t.address, lanes=(LC,))  # no token at all
        assert wait_until(lambda: t.stats().refused_connections == (1, 1))
        with WriteInitiator(*t.address, token=b"s3cret") as ok:
            ok.write(KV, "seg", 0, b"in")
            ok.immediate(KV, b"done")
            assert inbox.get()[:2] == (KV, b"done")
        assert bytes(region[:2]) == b"in"
        assert t.stats().written_bytes == (0, 2)


def test_a_hello_mac_is_bound_to_its_nonce_and_lane():
    mac = wire.hello_mac(b"t", b"n" * 32, KV)
    assert mac != wire.hello_mac(b"t", b"m" * 32, KV)
    assert mac != wire.hello_mac(b"t", b"n" * 32, LC)
    assert mac != wire.hello_mac(b"u", b"n" * 32, KV)
    assert len(mac) == wire.MAC_BYTES


def test_without_a_token_the_target_stays_on_loopback():
    for host in ("0.0.0.0", "192.0.2.1", "::"):
        with pytest.raises(ValueError, match="needs a shared token"):
            WriteTarget(host, 0)
    with pytest.raises(ValueError, match="empty"):
        WriteTarget("127.0.0.1", 0, token=b"")
    assert is_loopback("localhost") and is_loopback("127.0.0.2") and is_loopback("::1")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.com")


def test_connections_beyond_the_limit_are_refused():
    with WriteTarget(max_connections=2) as t:
        t.register("seg", sentinel(SIZE))
        with WriteInitiator(*t.address):  # two lanes: the limit
            with pytest.raises(PeerRefused):
                WriteInitiator(*t.address, lanes=(KV,))
            assert wait_until(lambda: t.stats().refused_unidentified == 1)
        assert wait_until(lambda: t.stats().open_connections == 0)
        with WriteInitiator(*t.address) as again:  # freed slots are reusable
            again.write(KV, "seg", 0, b"x")


def test_registration_refuses_what_it_cannot_expose():
    with WriteTarget() as t:
        with pytest.raises(ValueError, match="uint8"):
            t.register("f", np.zeros(4, dtype=np.float32))
        with pytest.raises(ValueError, match="uint8"):
            t.register("ro", np.frombuffer(b"abcd", dtype=np.uint8))
        with pytest.raises(ValueError, match="segment name"):
            t.register("", np.zeros(4, dtype=np.uint8))
        t.register("x", np.zeros(4, dtype=np.uint8))
        with pytest.raises(ValueError, match="already"):
            t.register("x", np.zeros(4, dtype=np.uint8))


def test_a_write_to_a_closed_target_fails_loudly_and_breaks_only_that_lane():
    t = WriteTarget()
    t.register("seg", sentinel(SIZE))
    initiator = WriteInitiator(*t.address)
    t.close()
    with pytest.raises(wire.RemoteWriteError):
        for _ in range(1000):  # the first sends may still fit the kernel's buffers
            initiator.write(KV, "seg", 0, np.zeros(SIZE, np.uint8))
    with pytest.raises(wire.RemoteWriteError, match="unusable"):
        initiator.write(KV, "seg", 0, b"x")
    initiator.close()


def test_a_peer_that_stops_reading_breaks_the_lane_after_the_send_timeout():
    """A frozen target (it accepted, then reads nothing): the write gives up instead of blocking
    the caller's thread for ever."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        held = []

        def frozen_target():
            conn, _ = listener.accept()
            held.append(conn)
            conn.sendall(wire.CHALLENGE.pack(wire.MAGIC, wire.PROTOCOL_VERSION, bytes(wire.NONCE_BYTES)))
            conn.recv(wire.HELLO.size, socket.MSG_WAITALL)
            conn.sendall(wire.ACCEPT)

        thread = threading.Thread(target=frozen_target)
        thread.start()
        initiator = WriteInitiator(*listener.getsockname(), lanes=(KV,), send_timeout_s=0.3)
        thread.join()
        with pytest.raises(wire.RemoteWriteError, match="timed out"):
            initiator.write(KV, "seg", 0, np.zeros(64 * 2**20, np.uint8))  # more than the kernel buffers
        with pytest.raises(wire.RemoteWriteError, match="unusable"):
            initiator.immediate(KV, b"late")
        initiator.close()
        held[0].close()


def test_a_fenced_peer_is_cut_off_and_refused_and_others_write_on(target):
    """The router fenced engine 1 (EngineDown): the target cuts its connections and refuses its
    hellos; engine 2 writes on. The MAC binds the id, so a peer cannot name another's."""
    t, region, inbox = target
    one, two = WriteInitiator(*t.address, lanes=(KV,), peer=1), WriteInitiator(*t.address, lanes=(KV,), peer=2)
    try:
        one.write(KV, "seg", 0, b"\x07" * 8)
        one.immediate(KV, b"one")
        assert inbox.get()[:2] == (KV, b"one") and bytes(region[:8]) == b"\x07" * 8
        t.fence(1)
        wait_until(lambda: not any(p == 1 for p, _ in t._peer_of.values()))
        with pytest.raises(OSError):  # its connection is gone: the next writes fail on the sender
            for _ in range(50):
                one.write(KV, "seg", 8, b"\x09" * 8)
        assert bytes(region[8:16]) != b"\x09" * 8
        with pytest.raises(PeerRefused):
            WriteInitiator(*t.address, lanes=(KV,), peer=1)
        two.write(KV, "seg", 16, b"\x02" * 8)
        two.immediate(KV, b"two")
        assert inbox.get()[:2] == (KV, b"two") and bytes(region[16:24]) == b"\x02" * 8
    finally:
        one.close()
        two.close()
    assert wire.hello_mac(b"t", b"n" * 32, KV, 1) != wire.hello_mac(b"t", b"n" * 32, KV, 2)


def test_a_fenced_incarnation_stays_refused_and_its_successor_writes(target):
    """Engine 1 restarted (Ray): the router fenced incarnation 0 and re-admitted incarnation 1.
    The old one is refused, even after the successor connected; the successor's bytes land; the
    MAC binds the incarnation, so the old process cannot claim the new one's."""
    t, region, inbox = target
    t.fence(1, 0)
    with pytest.raises(PeerRefused):
        WriteInitiator(*t.address, lanes=(KV,), peer=1, incarnation=0)
    successor = WriteInitiator(*t.address, lanes=(KV,), peer=1, incarnation=1)
    try:
        successor.write(KV, "seg", 0, b"\x05" * 8)
        successor.immediate(KV, b"next")
        assert inbox.get()[:2] == (KV, b"next") and bytes(region[:8]) == b"\x05" * 8
        with pytest.raises(PeerRefused):
            WriteInitiator(*t.address, lanes=(KV,), peer=1, incarnation=0)
        t.fence(1, 1)  # the successor died too: its connection is cut
        wait_until(lambda: not t._peer_of)
    finally:
        successor.close()
    assert wire.hello_mac(b"t", b"n" * 32, KV, 1, 0) != wire.hello_mac(b"t", b"n" * 32, KV, 1, 1)
