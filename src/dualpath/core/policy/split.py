"""Split reads: one request's hit read on both sides at once, so that both parts finish together
(beyond the paper: docs/paper.md §3.4 and §7 item 1 leave it as future work).

The paper reads a request's whole hit on one side, the node with the shorter read queue
(read_side.py). With its PE and DE known, a hit of n blocks can instead be cut in two: the PE side
reads the first k blocks (storage -> PE node's SNIC -> PE buffer, docs/paper.md §1.3 (a)), the DE
side the other n - k (storage -> DE node's SNIC -> DE buffer, then layer by layer over the DE's
CNIC to the PE, §1.3 (b)). The forward can start once both parts are in, so the request waits
for the later of the two. The rule, per request, once the read side is chosen and the hit is to
be read (not recomputed):

  1. Below `min_blocks` blocks the hit is not split: it goes wholly to the side read_side.py
     chose (the shorter queue), as in the paper.
  2. Each side's finishing time, if it reads j more blocks after its queue:
         T_pe(k) = (q_pe + k blocks) * s_pe             s_pe = KV bytes per token / PE read rate
         T_de(k) = (q_de + (n - k) blocks) * s_de        s_de = KV bytes per token / DE read rate
                                                              + KV bytes per token / stream rate
     q_pe and q_de are the tokens already queued on each node's SNIC, as the scheduler sees them
     (`ClusterView.read_queue_tokens`, plus what this pass already sent there). The DE side pays
     one more hop per byte, the layer stream from the DE buffer over the DE node's CNICs to the
     PE (§1.3 (b) steps 3-5); it overlaps compute, so it is charged at the DE node's aggregate
     CNIC rate, small beside the SNIC's, rather than as a second serial read.
  3. T_pe rises and T_de falls with k. k0 is the largest k in [0, n] with T_pe(k) <= T_de(k);
     k is k0 or k0 + 1, whichever finishes later by less (ties: k0 + 1, more on the PE side,
     whose path needs no CNIC hop). Then the two finishing times differ by at most one block's
     time on one side, and more queue on a side never gives it more blocks.

Which blocks go where: the PE side reads the prefix, the DE side the suffix. The PE's part is then
itself a prefix hit, read exactly as the PE path reads a shorter hit today (a chained-hash prefix,
core/blocks.py), and the DE's part, the newest blocks, lands in the DE buffer where the miss KV
joins it and where the PE's part arrives with the prefill's PD transfer. In the simulator every
block costs the same, so the order changes no time; it fixes what the runtime half will read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..snapshot import ReadSide

# A split read is two reads: two store requests, two buffer reservations, a stream from the DE on
# top of the PE's loopback. Below 8 blocks the most it can save is half the hit's own read, four
# block-times (~0.2 ms for DS-V3.2's 2.6 MB Full Block at 50 GB/s, docs/paper.md §1.5 and §8),
# the order of a store request's own overhead; a project choice, not the paper's.
MIN_SPLIT_BLOCKS = 8


@dataclass(frozen=True, slots=True)
class SplitRule:
    """What the rule needs of the cluster, chosen once per run (rates per direction)."""

    block_tokens: int  # tokens per Full Block, the unit of a read (docs/paper.md §1.5)
    kv_bytes_per_token: int
    pe_read_bytes_per_s: float  # a PE node's read rate: min(SNIC, storage read)
    de_read_bytes_per_s: float  # a DE node's read rate
    de_stream_bytes_per_s: float  # a DE node's CNICs together, the DE part's layer stream to the PE
    min_blocks: int = MIN_SPLIT_BLOCKS  # below it a hit is not split (step 1)

    def __post_init__(self) -> None:
        if self.block_tokens <= 0 or self.kv_bytes_per_token <= 0 or self.min_blocks < 2:
            raise ValueError("split reads need positive block tokens and KV bytes, and min_blocks >= 2")
        if min(self.pe_read_bytes_per_s, self.de_read_bytes_per_s, self.de_stream_bytes_per_s) <= 0:
            raise ValueError("split reads need positive read and stream rates")

    @property
    def pe_s_per_token(self) -> float:
        return self.kv_bytes_per_token / self.pe_read_bytes_per_s

    @property
    def de_s_per_token(self) -> float:
        return self.kv_bytes_per_token / self.de_read_bytes_per_s + self.kv_bytes_per_token / self.de_stream_bytes_per_s


def finish_times_s(rule: SplitRule, pe_tokens: int, de_tokens: int, pe_queue_tokens: int,
                   de_queue_tokens: int) -> tuple[float, float]:
    """(PE side, DE side): seconds until each side has read its queue and its part (step 2)."""
    return ((pe_queue_tokens + pe_tokens) * rule.pe_s_per_token, (de_queue_tokens + de_tokens) * rule.de_s_per_token)


def split_read(rule: SplitRule, hit_tokens: int, pe_queue_tokens: int, de_queue_tokens: int,
               whole_side: ReadSide) -> int:
    """Hit tokens the PE side reads (a prefix of whole blocks); the DE side reads the rest. A hit
    under `min_blocks` blocks goes wholly to `whole_side`. See the module docstring."""
    if hit_tokens < 0 or pe_queue_tokens < 0 or de_queue_tokens < 0:
        raise ValueError("hits and read queues are non-negative token counts")
    b = rule.block_tokens
    n = -(-hit_tokens // b)  # blocks; the last may be short (it stays in the DE's suffix unless k = n)
    if n < rule.min_blocks:
        return hit_tokens if whole_side is ReadSide.PREFILL else 0

    def pe_tokens(k: int) -> int:
        return min(hit_tokens, k * b)

    def gap_s(k: int) -> float:  # T_pe(k) - T_de(k), rising in k
        t_pe, t_de = finish_times_s(rule, pe_tokens(k), hit_tokens - pe_tokens(k), pe_queue_tokens, de_queue_tokens)
        return t_pe - t_de

    lo, hi = -1, n  # the largest k with gap <= 0, by bisection: gap(lo) <= 0 < gap(hi + 1) holds for lo, hi + 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if gap_s(mid) <= 0:
            lo = mid
        else:
            hi = mid - 1
    k0 = lo
    if k0 < 0:
        return 0  # even all on the DE side finishes after the PE side's queue alone
    if k0 >= n:
        return hit_tokens
    t_de_k0 = finish_times_s(rule, 0, hit_tokens - pe_tokens(k0), pe_queue_tokens, de_queue_tokens)[1]
    t_pe_k1 = finish_times_s(rule, pe_tokens(k0 + 1), 0, pe_queue_tokens, de_queue_tokens)[0]
    return pe_tokens(k0 + 1) if t_pe_k1 <= t_de_k0 else pe_tokens(k0)
