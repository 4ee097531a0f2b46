"""The running decode batch's K,V laid out as attention reads it, appended to step by step.

Without it, every decode step gathers every block of the batch, for every layer, into a padded
copy (`PagedKVCache(workspace=False)`): at SmolLM2, batch 8, 1K context and one CPU thread a
quarter of a step, the batch's whole KV copied each step (`dualpath bench model-speed --profile`).

The workspace gives each decoding sequence a row: its positions back to back, per layer, in the
Layer Block layout ([num_layers, rows, capacity, 2, G, D]), with room to grow. A step writes each
sequence's one new position (beside its block: the blocks stay the truth that persists,
transfers and forks read) and attention reads a view of the rows' first L positions. When the
batch changes, only what changed is copied: a sequence that joins is gathered from its blocks
into a free row; one that leaves (or is written, freed or added again outside a step, or whose
length is not the one its row expects) gives its row up, and the last row moves into the hole so
the rows in use stay 0..B-1. Attention runs in row order; the batch's order is restored around it
(`PagedKVCache.attend`: a permutation of the queries and outputs, [B, H, D] each).

The price is memory: while a sequence decodes its KV is held twice (its blocks and its row), as
a dense cache holds it once, and every row is as long as the longest. The rows never hold more
positions than the block pool (`fits`: rows x capacity <= num_blocks x block_tokens), so memory
at most doubles: a step whose batch would need more reads by the gather instead. A GPU engine reads blocks in place with a paged-attention kernel
instead; torch has none, so on CUDA `workspace=False` keeps HBM to the blocks alone.

Invariant (`PagedKVCache.check_invariants`): every row's first `lengths[row]` positions equal its
sequence's blocks, and the rows in use are exactly 0..len(rows)-1.
"""

from __future__ import annotations

from typing import Sequence

import torch

# spare positions past the longest sequence when the rows grow, in blocks (project choice: a
# growth copies every row once; SmolLM2 fp32 holds 46 KB per position over its 30 layers)
GROW_BLOCKS = 4


class DecodeWorkspace:
    def __init__(self, kv_blocks: torch.Tensor) -> None:
        """Rows for the sequences decoding from `kv_blocks` ([num_blocks, layers, bt, 2, G, D],
        the cache's blocks); no memory until the first `sync`."""
        self.blocks = kv_blocks
        self.block_tokens = kv_blocks.shape[2]
        self.kv = kv_blocks.new_zeros((kv_blocks.shape[1], 0, 0, *kv_blocks.shape[3:]))
        self.row_of: dict[int, int] = {}  # sequence -> its row
        self.seq_of: list[int] = []  # row -> sequence, rows 0..len-1 in use
        self.lengths: list[int] = []  # row -> positions it holds
        self.gathered = 0  # sequences gathered from their blocks so far (joins and re-joins)

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def drop(self, seq_id: int) -> None:
        """The sequence gives its row up (the last row moves into it)."""
        row = self.row_of.pop(seq_id, None)
        if row is None:
            return
        last = len(self.seq_of) - 1
        if row != last:
            moved = self.seq_of[last]
            self.kv[:, row, : self.lengths[last]] = self.kv[:, last, : self.lengths[last]]
            self.seq_of[row], self.lengths[row], self.row_of[moved] = moved, self.lengths[last], row
        self.seq_of.pop()
        self.lengths.pop()

    def fits(self, rows: int, tokens: int) -> bool:
        """Whether `rows` rows of `tokens` positions fit the bound (the block pool's positions)."""
        return self._shape(rows, tokens) is not None

    def _shape(self, rows: int, tokens: int) -> tuple[int, int] | None:
        """(rows, positions) the workspace has after making room for this many, None past the
        bound. Room that exists is kept; growth adds up to GROW_BLOCKS spare blocks and keeps the
        rows it had, each only where the bound leaves room for it."""
        have_rows, have_tokens = self.kv.shape[1], self.kv.shape[2]
        if rows <= have_rows and tokens <= have_tokens:
            return have_rows, have_tokens
        bt, pool = self.block_tokens, self.blocks.shape[0] * self.block_tokens
        need = max(-(-tokens // bt) * bt, have_tokens)
        for new_rows in (max(rows, have_rows), rows):
            if new_rows * need <= pool:
                return new_rows, max(need, min(need + GROW_BLOCKS * bt, pool // new_rows // bt * bt))
        return None

    def sync(self, seq_ids: Sequence[int], positions: Sequence[int], tables: Sequence[Sequence[int]]) -> list[int]:
        """Rows for this step's batch (sequence i holds positions[i] tokens in blocks tables[i]) with
        room for its new token; returns each sequence's row. Copies only what changed."""
        wanted = dict(zip(seq_ids, positions))
        for seq in [s for s in self.seq_of if wanted.get(s) != self.lengths[self.row_of[s]]]:
            self.drop(seq)  # left the batch, or its length is not the one its row holds
        self._reserve(len(seq_ids), max(positions) + 1)
        for seq, n, table in zip(seq_ids, positions, tables):
            if seq not in self.row_of:
                self._gather(seq, n, table)
        for seq, n in wanted.items():
            self.lengths[self.row_of[seq]] = n + 1  # the step's token, written layer by layer
        return [self.row_of[s] for s in seq_ids]

    def _gather(self, seq_id: int, num_tokens: int, table: Sequence[int]) -> None:
        row = len(self.seq_of)
        self.row_of[seq_id] = row
        self.seq_of.append(seq_id)
        self.lengths.append(num_tokens)
        self.gathered += 1
        whole = -(-num_tokens // self.block_tokens)
        if whole == 0:
            return
        index = torch.tensor(table[:whole], dtype=torch.long, device=self.blocks.device)
        for layer in range(self.kv.shape[0]):  # one copy: block slices into a contiguous prefix of the row
            out = self.kv[layer, row, : whole * self.block_tokens].view(whole, self.block_tokens, *self.kv.shape[3:])
            torch.index_select(self.blocks[:, layer], 0, index, out=out)

    def _reserve(self, rows: int, tokens: int) -> None:
        """At least `rows` rows of `tokens` positions; when it changes shape, the rows in use are copied over."""
        shape = self._shape(rows, tokens)
        if shape is None:
            raise ValueError(f"{rows} rows of {tokens} positions exceed the workspace's bound (check `fits` first)")
        if shape == tuple(self.kv.shape[1:3]):
            return
        old, used = self.kv, len(self.seq_of)  # rows in use: at most `rows` (sync drops the others first)
        self.kv = old.new_zeros((old.shape[0], *shape, *old.shape[3:]))
        self.kv[:, :used, : old.shape[2]] = old[:, :used]

    def append(self, layer: int, rows: torch.Tensor, positions: torch.Tensor, kv_new: torch.Tensor) -> None:
        """Store one layer's new K,V (kv_new [B, 2, G, D]) at each sequence's row and position."""
        self.kv[layer, rows, positions] = kv_new.to(self.kv.dtype)

    def keys_values(self, layer: int, num_rows: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of rows 0..num_rows-1, first `num_tokens` positions: [rows, G, num_tokens, D] views."""
        kv = self.kv[layer, :num_rows, :num_tokens]  # [rows, L, 2, G, D]
        return kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
