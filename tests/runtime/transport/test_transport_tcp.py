"""Lanes as DSCP / SO_PRIORITY on TCP sockets."""

import socket

import pytest

from dualpath.core.lanes import Lane
from dualpath.runtime.transport.tcp import apply_lane_options, lane_socket_options, open_lane_socket

needs_linux = pytest.mark.skipif(not hasattr(socket, "SO_PRIORITY"), reason="SO_PRIORITY is Linux-only")


def test_lane_mapping():
    lc, kv = lane_socket_options(Lane.LATENCY_CRITICAL), lane_socket_options(Lane.KV)
    assert (lc.dscp, lc.so_priority, lc.ip_tos) == (46, 6, 184)  # EF
    assert (kv.dscp, kv.so_priority, kv.ip_tos) == (8, 1, 32)  # CS1
    assert lc.so_priority > kv.so_priority


@needs_linux
@pytest.mark.parametrize("lane", [Lane.LATENCY_CRITICAL, Lane.KV])
def test_loopback_pair_carries_the_marks_and_the_data(lane):
    opts = lane_socket_options(lane)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with open_lane_socket(lane) as client:
            client.connect(listener.getsockname())
            server, _ = listener.accept()
            with server:
                applied = apply_lane_options(server, lane)
                assert (applied.ip_tos, applied.so_priority) == (opts.ip_tos, opts.so_priority)
                for s in (client, server):
                    assert s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == opts.ip_tos
                    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY) == opts.so_priority
                payload = bytes(range(256)) * 4096
                client.sendall(payload)
                got = bytearray()
                while len(got) < len(payload):
                    got += server.recv(1 << 16)
                assert bytes(got) == payload


@needs_linux
def test_ipv6_sockets_get_the_traffic_class():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        s = open_lane_socket(Lane.KV, socket.AF_INET6)
    except OSError:
        pytest.skip("IPv6 sockets unavailable")
    with s:
        assert s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS) == 32
