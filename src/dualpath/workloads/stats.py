"""Workload statistics in the terms of Table 2 (docs/paper.md §4.2), and format detection.

Definitions (trajectories). A trajectory's rounds are its requests; prompt_i = context_i +
append_i, where context_i is every earlier append and generation (what round i sends).

- `num_requests`: rounds over all trajectories; `num_agents`: trajectories.
- Table 2 columns are per-trajectory values averaged over trajectories (docs/paper.md §4.2 caveat):
  `mean_turns`; `mean_total_tokens` (final length: all appends + all gens);
  `mean_context_tokens` (the trajectory's mean prompt per round; prompt includes the append,
  as docs/paper.md §4.1's 98.7% = 1 - 429 / 32.7K implies); `mean_append_tokens` and
  `mean_output_tokens` (the trajectory's mean append and gen per round).
- Request-weighted (every round counts once): `mean_input_tokens` (prompt; the request-weighted
  counterpart of mean_context_tokens), `request_mean_append_tokens`, `request_mean_output_tokens`.
- `prefix_hit_ratio`: fraction of prompt full blocks (block_tokens each) already stored when the
  request arrives, with an unbounded cache. A block counts only with its whole prefix chain.
  Round i stores the full blocks of its prompt + generated tokens, so round i+1 of the same
  agent hits floor(end_i / block_tokens) blocks; agents never share blocks.

Mooncake traces (conversations inferred by `mooncake.infer_parents`; a request's parent is the
earlier request whose full 512-token blocks it starts with; requests are taken in timestamp
order): a conversation is a root request and its descendants, playing the trajectory's part.
- `mean_turns`: requests per conversation; `mean_total_tokens`: the conversation's largest
  input + output; `mean_context_tokens`: the conversation's mean input.
- A request's new tokens (its "append"): input - 512 * (parent's full blocks), the whole input
  for a root. This includes the parent's answer and the re-sent tail of its partial block, so
  it is larger than Table 2's Append would be. `mean_append_tokens` / `mean_output_tokens`
  average per conversation then over conversations; the `request_mean_*` variants per request.
- `prefix_hit_ratio` uses the trace's block ids rechunked to `block_tokens` (`Rechunker`);
  a request stores its prompt blocks (the trace has no ids for generated tokens); blocks are
  shared across conversations (for example the common system prompt).
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Sequence

import numpy as np

from dualpath.core.blocks import BLOCK_TOKENS_DEFAULT
from dualpath.errors import InputError
from dualpath.workloads._checks import require_int
from dualpath.workloads.agentic import read_agents
from dualpath.workloads.jsonl import WorkloadFormat, detect_format
from dualpath.workloads.mooncake import (
    MooncakeRecord,
    Rechunker,
    infer_parents,
    read_mooncake,
)
from dualpath.workloads.trajectory import Trajectory


def trajectory_stats(
    trajs: Sequence[Trajectory], block_tokens: int = BLOCK_TOKENS_DEFAULT
) -> dict[str, float]:
    """Table 2 style statistics of a trajectory set (definitions in the module docstring)."""
    block_tokens = require_int(block_tokens, 1, "block_tokens")
    if not trajs:
        raise InputError("no trajectories to summarise")
    num_turns = np.fromiter((t.num_turns for t in trajs), np.int64, count=len(trajs))
    total = int(num_turns.sum())
    append = np.fromiter((x.append_tokens for t in trajs for x in t.turns), np.int64, count=total)
    gen = np.fromiter((x.gen_tokens for t in trajs for x in t.turns), np.int64, count=total)
    stats = stats_from_rounds(append, gen, num_turns, block_tokens)
    waits = np.fromiter((x.wait_s for t in trajs for x in t.turns[1:]), np.float64, count=total - len(trajs))
    if waits.any():  # agents that wait for tools: the tool time between rounds (rounds after the first)
        stats["mean_tool_time_s"] = float(waits.mean())
        stats["median_tool_time_s"] = float(np.median(waits))
    return stats


def stats_from_rounds(
    append: np.ndarray, gen: np.ndarray, num_turns: np.ndarray, block_tokens: int
) -> dict[str, float]:
    """Statistics from flat per-round arrays; trajectory k owns the next num_turns[k] entries."""
    starts = np.concatenate(([0], np.cumsum(num_turns)[:-1]))
    step = append + gen
    cum = np.cumsum(step)
    # Sequence length after each round, restarted at every trajectory boundary.
    end = cum - np.repeat(cum[starts] - step[starts], num_turns)
    prompt = end - gen
    is_first = np.zeros(len(step), dtype=bool)
    is_first[starts] = True
    prev_end = np.where(is_first, 0, np.roll(end, 1))
    hit_blocks = prev_end // block_tokens
    prompt_blocks = prompt // block_tokens
    last = starts + num_turns - 1

    def per_traj_mean(values: np.ndarray) -> float:
        return float((np.add.reduceat(values, starts) / num_turns).mean())

    return {
        "num_requests": int(len(step)),
        "num_agents": int(len(num_turns)),
        "mean_turns": float(num_turns.mean()),
        "mean_input_tokens": float(prompt.mean()),
        "mean_append_tokens": per_traj_mean(append),
        "mean_output_tokens": per_traj_mean(gen),
        "mean_total_tokens": float(end[last].mean()),
        "mean_context_tokens": per_traj_mean(prompt),
        "request_mean_append_tokens": float(append.mean()),
        "request_mean_output_tokens": float(gen.mean()),
        "prefix_hit_ratio": _ratio(int(hit_blocks.sum()), int(prompt_blocks.sum())),
    }


def mooncake_stats(
    records: Sequence[MooncakeRecord], block_tokens: int = BLOCK_TOKENS_DEFAULT
) -> dict[str, float]:
    """Table 2 style statistics of a Mooncake trace (definitions in the module docstring)."""
    if not records:
        raise InputError("no requests to summarise")
    rechunker = Rechunker(block_tokens, records[0].block_tokens)
    recs = sorted(records, key=lambda r: r.timestamp_s)  # stable: file order breaks ties
    parents = infer_parents(recs)
    root = np.empty(len(recs), dtype=np.int64)
    new_tokens = np.empty(len(recs), dtype=np.int64)
    for i, (rec, p) in enumerate(zip(recs, parents)):
        root[i] = i if p is None else root[p]
        shared = 0 if p is None else recs[p].block_tokens * recs[p].num_full_blocks
        new_tokens[i] = rec.input_tokens - shared
    inputs = np.fromiter((r.input_tokens for r in recs), np.int64, count=len(recs))
    outputs = np.fromiter((r.output_tokens for r in recs), np.int64, count=len(recs))
    _, conv, turns = np.unique(root, return_inverse=True, return_counts=True)
    num_conv = len(turns)

    def per_conv_mean(values: np.ndarray) -> float:
        return float((np.bincount(conv, weights=values, minlength=num_conv) / turns).mean())

    conv_total = np.zeros(num_conv, dtype=np.int64)
    np.maximum.at(conv_total, conv, inputs + outputs)
    hits, blocks = _mooncake_hits(recs, rechunker)
    return {
        "num_requests": len(recs),
        "num_agents": num_conv,
        "mean_turns": float(turns.mean()),
        "mean_input_tokens": float(inputs.mean()),
        "mean_append_tokens": per_conv_mean(new_tokens),
        "mean_output_tokens": per_conv_mean(outputs),
        "mean_total_tokens": float(conv_total.mean()),
        "mean_context_tokens": per_conv_mean(inputs),
        "request_mean_append_tokens": float(new_tokens.mean()),
        "request_mean_output_tokens": float(outputs.mean()),
        "prefix_hit_ratio": _ratio(hits, blocks),
    }


def _mooncake_hits(recs: Sequence[MooncakeRecord], rechunker: Rechunker) -> tuple[int, int]:
    seen: set[int] = set()
    hits = blocks = 0
    for rec in recs:
        ids = rechunker.rechunk(rec)
        hits += seen_prefix_blocks(ids, seen)
        blocks += len(ids)
        seen.update(ids)
    return hits, blocks


def seen_prefix_blocks(ids: Sequence[int], seen: set[int]) -> int:
    """How many leading blocks of `ids` are in `seen`. `seen` holds whole prefix chains and ids are
    chained, so "ids[j] seen" is true for a prefix of j and false after it: a binary search instead
    of a per-block loop."""
    return bisect.bisect_left(range(len(ids)), True, key=lambda j: ids[j] not in seen)


def _ratio(num: int, den: int) -> float:
    # A workload whose prompts are all shorter than one block has nothing to hit: ratio 0.
    return num / den if den else 0.0


def load_any(path: str | Path) -> tuple[Trajectory, ...] | tuple[MooncakeRecord, ...]:
    """Read a trajectory JSONL, an agentic trace (its agents) or a Mooncake trace, whichever `path` holds."""
    if detect_format(path) is WorkloadFormat.MOONCAKE:
        return read_mooncake(path)
    return read_agents(path)


def workload_stats(
    items: Sequence[Trajectory] | Sequence[MooncakeRecord], block_tokens: int = BLOCK_TOKENS_DEFAULT
) -> dict[str, float]:
    """`trajectory_stats` or `mooncake_stats`, by the type of the items (as `load_any` returns)."""
    if items and isinstance(items[0], MooncakeRecord):
        return mooncake_stats(items, block_tokens)  # type: ignore[arg-type]
    return trajectory_stats(items, block_tokens)  # type: ignore[arg-type]
