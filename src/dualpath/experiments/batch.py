"""Batches of simulations an experiment knows up front, run on the context's executor.

`prefetch(ctx, specs)` hands the specs that are neither in memory nor in DIR/cache to a parallel
executor (a Ray cluster) at once; each result lands in the memo and the disk cache under the key
`simulate` uses (simrun._cache_key), with a progress line as it finishes. The experiment then
reads them with `simulate` as before. On the serial executor it does nothing: every simulation
runs where the experiment asks for it, in the same order as before batches existed.

`simulate_many(ctx, specs)` is prefetch + the results in order: for adaptive experiments that
choose the next runs from the last (fig10_11's bisection steps, in lock step over its searches).

Where a simulation runs never changes its numbers (the simulator is deterministic); only the
wall-time fields of its result differ (`wall_s`, `turns_per_wall_s`, `policy_wall_s`).
"""

from __future__ import annotations

from typing import Any, Sequence

from .common import Context
from .simrun import SimSpec, _cache_key, load_cached, run_spec, simulate, store_result


def prefetch(ctx: Context, specs: Sequence[SimSpec]) -> int:
    """Run the missing `specs` as one batch on a parallel executor; the number it ran."""
    if not ctx.executor.parallel:
        return 0
    todo: dict[str, SimSpec] = {}
    for spec in specs:
        key = _cache_key(spec, ctx.seed)
        if key in ctx.memo or key in todo:
            continue
        cached = load_cached(ctx, spec, key)
        if cached is not None:
            ctx.memo[key] = cached
        else:
            todo[key] = spec
    # the longest first (the work grows with the agents and their MaxLen): a batch on N workers then
    # ends soon after its longest call, instead of starting it last (longest processing time first)
    keys = sorted(todo, key=lambda k: -todo[k].num_agents * todo[k].max_len_tokens)
    batch = [todo[k] for k in keys]
    done = 0

    def landed(i: int, result: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        store_result(ctx, keys[i], result)
        ctx.memo[keys[i]] = result
        ctx.progress.sim_finished(batch[i].label(), result["wall_s"], done, len(batch))

    if batch:
        ctx.executor.map(run_spec, [(spec, ctx.seed) for spec in batch], landed)
    return len(batch)


def simulate_many(ctx: Context, specs: Sequence[SimSpec]) -> list[dict[str, Any]]:
    """`[simulate(ctx, s) for s in specs]`, the missing ones run as one batch first."""
    prefetch(ctx, specs)
    return [simulate(ctx, spec) for spec in specs]
