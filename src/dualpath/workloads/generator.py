"""Synthetic coding-agent trajectories calibrated to Table 2 (docs/paper.md §4.2).

Model (per trajectory k; LN(m, s) = lognormal with median m and log-sd s):

1. First round: append P0_k ~ LN(first_prompt_median, 0.5), capped at MaxLen / 4 (task prompt,
   repository context and error messages; the cap is the harness's prompt budget and keeps the
   first round inside the window under Fig. 9's x3 append scaling).
2. Later rounds: append a_k * LN(e^{-1/2}, 1.0), i.e. heavy-tailed tool output around a
   per-trajectory rate a_k ~ LN(append_rate_median, append_rate_sigma). Trajectories with large
   tool outputs fill the window sooner, so turn count and append size correlate negatively.
3. Every round generates max(1, g_k * LN(e^{-0.18}, 0.6)) tokens, capped at MaxLen / 8, with
   g_k ~ LN(gen_rate_median, 0.25).
4. The agent would stop by itself after N_k ~ LN(stop_median, stop_sigma) rounds (at least 1;
   at most 1000, the harness's round limit, scaled up with MaxLen above 64K).
5. The trajectory is cut at MaxLen: the longest prefix of rounds whose final length fits.

Counts are rounded to the nearest integer. The four per-trajectory draws are quasi-random
(shifted Halton) over the set, so a 500-trajectory set matches its targets for any seed.

Why not i.i.d. rounds: docs/paper.md §4.2's caveat. Table 2's Append and Gen are per-trajectory
averages, inflated in short trajectories by the first prompt. This model matches all five
columns. `python -m dualpath.workloads.calibration` prints (seed 7, 500 trajectories; "per
round" averages over all rounds of all trajectories; hit = `stats` prefix_hit_ratio, 64-token
blocks):

    MaxLen | turns  total   context | append gen (per traj.) | append gen (per round) | hit
    32K    | 60.2   28,739  17,257  | 630    148.7           | 333    145             | 0.981
    48K    | 106.1  42,565  25,157  | 487    172.4           | 234    168             | 0.991
    64K    | 156.2  55,792  32,631  | 453    176.5           | 185    172             | 0.994

Over seeds 0-29 turns, total and context stay within 1.6% of Table 2 and per-trajectory gen
within 2.4%; per-trajectory append scatters more (s.d. 3-6%, up to 15% at 64K) because a few
short trajectories with huge tool outputs dominate it. On 12,000 trajectories all five columns
are within 0.4%. About 71% / 67% / 58% of trajectories end by hitting MaxLen (the rest stop by
themselves), and the first-prompt cap binds for 26% / 16% / 12%.

Other MaxLens: between anchors each parameter is interpolated piecewise linearly in MaxLen
(medians geometrically); outside [32K, 64K] the nearest anchor is used with first_prompt_median
and stop_median scaled by MaxLen / anchor, so trajectories keep their shape relative to the
window. MaxLen must be in [4K, 256K].

More agents than the base set (docs/paper.md §4.2): agents 0..base_set_size-1 are the base set;
agent k >= base_set_size copies a base trajectory drawn with the seed and prepends a synthetic
round of `extra_prefix_tokens` random tokens (default 64 = one block, so no two agents share a
full block) with g = 1, then is cut at MaxLen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from statistics import NormalDist

import numpy as np

from dualpath.core.request import TurnSpec
from dualpath.errors import InputError
from dualpath.workloads._checks import require_int, require_positive_float
from dualpath.workloads.trajectory import Trajectory

MIN_MAX_LEN_TOKENS = 4 * 1024  # below this the scaled first prompt is one tool output long
MAX_MAX_LEN_TOKENS = 256 * 1024
BASE_SET_SIZE = 500  # docs/paper.md §4.2: each dataset holds 500 trajectories
# choice: one 64-token block (docs/paper.md §1.5) of random tokens as the synthetic first round of a
# reused trajectory (docs/paper.md §4.2 gives no length): makes every extra agent's prefix unique.
EXTRA_PREFIX_TOKENS = 64

# choice: fixed shape parameters (not fitted: Table 2 gives means only, docs/paper.md §4.2 [NF]).
FIRST_PROMPT_SIGMA = 0.5
FIRST_PROMPT_CAP_FRACTION = 0.25
APPEND_TURN_SIGMA = 1.0
GEN_RATE_SIGMA = 0.25
GEN_TURN_SIGMA = 0.6
GEN_CAP_FRACTION = 0.125
MAX_TURNS_UP_TO_64K = 1000  # choice: the harness's round limit up to 64K MaxLen (the paper gives none)
_ROWS_PER_CHUNK = 256  # bounds the (rows x max_turns) work arrays
_HALTON_BASES = (2, 3, 5, 7)  # one prime per latent


@dataclass(frozen=True, slots=True)
class GeneratorParams:
    """Calibrated parameters of one MaxLen (model in the module docstring)."""

    first_prompt_median_tokens: float
    append_rate_median_tokens: float
    append_rate_sigma: float
    gen_rate_median_tokens: float
    stop_median_turns: float
    stop_sigma: float


# fitted (Table 2): Nelder-Mead on the three Table 2 targets plus per-trajectory Append and Gen
# (12,000 trajectories, common random numbers, seed 7).
# Refit: python -m dualpath.workloads.calibration --fit
# Check (500 trajectories, seed 7):              python -m dualpath.workloads.calibration
CALIBRATED: dict[int, GeneratorParams] = {
    32 * 1024: GeneratorParams(5964.1, 251.34, 1.1391, 143.58, 122.90, 1.0350),
    48 * 1024: GeneratorParams(7498.7, 141.85, 1.3948, 166.89, 185.77, 0.92276),
    64 * 1024: GeneratorParams(9013.7, 86.705, 1.6946, 170.70, 220.37, 0.61551),
}
_SIGMA_FIELDS = frozenset({"append_rate_sigma", "stop_sigma"})


def params_for(max_len_tokens: int) -> GeneratorParams:
    """Parameters for any MaxLen in [MIN_MAX_LEN_TOKENS, MAX_MAX_LEN_TOKENS] (rules above)."""
    max_len_tokens = _check_max_len(max_len_tokens)
    if max_len_tokens in CALIBRATED:
        return CALIBRATED[max_len_tokens]
    anchors = sorted(CALIBRATED)
    if max_len_tokens < anchors[0] or max_len_tokens > anchors[-1]:
        anchor = anchors[0] if max_len_tokens < anchors[0] else anchors[-1]
        p, scale = CALIBRATED[anchor], max_len_tokens / anchor
        return GeneratorParams(
            p.first_prompt_median_tokens * scale, p.append_rate_median_tokens, p.append_rate_sigma,
            p.gen_rate_median_tokens, p.stop_median_turns * scale, p.stop_sigma,
        )
    hi = next(a for a in anchors if a > max_len_tokens)
    lo = anchors[anchors.index(hi) - 1]
    w = (max_len_tokens - lo) / (hi - lo)
    values = {}
    for f in fields(GeneratorParams):
        a, b = getattr(CALIBRATED[lo], f.name), getattr(CALIBRATED[hi], f.name)
        values[f.name] = a + w * (b - a) if f.name in _SIGMA_FIELDS else a * (b / a) ** w
    return GeneratorParams(**values)


def max_turns_for(max_len_tokens: int) -> int:
    return MAX_TURNS_UP_TO_64K * max(1, math.ceil(max_len_tokens / (64 * 1024)))


@dataclass(frozen=True, slots=True)
class TurnDraws:
    """Standard-normal draws behind a set of trajectories; fixed draws give common random numbers.

    `latent` is (4, n): first prompt, append rate, gen rate, natural stop (`stratified_normals`).
    `append` and `gen` are (n, max_turns): per-round noise.
    """

    latent: np.ndarray
    append: np.ndarray
    gen: np.ndarray


def draw_normals(num: int, max_turns: int, rng: np.random.Generator) -> TurnDraws:
    latent = stratified_normals(num, rng)
    append = rng.standard_normal((num, max_turns))
    return TurnDraws(latent, append, rng.standard_normal((num, max_turns)))


def stratified_normals(num: int, rng: np.random.Generator) -> np.ndarray:
    """(4, num) standard normals from a randomly shifted Halton sequence, in random order.

    Quasi-random points cover the 4-d latent space evenly (jointly, unlike independent Latin
    hypercube rows), which halves the seed-to-seed spread of a 500-set's Table 2 means. The
    random shift (Cranley-Patterson rotation) keeps each point's marginal uniform.
    """
    inv_cdf = NormalDist().inv_cdf
    index = np.arange(1, num + 1)
    order = rng.permutation(num)
    latent = np.empty((4, num))
    for row, base in enumerate(_HALTON_BASES):
        u = (_radical_inverse(index, base) + rng.random()) % 1.0
        u = np.clip(u, 2.0**-53, 1.0 - 2.0**-53)  # inv_cdf needs 0 < u < 1
        latent[row] = [inv_cdf(x) for x in u[order].tolist()]
    return latent


def _radical_inverse(index: np.ndarray, base: int) -> np.ndarray:
    """Van der Corput: the base-`base` digits of each index mirrored about the radix point."""
    out = np.zeros(len(index))
    rest = index.copy()
    scale = 1.0 / base
    while rest.any():
        out += scale * (rest % base)
        rest //= base
        scale /= base
    return out


def rounds_from_draws(
    p: GeneratorParams, max_len_tokens: int, d: TurnDraws
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(append, gen, num_turns): (n, max_turns) int arrays and the kept round count per row.

    Rows past num_turns[k] are meaningless. Pure: the calibration fit calls it with fixed draws.
    """
    max_turns = d.append.shape[1]
    first = np.minimum(
        np.exp(np.log(p.first_prompt_median_tokens) + FIRST_PROMPT_SIGMA * d.latent[0]),
        FIRST_PROMPT_CAP_FRACTION * max_len_tokens,
    )
    append_rate = np.exp(np.log(p.append_rate_median_tokens) + p.append_rate_sigma * d.latent[1])
    gen_rate = np.exp(np.log(p.gen_rate_median_tokens) + GEN_RATE_SIGMA * d.latent[2])
    natural = np.exp(np.log(p.stop_median_turns) + p.stop_sigma * d.latent[3])
    num_natural = np.clip(np.rint(natural), 1, max_turns).astype(np.int64)

    # Per-round noise has mean 1 so a_k and g_k are the trajectory's mean append and gen.
    append_noise = np.exp(APPEND_TURN_SIGMA * d.append - APPEND_TURN_SIGMA**2 / 2)
    append = np.rint(append_rate[:, None] * append_noise).astype(np.int64)
    append[:, 0] = np.rint(first).astype(np.int64)
    gen_noise = np.exp(GEN_TURN_SIGMA * d.gen - GEN_TURN_SIGMA**2 / 2)
    gen_cap = GEN_CAP_FRACTION * max_len_tokens
    gen = np.rint(np.minimum(gen_rate[:, None] * gen_noise, gen_cap)).astype(np.int64)
    gen = np.maximum(gen, 1)

    end = np.cumsum(append + gen, axis=1)
    num_fit = (end <= max_len_tokens).sum(axis=1)  # end grows, so this is the kept prefix
    num_turns = np.minimum(num_natural, num_fit)
    assert num_turns.min() >= 1, "the caps keep the first round inside MaxLen"
    return append, gen, num_turns


def generate_base_set(
    max_len_tokens: int, num_trajectories: int, seed: int
) -> tuple[Trajectory, ...]:
    """The base set: agents 0..num_trajectories-1, each already cut at MaxLen."""
    params = params_for(max_len_tokens)
    num_trajectories = require_int(num_trajectories, 1, "num_trajectories")
    seed = require_int(seed, 0, "seed")
    rng = np.random.default_rng(seed)
    max_turns = max_turns_for(max_len_tokens)
    trajs: list[Trajectory] = []
    # Latents are drawn for the whole set (stratification spans it); noise chunk by chunk.
    latent = stratified_normals(num_trajectories, rng)
    for start in range(0, num_trajectories, _ROWS_PER_CHUNK):
        rows = min(_ROWS_PER_CHUNK, num_trajectories - start)
        d = TurnDraws(
            latent[:, start : start + rows],
            rng.standard_normal((rows, max_turns)),
            rng.standard_normal((rows, max_turns)),
        )
        append, gen, num_turns = rounds_from_draws(params, max_len_tokens, d)
        for r in range(rows):
            n = int(num_turns[r])
            turns = tuple(map(TurnSpec, append[r, :n].tolist(), gen[r, :n].tolist()))
            trajs.append(Trajectory(start + r, turns))
    return tuple(trajs)


def generate(
    max_len_tokens: int,
    num_agents: int,
    seed: int,
    base_set_size: int = BASE_SET_SIZE,
    append_scale: float = 1.0,
    gen_scale: float = 1.0,
    extra_prefix_tokens: int = EXTRA_PREFIX_TOKENS,
) -> tuple[Trajectory, ...]:
    """`num_agents` trajectories (agent ids 0..num_agents-1); same arguments, same result.

    append_scale / gen_scale (docs/paper.md §6.2, Fig. 9): every base round's append (gen) is
    multiplied and rounded (gen stays >= 1), then the trajectory is cut at MaxLen again. The
    synthetic first round of extra agents is not scaled. The base set does not depend on
    num_agents, so the first base_set_size agents are the same for every agent count.
    """
    num_agents = require_int(num_agents, 1, "num_agents")
    seed = require_int(seed, 0, "seed")
    base_set_size = require_int(base_set_size, 1, "base_set_size")
    append_scale = require_positive_float(append_scale, "append_scale")
    gen_scale = require_positive_float(gen_scale, "gen_scale")
    extra_prefix_tokens = require_int(extra_prefix_tokens, 1, "extra_prefix_tokens")
    max_len_tokens = _check_max_len(max_len_tokens)
    base_seq, extra_seq = np.random.SeedSequence(seed).spawn(2)
    base_seed = int(base_seq.generate_state(1)[0])
    base = generate_base_set(max_len_tokens, base_set_size, base_seed)
    if append_scale == 1.0 and gen_scale == 1.0:
        return _with_extra_agents(base, num_agents, max_len_tokens, extra_seq, extra_prefix_tokens)
    # Only scaling can push a first round past MaxLen (the caps keep unscaled ones inside).
    try:
        base = tuple(_scaled(t, append_scale, gen_scale).truncate(max_len_tokens) for t in base)
        return _with_extra_agents(base, num_agents, max_len_tokens, extra_seq, extra_prefix_tokens)
    except InputError as e:
        raise InputError(f"{e}, after append_scale={append_scale} and gen_scale={gen_scale}") from None


def _with_extra_agents(
    base: tuple[Trajectory, ...],
    num_agents: int,
    max_len_tokens: int,
    seed_seq: np.random.SeedSequence,
    extra_prefix_tokens: int,
) -> tuple[Trajectory, ...]:
    """The first num_agents of the base set, then copies with a synthetic first round."""
    num_extra = num_agents - len(base)
    if num_extra <= 0:
        return base[:num_agents]
    sources = np.random.default_rng(seed_seq).integers(0, len(base), size=num_extra)
    synthetic = TurnSpec(extra_prefix_tokens, 1)
    extras = (
        Trajectory(k, (synthetic, *base[src].turns)).truncate(max_len_tokens)
        for k, src in zip(range(len(base), num_agents), sources.tolist())
    )
    return base + tuple(extras)


def _scaled(t: Trajectory, append_scale: float, gen_scale: float) -> Trajectory:
    turns = tuple(
        TurnSpec(round(x.append_tokens * append_scale), max(1, round(x.gen_tokens * gen_scale)))
        for x in t.turns
    )
    return Trajectory(t.agent, turns, t.arrival_s)


def _check_max_len(max_len_tokens: int) -> int:
    max_len_tokens = require_int(max_len_tokens, 1, "max_len_tokens")
    if not MIN_MAX_LEN_TOKENS <= max_len_tokens <= MAX_MAX_LEN_TOKENS:
        raise InputError(
            f"max_len_tokens must be in [{MIN_MAX_LEN_TOKENS}, {MAX_MAX_LEN_TOKENS}], "
            f"got {max_len_tokens}"
        )
    return max_len_tokens
