"""Text generation on one model: layerwise prefill, then paged decode (never full recompute).

1. The prompt is prefilled in chunks of `prefill_chunk_tokens` (chunked prefill: each chunk's
   cached K,V are the earlier chunks', read back from the paged cache layer by layer).
2. Each chunk's per-layer K,V go into a `PagedKVCache` sized for prompt + max_tokens.
3. Per step: pick a token from the last logits (greedy at temperature 0, seeded top-p sampling
   otherwise); stop at an end-of-sequence token when asked; `decode_step` gives the next logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from dualpath.errors import InputError
from dualpath.runtime.model.llama import Llama
from dualpath.runtime.model.loader import load_model
from dualpath.runtime.model.paged_cache import PagedKVCache
from dualpath.runtime.model.tokenizer import Tokenizer

PREFILL_CHUNK_TOKENS_DEFAULT = 2048  # bounds prefill activations; attention memory is bounded by SDPA's flash kernel
BLOCK_TOKENS_DEFAULT = 64


@dataclass(frozen=True, slots=True)
class SamplerParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None  # None: a fresh nondeterministic seed (only used when temperature > 0)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InputError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True, slots=True)
class GenerationResult:
    prompt_ids: tuple[int, ...]
    generated_ids: tuple[int, ...]  # includes the end-of-sequence token when one ended generation
    text: str | None  # generated_ids decoded, special tokens dropped; None for a model without tokenizer
    stopped_at_eos: bool

    def to_dict(self) -> dict[str, object]:
        return {"prompt_ids": list(self.prompt_ids), "generated_ids": list(self.generated_ids),
                "text": self.text, "stopped_at_eos": self.stopped_at_eos}


def choice_seed(seed: int, choice: int) -> int:
    """The sampling seed of choice `choice` of a request seeded `seed` (OpenAI's `n`): choice 0
    keeps the request's, so n = 1 samples as before; the others are spread over 63 bits."""
    return seed if choice == 0 else (seed * 0x9E3779B97F4A7C15 + choice) % 2**63


class TokenSampler:
    """Chooses tokens from logits; deterministic for a seed."""

    def __init__(self, params: SamplerParams) -> None:
        self.params = params
        self._gen = torch.Generator()
        if params.seed is None:
            self._gen.seed()
        else:
            self._gen.manual_seed(params.seed)

    def __call__(self, logits: torch.Tensor) -> int:
        """logits [V] -> token id."""
        if self.params.temperature == 0:
            return int(logits.argmax())
        probs = torch.softmax(logits.float().cpu() / self.params.temperature, dim=-1)
        if self.params.top_p < 1:
            sorted_probs, order = probs.sort(descending=True)
            outside = sorted_probs.cumsum(0) - sorted_probs >= self.params.top_p  # keeps at least the top token
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs.masked_fill(outside, 0.0))
        return int(torch.multinomial(probs, 1, generator=self._gen))


def prefill_into_cache(
    model: Llama, cache: PagedKVCache, seq_id: int, prompt_ids: Sequence[int], chunk_tokens: int
) -> torch.Tensor:
    """Prefill a prompt into `cache` as sequence `seq_id`, chunk by chunk; logits of its last token [V]."""
    cache.add_sequence(seq_id)
    logits = None
    for start in range(0, len(prompt_ids), chunk_tokens):
        chunk = prompt_ids[start : start + chunk_tokens]
        state = model.begin_prefill([(start, chunk)])
        cache.extend(seq_id, len(chunk))
        for layer in range(model.config.num_layers):
            cached = cache.read(seq_id, layer, 0, start) if start else None
            (new_kv,) = model.prefill_layer(state, layer, [cached])
            cache.write(seq_id, layer, start, new_kv)
        logits = model.finish_prefill(state)[0]
    return logits


def generate(
    model: Llama,
    tokenizer: Tokenizer | None,
    prompt_ids: Sequence[int],
    max_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop_at_eos: bool = True,
    block_tokens: int = BLOCK_TOKENS_DEFAULT,
    prefill_chunk_tokens: int = PREFILL_CHUNK_TOKENS_DEFAULT,
) -> GenerationResult:
    ids = torch.as_tensor(prompt_ids, dtype=torch.long)
    if ids.ndim != 1 or not len(ids):
        raise InputError("the prompt must be a non-empty list of token ids")
    outside = ids[(ids < 0) | (ids >= model.config.vocab_size)]
    if len(outside):
        vocab = model.config.vocab_size
        raise InputError(f"prompt token ids {outside[:5].tolist()} outside the vocabulary [0, {vocab})")
    if max_tokens < 0:
        raise InputError(f"max_tokens must be >= 0, got {max_tokens}")
    prompt_ids = tuple(ids.tolist())
    sampler = TokenSampler(SamplerParams(temperature, top_p, seed))
    tokenizer_eos = None if tokenizer is None else tokenizer.eos_token_id
    eos_ids = set(model.config.eos_token_ids) | ({tokenizer_eos} - {None})
    num_blocks = -(-(len(prompt_ids) + max_tokens) // block_tokens)
    cache = PagedKVCache(model.config, max(num_blocks, 1), block_tokens, dtype=model.dtype, device=model.device)
    generated: list[int] = []
    stopped = False
    if max_tokens:
        logits = prefill_into_cache(model, cache, 0, prompt_ids, prefill_chunk_tokens)
        while True:
            token = sampler(logits)
            generated.append(token)
            stopped = stop_at_eos and token in eos_ids
            if stopped or len(generated) == max_tokens:
                break
            logits = model.decode_step(cache, [0], [token])[0]
    text = None if tokenizer is None else tokenizer.decode(generated, skip_special=True)
    return GenerationResult(prompt_ids, tuple(generated), text, stopped)


def generate_text(
    name_or_path: str,
    prompt: str | None = None,
    prompt_ids: Sequence[int] | None = None,
    max_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    chat: bool | None = None,
    device: str = "cpu",
) -> GenerationResult:
    """For the CLI: load a model, then generate from a text prompt (through the chat template when
    `chat`; None: when the tokenizer has one, else the raw prompt) or from token ids (used as given;
    the only input a model without tokenizer takes)."""
    if (prompt is None) == (prompt_ids is None):
        raise InputError("give exactly one of --prompt and --prompt-ids")
    loaded = load_model(name_or_path, device=device)
    tok = loaded.tokenizer
    if prompt is not None and tok is None:
        raise InputError(f"no tokenizer in {name_or_path} (no tokenizer.json) to encode --prompt; "
                         "pass token ids with --prompt-ids")
    if prompt is not None:
        if chat is None:
            chat = tok.chat_template is not None
        if chat:
            ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True))
        else:
            bos = [tok.bos_token_id] if tok.add_bos_token and tok.bos_token_id is not None else []
            ids = bos + tok.encode(prompt)
    else:
        ids = list(prompt_ids)
    return generate(loaded.model, tok, ids, max_tokens, temperature, top_p, seed)
