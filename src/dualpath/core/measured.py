"""A machine described by measurement instead of by its datasheet: the simulator's `local` preset.

The runtime's compute profile (runtime/profile/calibrate.py: `dualpath calibrate`) fits an engine's
step times on this machine, with the model, device and thread count it really uses:

    prefill_s(n, c) = prefill_fixed_s + prefill_per_token_s * n + prefill_per_key_s * keys(n, c)
    decode_s(b, L)  = decode_fixed_s + decode_per_seq_s * b + decode_per_ctx_s * L + decode_per_key_s * b * L

keys(n, c) = n * c + n * (n + 1) / 2: the (query, key) pairs of n new tokens over c cached ones,
causal. A forward of several requests adds their tokens and keys (one fixed cost per forward);
a decode step pads its b sequences to the longest context L (runtime/model/llama.py: `decode_step`). The rest is what the runtime is configured with: the
compute quota's attention work (RuntimeConfig.engines.quota_attention_flops_per_s), a PE's landing zone,
a DE's KV-cache capacity. Nothing here is fitted to a run of the system it predicts.
"""

from __future__ import annotations

from dataclasses import dataclass

# How a PE measures its prompt-token rate, which beta derives from (docs/paper.md §3.2: the tokens a PE
# processes in beta_compute_s): one chunk of PROBE_NEW_TOKENS over PROBE_CACHED_TOKENS cached,
# timed at engine start (runtime/engine/prefill.py: `_profile`); the `local` preset takes the same
# point from the profile (`MeasuredMachine.probe_prompt_tokens_per_s`), so both worlds derive beta
# alike (the paper preset derives it from the workload's mean turn instead).
PROBE_CACHED_TOKENS = 2048
PROBE_NEW_TOKENS = 128


def causal_keys(new_tokens: int, cached_tokens: int) -> float:
    """(query, key) pairs of `new_tokens` over `cached_tokens` cached ones, causal."""
    n = new_tokens
    return n * cached_tokens + n * (n + 1) / 2


@dataclass(frozen=True, slots=True)
class StepGrid:
    """Decode step times measured on a full grid of (batch, longest context): a step between grid
    points interpolates bilinearly, beyond the grid it extrapolates the last segment linearly. The
    profile's bilinear least-squares fit missed its own grid points by up to 18% (its decode steps
    are not bilinear: the padded gather grows faster than the fit's terms allow), and which points
    it misses depends on the batch and context a workload runs at; the measured points themselves
    carry no such bias (`dualpath calibrate` prints both)."""

    batches: tuple[float, ...]  # ascending, at least two
    contexts: tuple[float, ...]  # ascending, at least two (tokens of the longest sequence)
    seconds: tuple[tuple[float, ...], ...]  # seconds[i][j]: batches[i] at contexts[j]

    @staticmethod
    def of(points: "list[tuple[float, float, float]]") -> "StepGrid":
        """From (batch, context, seconds) points that cover every pair of their batches and contexts."""
        batches, contexts = sorted({p[0] for p in points}), sorted({p[1] for p in points})
        at = {(p[0], p[1]): p[2] for p in points}
        missing = [(b, c) for b in batches for c in contexts if (b, c) not in at]
        if len(batches) < 2 or len(contexts) < 2 or missing:
            raise ValueError(f"decode steps must cover a grid of at least 2 x 2 points (missing {missing})")
        return StepGrid(tuple(batches), tuple(contexts), tuple(tuple(at[(b, c)] for c in contexts) for b in batches))

    def scaled(self, factor: float) -> "StepGrid":
        return StepGrid(self.batches, self.contexts, tuple(tuple(t * factor for t in row) for row in self.seconds))

    def step_s(self, batch: float, context_tokens: float) -> float:
        i, fb = _segment(self.batches, batch)
        j, fc = _segment(self.contexts, context_tokens)
        row = self.seconds
        lo = row[i][j] + (row[i][j + 1] - row[i][j]) * fc
        hi = row[i + 1][j] + (row[i + 1][j + 1] - row[i + 1][j]) * fc
        return max(0.0, lo + (hi - lo) * fb)


def _segment(xs: tuple[float, ...], x: float) -> tuple[int, float]:
    """The segment [xs[i], xs[i + 1]] that holds x (the first or last one beyond the ends) and x's
    position along it (outside [0, 1] beyond the ends: linear extrapolation)."""
    i = 0
    while i < len(xs) - 2 and x > xs[i + 1]:
        i += 1
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


@dataclass(frozen=True, slots=True)
class MeasuredMachine:
    prefill_fixed_s: float  # per forward
    prefill_per_token_s: float  # per new token
    prefill_per_key_s: float  # per (query, key) pair
    decode_fixed_s: float  # per step
    decode_per_seq_s: float  # per sequence in the step
    decode_per_key_s: float  # per (sequence, token of the longest context)
    quota_attention_flops_per_s: float  # the runtime's quota: compute_quota_s of attention at this rate
    attention_flops_per_key: float  # the model's attention FLOPs per (query, key) pair, all layers
    pe_landing_bytes: float  # a PE's landing zone ("HBM") for the batch's cached KV
    de_kv_tokens: int  # a DE's KV cache ("HBM") in tokens
    source: str  # where the numbers come from (profile file, measurement command)
    decode_per_ctx_s: float = 0.0  # per token of the longest context, whatever the batch
    decode_grid: StepGrid | None = None  # the measured decode steps: used instead of the fit when given
    # seconds every forward of a role takes beyond the profile's curve inside a running cluster
    # (fidelity/calibration.py measures them on calibration runs; 0: the curve alone)
    prefill_overhead_s: float = 0.0
    decode_overhead_s: float = 0.0
    # a decode step while its engine moves KV takes 1 + this times as long (sim/cpu_share.py)
    decode_io_slowdown: float = 0.0
    # seconds the first step of a request that joins the batch takes beyond the others (sim/decode.py)
    decode_join_s: float = 0.0

    def decode_step_s(self, batch: int, longest_context_tokens: float) -> float:
        if self.decode_grid is not None:
            curve = self.decode_grid.step_s(batch, longest_context_tokens)
        else:
            curve = (self.decode_fixed_s + self.decode_per_seq_s * batch + self.decode_per_ctx_s * longest_context_tokens
                     + self.decode_per_key_s * batch * longest_context_tokens)
        return curve + self.decode_overhead_s

    def __post_init__(self) -> None:
        for name in ("quota_attention_flops_per_s", "attention_flops_per_key", "pe_landing_bytes", "de_kv_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    def prefill_s(self, new_tokens: int, cached_tokens: int) -> float:
        return (self.prefill_fixed_s + self.prefill_per_token_s * new_tokens
                + self.prefill_per_key_s * causal_keys(new_tokens, cached_tokens))

    def probe_prompt_tokens_per_s(self) -> float:
        """Prompt tokens (cached + new) per second at the PE's start-up probe point."""
        return (PROBE_CACHED_TOKENS + PROBE_NEW_TOKENS) / self.prefill_s(PROBE_NEW_TOKENS, PROBE_CACHED_TOKENS)
