"""Tensor parallelism over two ranks: every layer's MLP split the Megatron way.

SmolLM2-135M has 9 query heads and 3 KV heads, which do not split by 2, so the attention stays
whole on rank 0 and only the SwiGLU MLP is split: gate and up column-parallel (rank r keeps rows
[r*I/2, (r+1)*I/2) of each), down row-parallel (the same columns of w_down). Rank 0 (the engine)
keeps embedding, attention, KV cache, norms and lm_head; rank 1 (`tp_worker.py`) holds only its
MLP halves, no KV and no store.

Per layer of every forward (prefill, decode step, recompute), for the T tokens of the batch:
  1. broadcast of the MLP input xn [T, C] from rank 0 to rank 1;
  2. each rank computes its partial output [T, C] = down_r(silu(gate_r xn) * up_r xn);
  3. all_reduce (sum) of the partials: both hold the MLP output.
Two collectives per layer, as Megatron's two all-reduces, of T x C elements each. Before layer 0
rank 0 broadcasts a one-element header, T (0 = stop), so rank 1 knows the shapes to expect.

The collectives go through a c10d process group object (`ProcessGroupGloo` on the CPU; the same
`broadcast` / `allreduce` calls exist on `ProcessGroupNCCL`, the CUDA path, not wired yet: a CUDA
engine with tp=2 is refused in RuntimeConfig). Each rank binds its gloo sockets to an address of
its own (`TpPlacement`), so on the testbed the collectives cross the CNIC links and the kernel
can classify them by address (deploy/testbed/tp_hosts.py).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dualpath.runtime.model.llama import Llama

TP_SIZE = 2
ROOT_RANK = 0
# How long a collective may wait for the other rank. An idle engine's rank 1 waits for the next
# forward's header for as long as the engine idles, so this is not a liveness bound: a rank that
# dies closes its sockets and the other side's collective fails at once (tested). 30 days:
# project choice, longer than any run.
TP_COLLECTIVE_TIMEOUT_S = 30 * 86400.0
HEADER_DTYPE = torch.int64
STOP_TOKENS = 0  # a header of 0 tokens: rank 1 returns


@dataclass(frozen=True, slots=True)
class MlpShard:
    """One rank's half of one layer's SwiGLU MLP."""

    gate: torch.Tensor  # [I/2, C]
    up: torch.Tensor  # [I/2, C]
    down: torch.Tensor  # [C, I/2]

    def __call__(self, xn: torch.Tensor) -> torch.Tensor:
        """Partial MLP output [T, C] of normalised input xn [T, C]; the ranks' partials sum to the MLP."""
        return F.linear(F.silu(F.linear(xn, self.gate)) * F.linear(xn, self.up), self.down)


def check_splittable(intermediate_size: int) -> None:
    if intermediate_size % TP_SIZE:
        raise ValueError(f"intermediate_size {intermediate_size} does not split over {TP_SIZE} ranks")


@torch.no_grad()
def mlp_shards(model: Llama, rank: int) -> list[MlpShard]:
    """Rank `rank`'s halves of every layer's MLP, as contiguous tensors (copies: the model may be freed)."""
    check_splittable(model.config.intermediate_size)
    half = model.config.intermediate_size // TP_SIZE
    rows = slice(rank * half, (rank + 1) * half)
    return [MlpShard(b.w_gate.weight[rows].contiguous(), b.w_up.weight[rows].contiguous(),
                     b.w_down.weight[:, rows].contiguous()) for b in model.blocks]


def open_group(store: dist.Store, rank: int, host: str) -> dist.ProcessGroup:
    """The two ranks' gloo group, its sockets bound to `host` (this rank's own address)."""
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    opts._timeout = datetime.timedelta(seconds=TP_COLLECTIVE_TIMEOUT_S)
    return dist.ProcessGroupGloo(store, rank, TP_SIZE, opts)


class Collectives:
    """The two collectives on a process group, with the payload bytes they carried (tensor bytes
    per collective, as one rank sees them: not the algorithm's wire bytes, nor TCP headers)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.payload_bytes = 0
        self.num_collectives = 0

    def broadcast(self, tensor: torch.Tensor) -> None:
        """In place: rank 0's tensor into rank 1's."""
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = ROOT_RANK, 0
        self.group.broadcast([tensor], opts).wait()
        self._count(tensor)

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """In place: the sum over both ranks."""
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        self.group.allreduce([tensor], opts).wait()
        self._count(tensor)

    def _count(self, tensor: torch.Tensor) -> None:
        self.payload_bytes += tensor.numel() * tensor.element_size()
        self.num_collectives += 1


class LeaderMlp:
    """Rank 0's MLP hook of one layer (Block.mlp_hook): header (layer 0), broadcast, partial, all_reduce."""

    def __init__(self, layer: int, shard: MlpShard, collectives: Collectives) -> None:
        self.layer, self.shard, self.collectives = layer, shard, collectives

    def __call__(self, xn: torch.Tensor) -> torch.Tensor:
        shape = xn.shape
        flat = xn.reshape(-1, shape[-1]).contiguous()  # [T, C]: decode [B, C], prefill [T, C], forward [B, T, C]
        if self.layer == 0:
            self.collectives.broadcast(torch.tensor([flat.shape[0]], dtype=HEADER_DTYPE))
        self.collectives.broadcast(flat)
        partial = self.shard(flat)
        self.collectives.all_reduce(partial)
        return partial.view(shape)


def install_leader(model: Llama, collectives: Collectives) -> None:
    """Make `model` (rank 0) run every layer's MLP across both ranks."""
    for layer, (block, shard) in enumerate(zip(model.blocks, mlp_shards(model, ROOT_RANK))):
        block.mlp_hook = LeaderMlp(layer, shard, collectives)


def uninstall(model: Llama) -> None:
    """Back to the whole MLP on this process."""
    for block in model.blocks:
        block.mlp_hook = None


def stop_follower(collectives: Collectives) -> None:
    """Rank 0: tell rank 1 to return from `serve_follower`."""
    collectives.broadcast(torch.tensor([STOP_TOKENS], dtype=HEADER_DTYPE))


@torch.no_grad()
def serve_follower(shards: list[MlpShard], collectives: Collectives, hidden_size: int, dtype: torch.dtype) -> int:
    """Rank 1's loop: per forward a header, then per layer broadcast in, partial, all_reduce.
    Returns the number of forwards served once rank 0 sends the stop header."""
    forwards = 0
    while True:
        header = torch.zeros(1, dtype=HEADER_DTYPE)
        collectives.broadcast(header)
        num_tokens = int(header[0])
        if num_tokens == STOP_TOKENS:
            return forwards
        for shard in shards:
            xn = torch.empty(num_tokens, hidden_size, dtype=dtype)
            collectives.broadcast(xn)
            partial = shard(xn)
            collectives.all_reduce(partial)
        forwards += 1
