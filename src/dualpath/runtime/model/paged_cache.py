"""Paged KV cache for decode with continuous batching.

Storage is one tensor `kv` of shape [num_blocks, num_layers, block_tokens, 2, num_kv_heads, head_dim]:
every cache block is a Full Block (num_layers Layer Blocks back to back, core/blocks.py), so a
full block can be persisted or shipped as bytes without reshaping (`full_block`).

A sequence has a block table: token position p lives in block table[p // block_tokens] at
offset p % block_tokens. `fork` starts a sequence from another's tokens (the `n` choices of one
prompt): the child shares the parent's full blocks, which no one writes again, and gets its own
copy of the partly filled last block, so every write lands in a block of one sequence only.

Conservation law (checked by `check_invariants`):
    a block's reference count is the number of block tables holding it; a block is free exactly
    when its count is 0, so num_free_blocks + distinct blocks held == num_blocks;
    a sequence of n tokens holds exactly ceil(n / block_tokens) blocks, and a block held by more
    than one sequence is full in each of them.

Lifecycle of a sequence: add_sequence (or load_prompt, or fork) -> prepare_decode, once per step,
which reserves the new token's slot -> free (its blocks return when no other sequence holds them).
Failed allocations raise `OutOfBlocksError` and change nothing.

A decode step's attention (`attend`) reads the batch's K,V through one of two strategies, chosen
in the constructor: a `DecodeWorkspace` (decode_workspace.py: each decoding sequence's K,V kept
dense in a row and appended to; a sequence that joins is gathered from its blocks once; the
default) or a gather of every block of the batch each step (`workspace=False`: no second copy of
the batch's KV). Both give attention the same values. Bytes written straight into `kv` (an
engine's H2D copy of a prompt) must go to sequences outside the running batch, as they do: a
sequence joins the batch after its prompt is in, and joining gathers its row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

from dualpath.runtime.model.config import LlamaConfig
from dualpath.runtime.model.decode_workspace import DecodeWorkspace
from dualpath.runtime.model.kv_layout import Buffer, LayerKV, layer_kv_from_bytes


class OutOfBlocksError(RuntimeError):
    """The cache has too few free blocks for the request; nothing was allocated."""


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """Where one decode step writes and reads, built once per step and used by every layer.

    B sequences; M = the most blocks any of them holds after this step's token; L = the longest
    sequence's positions after this step's token. Positions past a shorter sequence's length are
    padding, masked out (`read_mask`); padded table entries point at block 0.
    """

    seq_ids: tuple[int, ...]
    positions: torch.Tensor  # [B] position of the new token (= tokens before this step)
    write_blocks: torch.Tensor  # [B] block that receives the new token's K,V
    write_offsets: torch.Tensor  # [B] offset inside that block
    read_blocks: torch.Tensor  # [B, M] block tables, padded
    read_mask: torch.Tensor  # [B, L] True where the key position exists
    rows: torch.Tensor | None  # [B] each sequence's workspace row (None: gather the blocks)
    attn_mask: torch.Tensor  # [B, 1, 1, L] additive (0 or -inf), in row order (batch order without rows)

    @property
    def read_tokens(self) -> int:
        return self.read_mask.shape[1]


class PagedKVCache:
    def __init__(
        self,
        config: LlamaConfig,
        num_blocks: int,
        block_tokens: int = 64,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        workspace: bool = True,
    ) -> None:
        if num_blocks <= 0 or block_tokens <= 0:
            raise ValueError("num_blocks and block_tokens must be positive")
        self.config = config
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        # zeros, not empty: masked-out keys of a decode step are read and must be finite
        shape = (num_blocks, config.num_layers, block_tokens, 2, config.num_kv_heads, config.head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self._tables: dict[int, list[int]] = {}
        self._num_tokens: dict[int, int] = {}
        self._refs = [0] * num_blocks  # block -> how many block tables hold it
        self._workspace = DecodeWorkspace(self.kv) if workspace else None

    # ---- bookkeeping -------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.kv.device

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the decode workspace's rows, the second copy of decoding sequences' K,V (0 without one)."""
        return 0 if self._workspace is None else self._workspace.nbytes

    def _touched(self, seq_id: int) -> None:
        """A sequence's table or data changed other than by a decode step: its workspace row goes."""
        if self._workspace is not None:
            self._workspace.drop(seq_id)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def seq_ids(self) -> tuple[int, ...]:
        return tuple(self._tables)

    def num_tokens(self, seq_id: int) -> int:
        return self._num_tokens[seq_id]

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        return tuple(self._tables[seq_id])

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def _extra_blocks(self, seq_id: int, num_new_tokens: int) -> int:
        n = self._num_tokens[seq_id]
        return self.blocks_for_tokens(n + num_new_tokens) - len(self._tables[seq_id])

    def add_sequence(self, seq_id: int, num_tokens: int = 0) -> None:
        """Register a sequence with room for `num_tokens` tokens (their K,V are written later)."""
        if seq_id in self._tables:
            raise KeyError(f"sequence {seq_id} is already in the cache")
        if num_tokens < 0:
            raise ValueError("num_tokens must be >= 0")
        self._require_free_blocks(self.blocks_for_tokens(num_tokens))  # raises before any change
        self._touched(seq_id)
        self._tables[seq_id] = []
        self._num_tokens[seq_id] = 0
        self.extend(seq_id, num_tokens)

    def _require_free_blocks(self, num_blocks: int) -> None:
        if num_blocks > len(self._free):
            raise OutOfBlocksError(f"need {num_blocks} blocks, {len(self._free)} free of {self.num_blocks}")

    def extend(self, seq_id: int, num_tokens: int) -> None:
        """Grow a sequence by `num_tokens` positions, allocating blocks as needed."""
        if num_tokens < 0:
            raise ValueError("num_tokens must be >= 0")
        extra = self._extra_blocks(seq_id, num_tokens)
        self._require_free_blocks(extra)
        table = self._tables[seq_id]
        for _ in range(extra):
            block = self._free.pop()
            self._refs[block] = 1
            table.append(block)
        self._num_tokens[seq_id] += num_tokens

    def fork(self, parent: int, child: int) -> None:
        """A new sequence `child` with `parent`'s tokens: the full blocks shared (no copy), the
        partly filled last block copied (the child's next tokens go there)."""
        if child in self._tables:
            raise KeyError(f"sequence {child} is already in the cache")
        n, table = self._num_tokens[parent], self._tables[parent]
        full = n // self.block_tokens
        self._require_free_blocks(len(table) - full)  # raises before any change
        shared = table[:full]
        for block in shared:
            self._refs[block] += 1
        self._tables[child], self._num_tokens[child] = list(shared), full * self.block_tokens
        self.extend(child, n - full * self.block_tokens)
        if len(table) > full:
            self.kv[self._tables[child][-1]] = self.kv[table[-1]]

    def shared_blocks(self, seq_id: int) -> int:
        """How many of the sequence's blocks another sequence holds too."""
        return sum(self._refs[b] > 1 for b in self._tables[seq_id])

    def free(self, seq_id: int) -> int:
        """Let a sequence go; the number of blocks that became free (shared ones stay held)."""
        self._touched(seq_id)
        table = self._tables.pop(seq_id)
        del self._num_tokens[seq_id]
        freed = 0
        for block in reversed(table):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free.append(block)
                freed += 1
        return freed

    def check_invariants(self) -> None:
        held: dict[int, int] = {}
        for table in self._tables.values():
            for b in table:
                held[b] = held.get(b, 0) + 1
        if any(self._refs[b] != count for b, count in held.items()) or sum(self._refs) != sum(held.values()):
            raise AssertionError("a block's reference count is not the number of tables holding it")
        if len(held) + len(self._free) != self.num_blocks or sorted([*held, *self._free]) != list(range(self.num_blocks)):
            raise AssertionError("a block is both held and free, free twice, neither, or out of range")
        if self._tables.keys() != self._num_tokens.keys():
            raise AssertionError("block tables and token counts disagree on the sequences")
        for seq_id, table in self._tables.items():
            n = self._num_tokens[seq_id]
            if n < 0 or len(table) != self.blocks_for_tokens(n):
                raise AssertionError(f"sequence {seq_id}: {n} tokens in {len(table)} blocks")
            if any(self._refs[b] > 1 for b in table[n // self.block_tokens:]):
                raise AssertionError(f"sequence {seq_id}: a shared block is not full (it would be written)")
        ws = self._workspace
        if ws is not None:
            if sorted(ws.row_of.values()) != list(range(len(ws.seq_of))) or any(ws.row_of[s] != r for r, s in enumerate(ws.seq_of)):
                raise AssertionError("the workspace's rows in use are not 0..n-1, one per sequence")
            for row, (seq_id, n) in enumerate(zip(ws.seq_of, ws.lengths)):
                if self._num_tokens.get(seq_id, -1) < n:
                    raise AssertionError(f"the workspace holds {n} positions of sequence {seq_id}, the cache fewer")
                blocks, offsets = self._slots(seq_id, 0, n)
                if not torch.equal(ws.kv[:, row, :n], self.kv[blocks, :, offsets].transpose(0, 1)):
                    raise AssertionError(f"the workspace's K,V of sequence {seq_id} differ from its blocks")

    # ---- data ------------------------------------------------------------------------------

    def _slots(self, seq_id: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(block, offset) of positions [start, stop) of a sequence (half-open)."""
        if not 0 <= start <= stop <= self._num_tokens[seq_id]:
            n = self._num_tokens[seq_id]
            raise IndexError(f"positions [{start}, {stop}) outside sequence {seq_id} of {n} tokens")
        table = torch.tensor(self._tables[seq_id], dtype=torch.long, device=self.device)
        pos = torch.arange(start, stop, device=self.device)
        return table[pos // self.block_tokens], pos % self.block_tokens

    def write(self, seq_id: int, layer: int, start: int, layer_kv: LayerKV) -> None:
        """Write K,V of positions [start, start + n) of one layer (positions must be reserved, in
        blocks no other sequence holds)."""
        stop = start + layer_kv.num_tokens
        table = self._tables[seq_id][start // self.block_tokens : self.blocks_for_tokens(stop)]
        if any(self._refs[b] > 1 for b in table):
            raise ValueError(f"positions [{start}, {stop}) of sequence {seq_id} are in a block another sequence holds")
        self._touched(seq_id)
        blocks, offsets = self._slots(seq_id, start, stop)
        self.kv[blocks, layer, offsets] = layer_kv.kv.to(self.kv.device, self.kv.dtype)

    def read(self, seq_id: int, layer: int, start: int = 0, stop: int | None = None) -> LayerKV:
        """K,V of positions [start, stop) of one layer (a gather copy)."""
        stop = self._num_tokens[seq_id] if stop is None else stop
        blocks, offsets = self._slots(seq_id, start, stop)
        return LayerKV(self.kv[blocks, layer, offsets])

    def load_prompt(self, seq_id: int, layer_kvs: Sequence[LayerKV]) -> None:
        """Add a sequence holding a prompt's K,V, given per layer (e.g. from layerwise prefill, or
        from Layer Block bytes through `kv_layout.layer_kv_from_bytes`)."""
        if len(layer_kvs) != self.config.num_layers:
            raise ValueError(f"need K,V for {self.config.num_layers} layers, got {len(layer_kvs)}")
        num_tokens = layer_kvs[0].num_tokens
        if any(lkv.num_tokens != num_tokens for lkv in layer_kvs):
            raise ValueError("every layer must hold the same number of tokens")
        self.add_sequence(seq_id, num_tokens)
        for layer, lkv in enumerate(layer_kvs):
            self.write(seq_id, layer, 0, lkv)

    def load_prompt_bytes(self, seq_id: int, layer_bytes: Sequence[Buffer | torch.Tensor]) -> None:
        """As `load_prompt`, from each layer's Layer Block bytes (all of the prompt's tokens, in order)."""
        self.load_prompt(seq_id, [layer_kv_from_bytes(b, self.config, self.kv.dtype, self.device) for b in layer_bytes])

    def full_block(self, block_id: int) -> torch.Tensor:
        """Block `block_id` as a Full Block [num_layers, block_tokens, 2, kvh, hd] (a view)."""
        return self.kv[block_id]

    # ---- decode ----------------------------------------------------------------------------

    def prepare_decode(self, seq_ids: Iterable[int]) -> DecodeBatch:
        """Reserve one new position per sequence and build the step's read/write indices."""
        seq_ids = tuple(seq_ids)
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"duplicate sequence ids in one decode step: {seq_ids}")
        missing = [s for s in seq_ids if s not in self._tables]
        if missing:
            raise KeyError(f"sequences not in the cache: {missing}")
        self._require_free_blocks(sum(self._extra_blocks(s, 1) for s in seq_ids))
        positions = [self._num_tokens[s] for s in seq_ids]
        for s in seq_ids:
            self.extend(s, 1)
        tables = [self._tables[s] for s in seq_ids]
        width = max(len(t) for t in tables)
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=self.device)
        pos_new = torch.tensor(positions, dtype=torch.long, device=self.device)  # [B]
        read_mask = torch.arange(max(positions) + 1, device=self.device)[None, :] <= pos_new[:, None]  # [B, L]
        rows = None
        if self._workspace is not None and self._workspace.fits(len(seq_ids), max(positions) + 1):
            rows = torch.tensor(self._workspace.sync(seq_ids, positions, tables), dtype=torch.long, device=self.device)
        in_row_order = read_mask if rows is None else torch.empty_like(read_mask).index_copy_(0, rows, read_mask)
        return DecodeBatch(
            seq_ids=seq_ids,
            positions=pos_new,
            write_blocks=table.gather(1, (pos_new // self.block_tokens)[:, None]).squeeze(1),
            write_offsets=pos_new % self.block_tokens,
            read_blocks=table,
            read_mask=read_mask,
            rows=rows,
            attn_mask=torch.zeros(in_row_order.shape, dtype=self.kv.dtype, device=self.device)
            .masked_fill_(~in_row_order, float("-inf"))[:, None, None, :],
        )

    def write_decode(self, batch: DecodeBatch, layer: int, kv_new: torch.Tensor) -> None:
        """Store the step's new K,V of one layer: kv_new [B, 2, kvh, hd]."""
        self.kv[batch.write_blocks, layer, batch.write_offsets] = kv_new.to(self.kv.dtype)
        if batch.rows is not None:
            self._workspace.append(layer, batch.rows, batch.positions, kv_new)

    def attend(self, batch: DecodeBatch, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of the step's queries q [B, kvh, R, hd] (the R query heads sharing a KV head as R
        "query positions" of it) over each sequence's positions so far: [B, kvh, R, hd]."""
        k, v = self.gather_decode(batch, layer)
        mask = batch.attn_mask.to(q.dtype)
        if batch.rows is None:
            return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask)
        out = F.scaled_dot_product_attention(torch.empty_like(q).index_copy_(0, batch.rows, q), k.to(q.dtype),
                                             v.to(q.dtype), attn_mask=mask)  # in row order
        return out.index_select(0, batch.rows)

    def gather_decode(self, batch: DecodeBatch, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the first L positions: [B, kvh, L, hd] each (padded, see read_mask), in the
        batch's order when gathered, in row order from the workspace (`batch.rows`)."""
        if batch.rows is not None:
            return self._workspace.keys_values(layer, len(batch.seq_ids), batch.read_tokens)
        b, m = batch.read_blocks.shape
        blocks = self.kv.select(1, layer).index_select(0, batch.read_blocks.flatten())  # [B*M, bt, 2, kvh, hd]
        kv = blocks.view(b, m * self.block_tokens, *blocks.shape[2:])[:, : batch.read_tokens]  # [B, L, 2, kvh, hd]
        return kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
