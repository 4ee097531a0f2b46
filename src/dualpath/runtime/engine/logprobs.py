"""Log-probabilities of sampled tokens, as the OpenAI API reports them (`logprobs`, `top_logprobs`).

The values are the model's raw log-probabilities: `log_softmax` of the logits the sampler starts
from, before temperature, top-p and the end-of-sequence mask of `min_tokens` (vLLM's
`logprobs_mode="raw_logprobs"`, its default). So at any temperature a token's logprob is the one
a plain forward pass over the same ids gives it (tests/runtime/cluster/test_served_logprobs.py checks the
served ones against transformers).

In a PD-disaggregated cluster the first token is sampled on the prefill engine: its logprobs
travel with it (`FirstToken` to the router, `PromptReady` to the decode engine, which repeats them
in `PromptLoaded`), so no choice loses its first entry whichever report reaches the router.
"""

from __future__ import annotations

import torch

from ..api import MAX_TOP_LOGPROBS, NO_LOGPROBS, TokenLogprobs
from ..model.generate import SamplerParams, TokenSampler, choice_seed


def token_logprobs(logits: torch.Tensor, token: int, top: int) -> TokenLogprobs:
    """The logprob of `token` and of the `top` most likely tokens, from raw logits [V]."""
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top must be in [0, {MAX_TOP_LOGPROBS}], got {top}")
    logprobs = torch.log_softmax(logits.detach().float().cpu(), dim=-1)
    values, ids = logprobs.topk(top)
    return TokenLogprobs(float(logprobs[token]), tuple(zip(ids.tolist(), values.tolist())))


def wire_logprobs(logits: torch.Tensor, token: int, top: int) -> list:
    """What an engine sends for a sampled token: `token_logprobs` on the wire, or [] when the
    request asked for none (`top` is `NO_LOGPROBS`)."""
    return [] if top == NO_LOGPROBS else token_logprobs(logits, token, top).to_wire()


def first_tokens(logits: torch.Tensor, n: int, temperature: float, top_p: float, seed: int, top: int,
                 eos_token_ids: tuple[int, ...] | None) -> list[list]:
    """Each choice's first token and its wire logprobs from a prefill's logits [V]: choice c sampled
    with `choice_seed(seed, c)`, the EOS ids masked when `eos_token_ids` is given (min_tokens or
    ignore_eos); the logprobs from the raw logits. The one rule of the PE and of a DE that
    prefills (+selective), so that a request's tokens do not depend on which engine prefilled it."""
    raw = logits
    if eos_token_ids is not None:
        logits = logits.clone()
        logits[list(eos_token_ids)] = float("-inf")
    out = []
    for c in range(n):
        token = TokenSampler(SamplerParams(temperature, top_p, choice_seed(seed, c)))(logits)
        out.append([token, wire_logprobs(raw, token, top)])
    return out
