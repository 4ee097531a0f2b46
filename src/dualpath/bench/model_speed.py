"""Our model's prefill and decode tokens/s against transformers' LlamaForCausalLM on the same
weights, same machine, same torch thread count (for `dualpath bench storage-bound`)."""

from __future__ import annotations

import time
from typing import Any

import torch


@torch.no_grad()
def model_speed(model_name: str = "smollm2-135m", prompt_tokens: int = 1024, decode_tokens: int = 32,
                batch: int = 8, threads: int = 1) -> dict[str, Any]:
    from ..runtime.profile.calibrate import best_time_s
    from ..runtime.model import PagedKVCache, load_model

    torch.set_num_threads(threads)
    loaded = load_model(model_name)
    m = loaded.model
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(16, m.config.vocab_size, (prompt_tokens,), generator=g).tolist()
    ours_prefill = prompt_tokens / best_time_s(lambda: m.prefill([(0, ids)]))

    def decode() -> None:
        cache = PagedKVCache(m.config, num_blocks=batch * (-(-(prompt_tokens + decode_tokens) // 64) + 1), block_tokens=64)
        pre = m.prefill([(0, ids)])
        for s in range(batch):
            cache.load_prompt(s, [layer[0] for layer in pre.new_kv])
        last = [ids[-1]] * batch
        t0 = time.perf_counter()
        for _ in range(decode_tokens):
            m.decode_step(cache, list(range(batch)), last)
        decode.elapsed = time.perf_counter() - t0

    decode()
    decode()
    ours_decode = batch * decode_tokens / decode.elapsed
    result = {"model": model_name, "threads": threads, "prompt_tokens": prompt_tokens, "decode_batch": batch,
              "decode_tokens": decode_tokens, "ours_prefill_tokens_per_s": ours_prefill,
              "ours_decode_tokens_per_s": ours_decode}
    result.update(_transformers_speed(model_name, ids, decode_tokens, batch))
    return result


def _transformers_speed(model_name: str, ids: list[int], decode_tokens: int, batch: int) -> dict[str, Any]:
    try:
        from transformers import LlamaForCausalLM
    except ImportError:
        return {"transformers": "not installed"}
    from ..runtime.profile.calibrate import best_time_s
    from ..runtime.model.loader import smollm2_gguf_path

    if model_name != "smollm2-135m":
        return {"transformers": "compared only for smollm2-135m"}
    path = smollm2_gguf_path()
    hf = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32).eval()
    x = torch.tensor([ids])
    prefill = len(ids) / best_time_s(lambda: hf(x, use_cache=True))

    def decode() -> float:
        xb = x.repeat(batch, 1)
        out = hf(xb, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(decode_tokens):
            out = hf(tok, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
        return time.perf_counter() - t0

    decode()
    dt = decode()
    return {"transformers_prefill_tokens_per_s": prefill, "transformers_decode_tokens_per_s": batch * decode_tokens / dt}
