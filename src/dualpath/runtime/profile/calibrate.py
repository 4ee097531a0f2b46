"""This machine's compute profile for a model: measured once, cached, read by the demo and `calibrate`.

The profile is the runtime's "profiled curve" (docs/paper.md §3.2, §3.5) written down: prefill step times
by (new tokens, cached tokens) and decode step times by (batch, context), measured with the model,
device and torch thread count an engine really uses, in a process pinned to a prefill engine's CPU
set. A least-squares fit over the grid gives

    prefill_s(n, c) = fixed_s + per_token_s * n + per_token_key_s * (n * c + n * (n + 1) / 2)
    decode_s(b, L)  = fixed_s + per_seq_s * b + per_ctx_s * L + per_seq_key_s * b * L

(the attention term counts the keys each new token sees, causal). A prefill forward attends item by
item (model/llama.py: `prefill_layer`), so its keys add up; a decode step gathers every sequence's
KV padded to the longest one, L (`decode_step`: [B, L] with a mask), so it is a function of the
batch and the longest context, bilinear: the term in L alone is the per-step work that grows with
the padded length whatever the batch (the mask, the gather's index). Without it the fit missed
the measured batch-1 steps by -19%..+9% (`dualpath calibrate` prints each step beside its fit). The file is JSON:

    {"schema": "dualpath.profile/3",
     "key": {"machine": ..., "model": <model fingerprint>, "device": ..., "threads": ...},
     "prefill": [{"tokens": n, "context_tokens": c, "seconds": t}, ...],
     "decode":  [{"tokens": batch, "context_tokens": c, "seconds": t}, ...],
     "prefill_fit": {...}, "decode_fit": {...}, "measured_at": ISO time, "wall_s": ...}

kept at `cache_dir()/profiles/<sha256 of the key>.json`. A file whose key differs (another model,
device or thread count) or that does not parse is measured again and replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Sequence

import numpy as np

PROFILE_SCHEMA = "dualpath.profile/3"  # /3: decode on a 3x3 grid, bilinear (an older file is measured again)
# (new tokens, cached tokens): the demo's turns compute ~64 new tokens over 0.2-2K cached ones and a
# first prompt of ~200; `fidelity`'s agents and trace slices send first prompts of up to ~500 tokens
# (fidelity/workloads.py). The corners bound the fit on both axes.
PREFILL_GRID = ((32, 0), (192, 0), (512, 0), (64, 512), (32, 1536), (128, 1536))
# (batch, longest context tokens): up to 8 sequences (the agents workload's 8 agents decoding
# together) of up to 2,048 tokens (fidelity/workloads.py: CPU_CONTEXT_TOKENS); a fit past its grid
# was 19% fast on the agents workload (`dualpath fidelity --workload agents`). A full 3x3 grid, so that the
# four bilinear terms are pinned by more points than terms on both axes.
DECODE_GRID = tuple((b, c) for b in (1, 4, 8) for c in (256, 1024, 2048))
DECODE_STEPS = 3
# the grid's warm points (a turn over cached tokens, as the demo's and the traces' turns are) that a
# reused profile is timed at again, to scale it to the machine's speed now (`check_speed`)
SPEED_CHECK_POINTS = ((64, 512), (32, 1536), (128, 1536))
# (batch, context) decode grid points `check_drift` times again for the decode engines' speed: a
# prefill check alone moved the decode prediction the wrong way on two held-out fidelity runs
# (docs/results.md: "Does the simulator predict the runtime?")
DECODE_CHECK_POINTS = ((1, 1024), (4, 1024), (8, 1024))
DRIFT_CHECK_REPEATS = 3  # each point timed this many times (each a best of two): the best of them counts


@dataclass(frozen=True, slots=True)
class ProfileKey:
    """What a profile is valid for: the same CPU (model name, count), model, device, threads."""

    machine: str
    model: str  # model fingerprint (architecture + weights identity)
    device: str
    threads: int

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class StepTime:
    tokens: int  # prefill: new tokens of the step; decode: sequences in the batch
    context_tokens: int  # prefill: cached tokens each new token attends to; decode: context per sequence
    seconds: float


@dataclass(frozen=True, slots=True)
class StepFit:
    """t = fixed_s + per_item_s * n + per_ctx_s * c + per_key_s * keys(n, c); units: s, s per token
    (or sequence), s per context token (decode: of the longest sequence; prefill: 0), s per
    (query, key) pair."""

    fixed_s: float
    per_item_s: float
    per_key_s: float
    per_ctx_s: float = 0.0

    def scaled(self, factor: float) -> "StepFit":
        return StepFit(self.fixed_s * factor, self.per_item_s * factor, self.per_key_s * factor, self.per_ctx_s * factor)


def best_time_s(fn, repeats: int = 2) -> float:
    """The best of `repeats` timed calls of `fn`, after one untimed warm-up call."""
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def prefill_keys(n: int, c: int) -> float:
    """(query, key) pairs of n new tokens over c cached ones, causal: token i sees c + i + 1 keys."""
    return n * c + n * (n + 1) / 2


def decode_keys(b: int, c: int) -> float:
    """(sequence, key) pairs of a decode step whose `b` sequences are padded to `c` tokens."""
    return b * c


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Least squares; a term whose coefficient comes out negative (noise on a small grid) is
    dropped and the rest refitted, so every prediction grows with each term."""
    active = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [a for a, v in zip(active, coef) if v < 0]
        if not negative or len(active) == 1:
            break
        active.remove(negative[-1])
    full = [0.0] * x.shape[1]
    for a, v in zip(active, coef):
        full[a] = max(0.0, float(v))
    return full


def fit_steps(points: Sequence[StepTime], keys) -> StepFit:
    """The three-term fit (fixed, per item, per key) of a prefill grid."""
    x = np.array([[1.0, p.tokens, keys(p.tokens, p.context_tokens)] for p in points])
    fixed, per_item, per_key = _nonnegative_lstsq(x, np.array([p.seconds for p in points]))
    return StepFit(fixed, per_item, per_key)


def fit_decode_steps(points: Sequence[StepTime]) -> StepFit:
    """The bilinear fit of a decode grid: fixed, per sequence, per context token, per key."""
    x = np.array([[1.0, p.tokens, p.context_tokens, decode_keys(p.tokens, p.context_tokens)] for p in points])
    fixed, per_seq, per_ctx, per_key = _nonnegative_lstsq(x, np.array([p.seconds for p in points]))
    return StepFit(fixed, per_seq, per_key, per_ctx)


@dataclass(frozen=True, slots=True)
class ComputeProfile:
    key: ProfileKey
    prefill: tuple[StepTime, ...]
    decode: tuple[StepTime, ...]
    prefill_fit: StepFit
    decode_fit: StepFit
    measured_at: str
    wall_s: float

    def prefill_s(self, new_tokens: int, cached_tokens: int) -> float:
        f = self.prefill_fit
        return f.fixed_s + f.per_item_s * new_tokens + f.per_key_s * prefill_keys(new_tokens, cached_tokens)

    def decode_step_s(self, batch: int, longest_context_tokens: int) -> float:
        f = self.decode_fit
        return (f.fixed_s + f.per_item_s * batch + f.per_ctx_s * longest_context_tokens
                + f.per_key_s * decode_keys(batch, longest_context_tokens))

    def scaled(self, factor: float) -> "ComputeProfile":
        """Every step `factor` times as long (the machine's speed now over when it was measured)."""
        step = lambda rows: tuple(StepTime(r.tokens, r.context_tokens, r.seconds * factor) for r in rows)
        return ComputeProfile(self.key, step(self.prefill), step(self.decode), self.prefill_fit.scaled(factor),
                              self.decode_fit.scaled(factor), self.measured_at, self.wall_s)

    def to_json(self) -> dict:
        return {"schema": PROFILE_SCHEMA, "key": asdict(self.key),
                "prefill": [asdict(p) for p in self.prefill], "decode": [asdict(p) for p in self.decode],
                "prefill_fit": asdict(self.prefill_fit), "decode_fit": asdict(self.decode_fit),
                "measured_at": self.measured_at, "wall_s": self.wall_s}

    @staticmethod
    def from_json(d: dict) -> "ComputeProfile":
        """Raises ValueError (or KeyError / TypeError) on anything but a well-formed profile."""
        if d.get("schema") != PROFILE_SCHEMA:
            raise ValueError(f"not a {PROFILE_SCHEMA} file")
        steps = lambda rows: tuple(StepTime(int(r["tokens"]), int(r["context_tokens"]), float(r["seconds"])) for r in rows)
        prefill, decode = steps(d["prefill"]), steps(d["decode"])
        if not prefill or not decode or any(p.seconds <= 0 for p in prefill + decode):
            raise ValueError("a profile needs positive step times")
        return ComputeProfile(ProfileKey(**d["key"]), prefill, decode, StepFit(**d["prefill_fit"]),
                              StepFit(**d["decode_fit"]), str(d["measured_at"]), float(d["wall_s"]))


def machine_id() -> str:
    """The CPU model and the number of CPUs this process may use (not the hostname: containers
    of one kind share a profile)."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} x{len(os.sched_getaffinity(0))} ({platform.machine()})"


def profile_path(key: ProfileKey) -> Path | None:
    from ..model.gguf_loader import cache_dir

    root = cache_dir()
    return None if root is None else root / "profiles" / f"{key.digest()}.json"


def read_cached(key: ProfileKey) -> ComputeProfile | None:
    path = profile_path(key)
    if path is None or not path.is_file():
        return None
    try:
        profile = ComputeProfile.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError):
        return None  # corrupt or of another schema: measured again
    return profile if profile.key == key else None


def write_cached(profile: ComputeProfile) -> Path | None:
    path = profile_path(profile.key)
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(profile.to_json(), indent=1))
    os.replace(tmp, path)  # atomic: a reader sees the old file or the new one
    return path


@dataclass(frozen=True, slots=True)
class Calibration:
    profile: ComputeProfile
    path: Path | None
    reused: bool  # read from the cache, not measured in this call
    # a reused profile, timed again at SPEED_CHECK_POINTS: median of (now / cached); the profile
    # above is already scaled by it (1.0: measured in this call, or not checked)
    speed_now_over_cached: float = 1.0


def load_or_measure(model: str, fingerprint: str, device: str, threads: int, cpus: Sequence[int] | None = None,
                    force: bool = False) -> Calibration:
    """The cached profile for (this machine, the model with `fingerprint`, device, threads), or a
    fresh measurement in a process pinned to `cpus` (a prefill engine's CPU set)."""
    key = ProfileKey(machine_id(), fingerprint, device, threads)
    if not force and (cached := read_cached(key)) is not None:
        return Calibration(cached, profile_path(key), True)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        profile = pool.submit(measure_profile, model, device, threads, tuple(cpus or ()), key).result()
    return Calibration(profile, write_cached(profile), False)


def check_speed(calibration: Calibration, model: str, cpus: Sequence[int] | None = None) -> Calibration:
    """A reused profile at this machine's speed now: its warm grid points timed again (in a process
    pinned like the measurement's) and every step scaled by the median ratio. A profile cached on a
    quiet machine would otherwise derive the demo's rates for a machine faster than the loaded one
    that runs it: the tiny demo lost its effect under 4 CPU hogs with a quiet machine's profile, and kept it
    with one measured under the same load (four `while :; do :; done` loops, then `dualpath demo --model tiny`)."""
    if not calibration.reused:
        return calibration
    profile = calibration.profile
    k = profile.key
    points = tuple((p.tokens, p.context_tokens) for p in profile.prefill if (p.tokens, p.context_tokens) in SPEED_CHECK_POINTS)
    if not points:
        return calibration
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        now = pool.submit(time_prefills, model, k.device, k.threads, tuple(cpus or ()), points).result()
    factor = _now_over_cached(points, now, {(p.tokens, p.context_tokens): p.seconds for p in profile.prefill})
    return Calibration(profile.scaled(factor), calibration.path, True, factor)


def _now_over_cached(points: Sequence[tuple[int, int]], timed: Sequence[float], cached: dict) -> float:
    """The median over `points` of (the best of each point's times now) / its cached time; `timed`
    holds the points' times in order, repeated any number of times. 1.0 without points."""
    if not points:
        return 1.0
    best = [min(timed[i::len(points)]) for i in range(len(points))]
    return float(np.median([t / cached[pt] for pt, t in zip(points, best)]))


def check_drift(calibration: Calibration, model: str, cpus: Sequence[int] | None = None) -> tuple[float, float]:
    """(prefill, decode): the machine's speed now over the profile's, per role: the median over the
    role's check points of now / cached, each point timed DRIFT_CHECK_REPEATS times in one process
    pinned like the measurement's (fidelity/calibration.py: DriftCheck). 1.0 for a role whose
    points the profile lacks."""
    profile, k = calibration.profile, calibration.profile.key
    pre = {(p.tokens, p.context_tokens): p.seconds for p in profile.prefill}
    dec = {(p.tokens, p.context_tokens): p.seconds for p in profile.decode}
    pre_pts = [pt for pt in SPEED_CHECK_POINTS if pt in pre]
    dec_pts = [pt for pt in DECODE_CHECK_POINTS if pt in dec]
    n = DRIFT_CHECK_REPEATS
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        now = pool.submit(_measure, model, k.device, k.threads, tuple(cpus or ()), pre_pts * n, dec_pts * n).result()
    return _now_over_cached(pre_pts, now.prefill, pre), _now_over_cached(dec_pts, now.decode, dec)


def time_prefills(model: str, device: str, threads: int, cpus: tuple[int, ...],
                  points: Sequence[tuple[int, int]]) -> list[float]:
    """Best-of-two prefill times of (new, cached) tokens, as `measure_profile` times them."""
    return list(_measure(model, device, threads, cpus, points, ()).prefill)


def measure_profile(model: str, device: str, threads: int, cpus: tuple[int, ...], key: ProfileKey) -> ComputeProfile:
    """Time the grid (best of two after a warm-up); runs in its own process."""
    t_start = time.perf_counter()
    m = _measure(model, device, threads, cpus, PREFILL_GRID, DECODE_GRID)
    pre = tuple(StepTime(n, c, t) for (n, c), t in zip(PREFILL_GRID, m.prefill))
    dec = tuple(StepTime(b, c, t) for (b, c), t in zip(DECODE_GRID, m.decode))
    return ComputeProfile(key, pre, dec, fit_steps(pre, prefill_keys), fit_decode_steps(dec),
                          datetime.now(timezone.utc).isoformat(timespec="seconds"), time.perf_counter() - t_start)


@dataclass(frozen=True, slots=True)
class _Timings:
    prefill: tuple[float, ...]  # s per prefill step, in the order of the points asked for
    decode: tuple[float, ...]  # s per decode step


def _measure(model: str, device: str, threads: int, cpus: tuple[int, ...],
             prefill_points: Sequence[tuple[int, int]], decode_points: Sequence[tuple[int, int]]) -> _Timings:
    import torch

    from ..model import LayerKV, PagedKVCache, load_model

    if cpus:
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(threads)
    m = load_model(model, device=device).model
    cfg = m.config
    g = torch.Generator().manual_seed(0)
    shape = (cfg.num_kv_heads, cfg.head_dim)

    def ids(n: int) -> list[int]:
        return torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()

    def prefill(n: int, c: int) -> float:
        # cached K,V values do not change the time: random ones stand in for a real prefix
        kv = None if c == 0 else [[LayerKV(torch.randn(c, 2, *shape, generator=g).to(m.device, m.dtype))]
                                  for _ in range(cfg.num_layers)]
        tokens = ids(n)
        return best_time_s(lambda: m.prefill([(c, tokens)], kv))

    def decode(b: int, c: int) -> float:
        cache = PagedKVCache(cfg, num_blocks=b * (-(-(c + DECODE_STEPS + 2) // 64) + 1), block_tokens=64, device=m.device)
        for s in range(b):
            cache.add_sequence(s, c)
        last = ids(b)

        def steps() -> None:
            for _ in range(DECODE_STEPS):
                m.decode_step(cache, list(range(b)), last)

        return best_time_s(steps, repeats=1) / DECODE_STEPS

    with torch.no_grad():
        prefill(16, 0)  # warm-up
        return _Timings(tuple(prefill(n, c) for n, c in prefill_points), tuple(decode(b, c) for b, c in decode_points))
