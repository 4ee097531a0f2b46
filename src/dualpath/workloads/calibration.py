"""Check (and refit) the generator against Table 2 (docs/paper.md §4.2).

    python -m dualpath.workloads.calibration                 # check: seed 7, 500 trajectories
    python -m dualpath.workloads.calibration --seed 3 --num 500
    python -m dualpath.workloads.calibration --fit           # refit CALIBRATED (slow: minutes)

The fit minimises the squared relative errors of the five Table 2 columns (turns, total,
context, per-trajectory append and gen) over the six `GeneratorParams` with Nelder-Mead in log
space, on one fixed set of draws (common random numbers) so the objective is smooth. The fitted
values are knobs of kind `fitted (Table 2)` (the comment above `generator.CALIBRATED`), listed with
every other calibration knob in `dualpath repro`'s report (experiments/knobs.py).
"""

from __future__ import annotations

import argparse
from dataclasses import astuple

import numpy as np

from dualpath.workloads.generator import (
    CALIBRATED,
    GeneratorParams,
    draw_normals,
    generate,
    max_turns_for,
    rounds_from_draws,
)
from dualpath.workloads.stats import stats_from_rounds, trajectory_stats

# docs/paper.md §4.2, Table 2: MaxLen -> (turns, total, context, append, gen), per-trajectory means.
TABLE2: dict[int, tuple[float, float, float, float, float]] = {
    32 * 1024: (60, 28_639, 17_183, 608, 148),
    48 * 1024: (106, 42_607, 25_120, 474, 172),
    64 * 1024: (157, 55_958, 32_721, 429, 176),
}
TABLE2_KEYS = (
    "mean_turns",
    "mean_total_tokens",
    "mean_context_tokens",
    "mean_append_tokens",
    "mean_output_tokens",
)


def check(seed: int, num_trajectories: int) -> list[str]:
    """One line per MaxLen: measured columns and their relative error to Table 2."""
    lines = []
    for max_len, target in TABLE2.items():
        trajs = generate(max_len, num_trajectories, seed)
        s = trajectory_stats(trajs)
        cols = [f"{s[k]:,.1f} ({(s[k] - t) / t:+.1%})" for k, t in zip(TABLE2_KEYS, target)]
        named = "  ".join(f"{k.removeprefix('mean_')}={c}" for k, c in zip(TABLE2_KEYS, cols))
        lines.append(
            f"{max_len // 1024}K  {named}"
            f"  request_append={s['request_mean_append_tokens']:.0f}"
            f"  request_gen={s['request_mean_output_tokens']:.0f}"
            f"  hit={s['prefix_hit_ratio']:.4f}"
        )
    return lines


def fit(max_len: int, num: int, seed: int, start: GeneratorParams, iters: int) -> GeneratorParams:
    draws = draw_normals(num, max_turns_for(max_len), np.random.default_rng(seed))
    target = np.array(TABLE2[max_len])

    def objective(log_params: np.ndarray) -> float:
        p = GeneratorParams(*np.exp(log_params).tolist())
        append, gen, num_turns = rounds_from_draws(p, max_len, draws)
        keep = np.arange(append.shape[1])[None, :] < num_turns[:, None]
        s = stats_from_rounds(append[keep], gen[keep], num_turns, block_tokens=64)
        got = np.array([s[k] for k in TABLE2_KEYS])
        return float((((got - target) / target) ** 2).sum())

    best = _nelder_mead(objective, np.log(astuple(start)), step=0.05, iters=iters)
    return GeneratorParams(*np.exp(best).tolist())


def _nelder_mead(f, x0: np.ndarray, step: float, iters: int) -> np.ndarray:
    pts = [x0] + [x0 + step * e for e in np.eye(len(x0))]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centre = np.mean(pts[:-1], axis=0)
        xr = 2 * centre - pts[-1]
        fr = f(xr)
        if fr < vals[0]:
            xe = 3 * centre - 2 * pts[-1]
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = (centre + pts[-1]) / 2
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [(p + pts[0]) / 2 for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[int(np.argmin(vals))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--num", type=int, default=500, help="trajectories per MaxLen")
    ap.add_argument("--fit", action="store_true", help="refit from CALIBRATED (slow)")
    ap.add_argument("--fit-num", type=int, default=12_000, help="trajectories in the fit sample")
    ap.add_argument("--fit-iters", type=int, default=150)
    args = ap.parse_args()
    if args.fit:
        for max_len in TABLE2:
            p = fit(max_len, args.fit_num, args.seed, CALIBRATED[max_len], args.fit_iters)
            print(f"{max_len}: {p}", flush=True)
    else:
        print("\n".join(check(args.seed, args.num)))


if __name__ == "__main__":
    main()
