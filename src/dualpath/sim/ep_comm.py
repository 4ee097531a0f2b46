"""Expert-parallel dispatch + combine of one node's GPUs on their CNICs, the latency-critical lane
(bytes from costmodel/ep_traffic.py; what the lanes buy: `dualpath bench lanes --sim`).

How it is timed. The unloaded all-to-all is already in every forward and step as the calibrated
fixed cost `ComputeKnobs.ep_latency_per_layer_s` (DeepEP's measured kernels, which are bandwidth
bound: costmodel/ep_traffic.py checks the bytes against them). What the lanes decide is how much longer
the bursts take when KV shares the link. So a step (or forward) of a GPU with b bytes of bursts
takes b / r - b / C longer, r being the rate a burst gets on the GPU's CNIC now
(`Link.lc_burst_rate`: ~99% of the link with two classes under contention, one flow's share with
one FIFO class) and C the link's capacity; the node's GPUs run in lockstep, so the slowest GPU's
extra is the group's. The bursts' bytes are booked on both directions of each GPU's CNIC (EP is
symmetric on average: what a GPU sends equals what it receives) and their mean rate is reserved
from the KV lane, since those bytes cross the link too.

Not modelled: a prefill forward's extra is fixed when its compute starts (a decode step is re-timed
whenever the flows on its GPUs' CNICs change, `Link.watchers`); the nodes of an EP group are not
held in lockstep with each other (each node steps at its own batch); two-micro-batch overlap
[S-V3P] would hide part of the extra behind compute, so it is an upper bound.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Optional, Sequence

from ..costmodel.ep_traffic import MOE_SHAPES, decode_bytes_per_token, prefill_bytes_per_token
from ..core.lanes import Lane
from .links import Link, Network
from .state import Node

_LC = Lane.LATENCY_CRITICAL


class EpComm:
    def __init__(self, net: Network, links: list[tuple[Link, Link]], bytes_per_token: float, ignores_kv: bool) -> None:
        self.net = net
        self.links = links  # each GPU's CNIC (out, in)
        self.bytes_per_token = bytes_per_token
        self.ignores_kv = ignores_kv
        self.booked_bytes = 0.0  # per direction, all GPUs
        self.gpu_extra_s = [0.0] * len(self.links)
        self._max_extra_s = 0.0  # max(gpu_extra_s), kept with it
        self._no_tokens: list[float] = [0] * len(self.links)  # `reserve(None, ...)`: every GPU released

    def watch(self, on_change: Callable[[int], None]) -> None:
        """Call `on_change(gpu)` whenever the flows on one of that GPU's CNIC directions change (one
        watcher per GPU on both directions: a flow across both tells it once, links.py `_notify`)."""
        if self.ignores_kv:
            return
        for k, (out, inn) in enumerate(self.links):
            watcher = partial(on_change, k)
            out.watchers.append(watcher)
            inn.watchers.append(watcher)

    def extra_s(self, tokens_per_gpu: Sequence[float]) -> float:
        """Seconds the slowest GPU's bursts take now beyond their unloaded time (each GPU's kept
        for `gpu_changed`)."""
        if self.ignores_kv:
            return 0.0
        gpu_extra = self.gpu_extra_s
        links = self.links
        k = 0
        for n in tokens_per_gpu:
            extra = 0.0
            if n:  # `_gpu_extra_s`'s test of idle links inlined: most GPUs' CNICs are idle at a step
                out, inn = links[k]
                out_flows, in_flows = out.flows, inn.flows
                if out_flows[1] or in_flows[1] or out.kv_flood or out_flows[0] or in_flows[0]:
                    extra = self._gpu_extra_s(k, n)
            gpu_extra[k] = extra
            k += 1
        self._max_extra_s = worst = max(gpu_extra)
        return worst

    def gpu_changed(self, gpu: int, tokens: float) -> float:
        """`extra_s` after the flows of one GPU's CNIC changed (the others' kept)."""
        extra = self._gpu_extra_s(gpu, tokens) if tokens else 0.0
        gpu_extra = self.gpu_extra_s
        if extra == gpu_extra[gpu]:  # unchanged (the common case: another flow on a loaded link): so is the max
            return self._max_extra_s
        gpu_extra[gpu] = extra
        self._max_extra_s = worst = max(gpu_extra)
        return worst

    def _gpu_extra_s(self, gpu: int, tokens: float) -> float:
        out, inn = self.links[gpu]
        out_flows, in_flows = out.flows, inn.flows
        if not (out_flows[1] or in_flows[1] or out.kv_flood or out_flows[0] or in_flows[0]):
            return 0.0  # a link with no flow gives a burst its whole capacity
        b = tokens * self.bytes_per_token
        r_out, r_in = out.lc_burst_rate(), inn.lc_burst_rate()
        return b / (r_in if r_in < r_out else r_out) - b / out.capacity_bytes_per_s  # min(r_out, r_in)

    def book(self, tokens_per_gpu: Sequence[float], repeats: float) -> None:
        """The bursts of `repeats` steps (or one forward) in every GPU's CNIC ledger."""
        bpt = self.bytes_per_token * repeats
        book = self.net.book
        for (out, inn), n in zip(self.links, tokens_per_gpu):
            if n:
                b = n * bpt
                book(out, Lane.LATENCY_CRITICAL, b)
                book(inn, Lane.LATENCY_CRITICAL, b)
                self.booked_bytes += b

    def book_one(self, gpu: int, tokens: float) -> None:
        """The bursts of `tokens` on one GPU (a decode request's steps, booked when it joins)."""
        if tokens > 0:
            out, inn = self.links[gpu]
            b = tokens * self.bytes_per_token
            book = self.net.book
            book(out, _LC, b)
            book(inn, _LC, b)
            self.booked_bytes += b

    def reserve(self, tokens_per_gpu: Optional[Sequence[float]], duration_s: float) -> None:
        """Hold the bursts' mean rate off the KV lane of each GPU's CNIC (None: release it)."""
        if self.ignores_kv:
            return
        reserve = self.net.reserve_lc
        bpt = self.bytes_per_token
        timed = duration_s > 0
        tokens = self._no_tokens if tokens_per_gpu is None else tokens_per_gpu
        for (out, inn), n in zip(self.links, tokens):
            rate = n * bpt / duration_s if n and timed else 0.0
            # Network.reserve_lc's own shortcuts, inlined (a hot loop): an unchanged rate, no KV flow to re-rate
            if rate != out.lc_reserved_bytes_per_s:
                if out.flows[1]:
                    reserve(out, rate)
                else:
                    out.lc_reserved_bytes_per_s = rate
            if rate != inn.lc_reserved_bytes_per_s:
                if inn.flows[1]:
                    reserve(inn, rate)
                else:
                    inn.lc_reserved_bytes_per_s = rate


def ep_comm_for(cfg, net: Network, node: Node, prefill: bool) -> Optional[EpComm]:
    """The node's EP traffic on its CNICs, or None: a dense model, the `local` preset, an EP group
    inside one node (NVLink only), or `ep_over_cnic` off."""
    cl = cfg.cluster
    shape = MOE_SHAPES.get(cl.model)
    if shape is None:
        return None
    nodes = cl.prefill_ep_nodes if prefill else cl.decode_ep_nodes  # the EP group's, ClusterConfig
    if not (cl.ep_over_cnic and cl.expert_parallel) or cfg.local is not None or nodes < 2:
        return None
    per_token = prefill_bytes_per_token(shape, nodes) if prefill else decode_bytes_per_token(shape, nodes)
    return EpComm(net, [(e.cnic_out, e.cnic_in) for e in node.engines], per_token, cl.ep_ignores_kv)
