"""Control channels across hosts (transport/channel.py, peer_auth.py): tcp:// endpoints beyond
loopback need a token; with one, only peers holding the same token are heard; malformed frames
are dropped and counted, and the inbox goes on serving. Loopback only."""

from __future__ import annotations

import socket

import pytest
import zmq

from dualpath.runtime.transport.channel import Inbox, Outbox
from dualpath.runtime.transport.messages import Stop, encode
from dualpath.runtime.transport.peer_auth import ZapHandler, derive_keys, endpoint_is_local
from dualpath.runtime.transport.tcp import lane_socket_options
from dualpath.core.lanes import Lane

TOKEN = b"a shared secret of this deployment"


def test_keys_derive_from_the_token_alone():
    a, b, c = derive_keys(TOKEN), derive_keys(TOKEN), derive_keys(b"another token")
    assert a == b and a.server_public != c.server_public and a.client_public != c.client_public
    assert a.server_public != a.client_public
    assert zmq.curve_public(a.server_secret) == a.server_public
    with pytest.raises(ValueError, match="empty token"):
        derive_keys(b"")


def test_endpoints_beyond_loopback_need_a_token():
    assert endpoint_is_local("ipc:///tmp/x.ipc") and endpoint_is_local("tcp://127.0.0.1:5")
    assert endpoint_is_local("tcp://[::1]:5") and endpoint_is_local("tcp://localhost:5")
    assert not endpoint_is_local("tcp://0.0.0.0:5") and not endpoint_is_local("tcp://*:5")
    assert not endpoint_is_local("tcp://10.1.2.3:5") and not endpoint_is_local("tcp://some-host:5")
    with pytest.raises(ValueError, match="needs a shared token"):
        Inbox("tcp://0.0.0.0:0")
    with pytest.raises(ValueError, match="needs a shared token"):
        Outbox("tcp://10.1.2.3:5555")


def _leaked_key_client(endpoint: str) -> zmq.Socket:
    """A peer that learnt the server's public key but not the token: its own CURVE key pair."""
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    public, secret = zmq.curve_keypair()
    sock.setsockopt(zmq.CURVE_SERVERKEY, derive_keys(TOKEN).server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    sock.connect(endpoint)
    return sock


def _try_send(sock: zmq.Socket, data: bytes) -> None:
    """Send from a peer that will be refused: once its handshake has failed, zmq has dropped its
    connection and a PUSH send would wait for a peer forever, so wait 1 s at most (nothing sent
    is nothing heard either)."""
    sock.setsockopt(zmq.SNDTIMEO, 1000)
    try:
        sock.send(data)
    except zmq.Again:
        pass


def test_only_holders_of_the_token_are_heard():
    zap = ZapHandler.for_context(zmq.Context.instance())
    before = zap.refused
    with Inbox("tcp://127.0.0.1:0", token=TOKEN) as inbox:
        assert inbox.endpoint.startswith("tcp://127.0.0.1:")
        leaked = _leaked_key_client(inbox.endpoint)
        with Outbox(inbox.endpoint, token=b"a wrong token", linger_s=0) as stranger, \
             Outbox(inbox.endpoint, linger_s=0) as plain:
            _try_send(stranger._sock, encode(Stop("wrong token: the handshake fails on the server key")))
            _try_send(plain._sock, encode(Stop("no security at all: refused by mechanism")))
            _try_send(leaked, encode(Stop("right server key, unknown client key: refused by ZAP")))
            assert inbox.recv(timeout_s=1.5) is None  # none is heard
        leaked.close()
        assert zap.refused > before
        with Outbox(inbox.endpoint, token=TOKEN) as friend:
            friend.send(Stop("from a friend"))
            assert inbox.recv(timeout_s=5.0) == Stop("from a friend")


def test_malformed_frames_are_dropped_and_the_inbox_serves_on():
    with Inbox("tcp://127.0.0.1:0") as inbox:  # loopback: no token needed
        raw = zmq.Context.instance().socket(zmq.PUSH)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(inbox.endpoint)
        try:
            for junk in (b"", b"\xc1", b"\x01", b"\x92\xa4Nope\x01", b"\x93\xa4Stop\x01\x02", b"\x81\x01\x02",
                         encode(Stop("x"))[:-1], bytes(range(256))):
                raw.send(junk)
            raw.send(encode(Stop("after the junk")))
            assert inbox.recv(timeout_s=5.0) == Stop("after the junk")
            assert inbox.bad_frames == 8
        finally:
            raw.close()


def test_tcp_control_sockets_ride_the_latency_critical_lane():
    with Inbox("tcp://127.0.0.1:0") as inbox, Outbox(inbox.endpoint) as out:
        assert out._sock.getsockopt(zmq.TOS) == lane_socket_options(Lane.LATENCY_CRITICAL).ip_tos
        assert inbox._sock.getsockopt(zmq.TOS) == lane_socket_options(Lane.LATENCY_CRITICAL).ip_tos
        out.send(Stop("marked"))
        assert inbox.recv(timeout_s=5.0) == Stop("marked")
    assert socket.IP_TOS  # the platform has the option the marks use
