"""`dualpath bench model-speed`: our model's prefill and decode against transformers'
`LlamaForCausalLM` on the same weights, machine and torch threads, in paired repeats.

Each repeat times, one after the other (the order alternating between repeats): our prefill of
one prompt, transformers' prefill of it (twice: its forward as `model(ids)` runs it, logits of
every position, and as its `generate` runs it, `logits_to_keep=1`: the last position's only, as
ours), our decode of `decode_tokens` steps of a batch of
`batch` copies of that prompt with the decode workspace (the default) and with every block
gathered each step (`workspace=False`), and transformers' decode of the same batch from its own
dense cache. A repeat's ratios compare runs seconds apart; the report gives each ratio's median
over the repeats with its min and max. The prompt's KV is computed once and copied into a fresh
cache for every decode run (ours: `load_prompt`; theirs: the prefill's cache repeated over the
batch), so a decode run times the steps alone.

`profile=True` adds torch.profiler's top operators (self CPU time per step) of our prefill and
of one decode step under each strategy: where the time goes.
"""

from __future__ import annotations

import copy
import inspect
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

PROFILE_TOP_OPS = 6  # operators listed per profiled run (project choice: the rest is < 2% of a step here)


@torch.no_grad()
def model_speed(model_name: str = "smollm2-135m", prompt_tokens: int = 1024, decode_tokens: int = 32,
                batch: int = 8, threads: int = 1, repeats: int = 5, profile: bool = False,
                device: str = "cpu") -> dict[str, Any]:
    """`device`: where both models run (CUDA is synchronised before each clock read)."""
    from ..runtime.model import load_model

    torch.set_num_threads(threads)
    loaded = load_model(model_name, device=device)
    ours = loaded.model
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(16, ours.config.vocab_size, (prompt_tokens,), generator=g).tolist()
    kv = [layer[0] for layer in ours.prefill([(0, ids)]).new_kv]  # the prompt's KV, per layer
    runs: dict[str, Callable[[], float]] = {
        "ours_prefill": lambda: _timed(lambda: ours.prefill([(0, ids)])),
        "ours_decode": lambda: _our_decode(ours, kv, ids[-1], batch, decode_tokens, workspace=True),
        "ours_gather_decode": lambda: _our_decode(ours, kv, ids[-1], batch, decode_tokens, workspace=False),
    }
    theirs = _transformers_runs(loaded, ids, batch, decode_tokens, device)  # or why there are none
    if not isinstance(theirs, str):
        runs.update(theirs)
    for run in runs.values():
        run()  # warm-up, untimed
    pairs: list[dict[str, float]] = []
    for i in range(repeats):
        names = list(runs) if i % 2 == 0 else list(reversed(runs))
        pairs.append({name: runs[name]() for name in names})
    result: dict[str, Any] = {
        "model": model_name, "device": device, "threads": threads, "prompt_tokens": prompt_tokens, "decode_batch": batch,
        "decode_tokens": decode_tokens, "repeats": repeats, "torch": torch.__version__,
        "transformers": theirs if isinstance(theirs, str) else _transformers_version(),
        "seconds": pairs, "summary": _summary(pairs, prompt_tokens, batch * decode_tokens),
    }
    if profile:
        result["profile"] = _profile(ours, ids, kv, batch)
    if profile and device == "cpu":  # the profile's CPU times are the GEMMs' own only on the CPU
        mm_s = sum(o["ms"] for o in result["profile"]["prefill"] if o["op"] in ("aten::mm", "aten::addmm")) / 1e3
        result["prefill_gemm_gflop_per_s"] = _prefill_gemm_flops(ours.config, prompt_tokens) / mm_s / 1e9
        result["plain_gemm_gflop_per_s"] = _plain_gemm_gflop_per_s(prompt_tokens, ours.config, device)
    return result


def _prefill_gemm_flops(cfg: Any, tokens: int) -> float:
    """Multiply-adds x 2 of a prefill's projections and MLPs (every layer, every token) and of the
    last token's logits."""
    c, h, g, d, i = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    per_layer = c * h * d + c * 2 * g * d + h * d * c + 3 * c * i
    return 2.0 * (tokens * per_layer * cfg.num_layers + c * cfg.vocab_size)


def _plain_gemm_gflop_per_s(tokens: int, cfg: Any, device: str) -> float:
    """The machine's rate at one plain GEMM of the MLP's shape ([tokens, C] x [C, I]), best of 5."""
    a = torch.randn(tokens, cfg.hidden_size, device=device)
    b = torch.randn(cfg.hidden_size, cfg.intermediate_size, device=device)
    _timed(lambda: a @ b)  # warm-up
    best = min(_timed(lambda: a @ b) for _ in range(5))
    return 2.0 * tokens * cfg.hidden_size * cfg.intermediate_size / best / 1e9


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _timed(fn: Callable[[], Any]) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _our_decode(model: Any, kv: list, last_token: int, batch: int, steps: int, workspace: bool) -> float:
    """Seconds of `steps` decode steps of `batch` copies of the prompt (cache filled untimed)."""
    cache = _filled_cache(model, kv, batch, steps, workspace)
    seqs, last = list(range(batch)), [last_token] * batch
    return _timed(lambda: [model.decode_step(cache, seqs, last) for _ in range(steps)])


def _filled_cache(model: Any, kv: list, batch: int, steps: int, workspace: bool) -> Any:
    from ..runtime.model import PagedKVCache

    bt = 64
    cache = PagedKVCache(model.config, num_blocks=batch * (-(-(kv[0].num_tokens + steps) // bt) + 1), block_tokens=bt,
                         workspace=workspace, device=model.device)
    for s in range(batch):
        cache.load_prompt(s, kv)
    return cache


def _transformers_runs(loaded: Any, ids: list[int], batch: int, steps: int,
                       device: str) -> dict[str, Callable[[], float]] | str:
    """transformers' prefill and decode runs on our model's weights (written as a Hugging Face
    folder and loaded by transformers itself), or why there are none."""
    try:
        from transformers import LlamaForCausalLM
    except ImportError:
        return "not installed"
    from ..runtime.model import save_hf_folder

    with tempfile.TemporaryDirectory() as folder:
        save_hf_folder(loaded, folder)
        hf = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    x = torch.tensor([ids], device=device)
    # the cache's keyword: `cache` from transformers 5.x, `past_key_values` before (and deprecated since)
    key = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    first = hf(x, use_cache=True)
    prompt_cache = first[key]  # one prompt's; each decode run repeats a copy over the batch
    token = first.logits[:, -1:].argmax(-1).repeat(batch, 1)

    def decode() -> float:
        past = copy.deepcopy(prompt_cache)
        past.batch_repeat_interleave(batch)

        def steps_() -> None:
            nonlocal past
            tok = token
            for _ in range(steps):
                out = hf(tok, use_cache=True, **{key: past})
                past, tok = out[key], out.logits[:, -1:].argmax(-1)

        return _timed(steps_)

    return {"transformers_prefill": lambda: _timed(lambda: hf(x, use_cache=True)),
            "transformers_prefill_last_logits": lambda: _timed(lambda: hf(x, use_cache=True, logits_to_keep=1)),
            "transformers_decode": decode}


# (ours, theirs) compared per repeat
COMPARISONS = (("ours_prefill", "transformers_prefill"), ("ours_prefill", "transformers_prefill_last_logits"),
               ("ours_decode", "transformers_decode"), ("ours_gather_decode", "transformers_decode"))


def _summary(pairs: list[dict[str, float]], prompt_tokens: int, decode_tokens: int) -> dict[str, Any]:
    """Each run's median tokens/s and, per comparison, ours over theirs speed per repeat (the same
    tokens, so their time over ours): median, min, max."""
    def tokens(name: str) -> int:
        return prompt_tokens if "prefill" in name else decode_tokens

    rates = {name: statistics.median(tokens(name) / p[name] for p in pairs) for name in pairs[0]}
    ratios = []
    for ours, theirs in COMPARISONS:
        if theirs in pairs[0]:
            r = [p[theirs] / p[ours] for p in pairs]
            ratios.append({"ours": ours, "theirs": theirs, "median": statistics.median(r), "min": min(r), "max": max(r)})
    return {"tokens_per_s": rates, "ratios": ratios}


def _profile(model: Any, ids: list[int], kv: list, batch: int) -> dict[str, Any]:
    """Top operators by self CPU time: our prefill, and one decode step under each strategy (the
    mean of 4 steps after the first, which builds the workspace)."""
    from torch.profiler import ProfilerActivity, profile

    def top(fn: Callable[[], Any], per: int) -> list[dict[str, Any]]:
        with profile(activities=[ProfilerActivity.CPU]) as p:
            fn()
        events = sorted(p.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total_us = sum(e.self_cpu_time_total for e in events)
        return [{"op": e.key, "ms": e.self_cpu_time_total / 1e3 / per, "share": e.self_cpu_time_total / total_us}
                for e in events[:PROFILE_TOP_OPS]]

    result: dict[str, Any] = {"prefill": top(lambda: model.prefill([(0, ids)]), 1)}
    for name, workspace in (("decode_step", True), ("gather_decode_step", False)):
        cache = _filled_cache(model, kv, batch, 5, workspace)
        seqs, last = list(range(batch)), [ids[-1]] * batch
        model.decode_step(cache, seqs, last)
        result[name] = top(lambda: [model.decode_step(cache, seqs, last) for _ in range(4)], 4)
    return result


def plot_model_speed(r: dict[str, Any], path: Path) -> None:
    """Ours over transformers per comparison (median bar, min-max whisker)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = r["summary"]["ratios"]
    fig, ax = plt.subplots(figsize=(8, 4))
    med = [c["median"] for c in cells]
    ax.bar(range(len(cells)), med, yerr=[[m - c["min"] for m, c in zip(med, cells)],
                                         [c["max"] - m for m, c in zip(med, cells)]], capsize=4)
    ax.set_xticks(range(len(cells)), [f"{c['ours']}\nover {c['theirs']}".replace("_", " ") for c in cells], fontsize=7)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("ours / transformers speed (median of repeats, min-max)")
    ax.set_title(f"{r['model']}, {r['threads']} thread(s): {r['prompt_tokens']}-token prompt, "
                 f"decode batch {r['decode_batch']} x {r['decode_tokens']} steps, {r['repeats']} repeats", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
