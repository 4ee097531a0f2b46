"""Lanes between hosts: TCP sockets marked so that the kernel's and the fabric's QoS enforce them.

On one host the `LinkArbiter` is the QoS point; between hosts a lane becomes packet marks:

| lane             | DSCP (IP_TOS = DSCP << 2) | SO_PRIORITY | InfiniBand (docs/paper.md §2.3) | RoCE (docs/paper.md §2.4) |
|------------------|---------------------------|-------------|---------------------------|---------------------|
| LATENCY_CRITICAL | 46, EF (expedited)        | 6           | high-priority VL (VL0/1/3 in qos_vlarb_high) | a high-weight TC |
| KV               | 8, CS1 (low-priority data)| 1           | low-priority VL (VL2, only in qos_vlarb_low) | a low-weight TC  |

Why these values: EF is the DSCP for traffic that must see minimal queueing (RFC 3246) and
CS1 the "low-priority data" class of RFC 4594 (RFC 8622's LE = 1 is the newer lower-effort
code point; CS1 is what most switch QoS profiles already queue as bulk); switches map DSCP to egress queues, and a weighted scheduler with ~99:1 weights between the two
queues reproduces the paper's VL arbitration. SO_PRIORITY maps to the Linux qdisc band / the
NIC's traffic class (mqprio, and the VLAN PCP through egress-qos-map); 6 is the highest value an
unprivileged process may set (7 needs CAP_NET_ADMIN). With RDMA verbs the same lanes are the
service level of the queue pair (ibv_qp_attr.ah_attr.sl) on InfiniBand and the GRH traffic class
(ah_attr.grh.traffic_class = DSCP << 2) on RoCE, whose DSCP -> TC map (with PFC on the RDMA TCs)
the operator configures as in docs/paper.md §2.4.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from ...core.lanes import Lane

_SO_PRIORITY = getattr(socket, "SO_PRIORITY", None)  # Linux only
_IPV6_TCLASS = getattr(socket, "IPV6_TCLASS", None)


@dataclass(frozen=True, slots=True)
class LaneSocketOptions:
    dscp: int  # 6-bit Differentiated Services code point
    so_priority: int  # Linux SO_PRIORITY (0-6 unprivileged)

    @property
    def ip_tos(self) -> int:
        """The IPv4 TOS / IPv6 traffic-class byte: DSCP in the upper six bits, ECN bits zero."""
        return self.dscp << 2


_OPTIONS = {
    Lane.LATENCY_CRITICAL: LaneSocketOptions(dscp=46, so_priority=6),
    Lane.KV: LaneSocketOptions(dscp=8, so_priority=1),
}


@dataclass(frozen=True, slots=True)
class AppliedOptions:
    """What a socket actually got; a None field was not supported on this platform/family."""

    ip_tos: int | None
    so_priority: int | None


def lane_socket_options(lane: Lane) -> LaneSocketOptions:
    return _OPTIONS[Lane(lane)]


def apply_lane_options(sock: socket.socket, lane: Lane) -> AppliedOptions:
    """Mark `sock` (TCP, IPv4 or IPv6) for `lane`. Call on connecting sockets before connect and
    on accepted sockets after accept: Linux copies the listener's IP_TOS to an accepted socket
    but not its SO_PRIORITY (seen on 6.x kernels; tests/runtime/transport checks it)."""
    opts = lane_socket_options(lane)
    tos: int | None = None
    if sock.family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, opts.ip_tos)
        tos = opts.ip_tos
    elif sock.family == socket.AF_INET6 and _IPV6_TCLASS is not None:
        sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_TCLASS, opts.ip_tos)
        tos = opts.ip_tos
    prio: int | None = None
    if _SO_PRIORITY is not None:
        sock.setsockopt(socket.SOL_SOCKET, _SO_PRIORITY, opts.so_priority)
        prio = opts.so_priority
    if lane is Lane.LATENCY_CRITICAL:  # small messages: do not wait to coalesce
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return AppliedOptions(tos, prio)


def open_lane_socket(lane: Lane, family: socket.AddressFamily = socket.AF_INET) -> socket.socket:
    """A new TCP socket marked for `lane`, ready to `connect` (or `bind`/`listen`)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        apply_lane_options(sock, lane)
    except OSError:
        sock.close()
        raise
    return sock
