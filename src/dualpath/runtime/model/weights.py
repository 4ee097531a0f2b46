"""Weights by Hugging Face `LlamaForCausalLM` names, the one naming every loader goes through.

GGUF tensors are renamed to these names first (gguf_loader.py), so the mapping onto this model's
parameters lives here once. The only structural difference: `k_proj` and `v_proj` are the two
halves (rows [0, G*D) and [G*D, 2*G*D)) of our fused `wkv`, whose output is the Layer Block layout.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from dualpath.errors import InputError
from dualpath.runtime.model.llama import Llama
from dualpath.runtime.model.tokenizer import Tokenizer

# ours (under blocks.{i}.) -> Hugging Face (under model.layers.{i}.)
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "wq.weight": "self_attn.q_proj.weight",
    "wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "w_gate.weight": "mlp.gate_proj.weight",
    "w_up.weight": "mlp.up_proj.weight",
    "w_down.weight": "mlp.down_proj.weight",
}
_KV_HALVES = {"self_attn.k_proj.weight": 0, "self_attn.v_proj.weight": 1}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
# tensors some checkpoints carry that the model recomputes
_IGNORED_RE = re.compile(r".*rotary_emb\.inv_freq$")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: Llama
    tokenizer: Tokenizer | None  # None: a folder without tokenizer.json (token ids in and out)
    source: str  # the built-in name or the path it was loaded from


def hf_names(model: Llama) -> list[str]:
    """Every tensor name a complete `LlamaForCausalLM` checkpoint of this shape holds."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if model.lm_head is not None:
        names.append("lm_head.weight")
    for i in range(model.config.num_layers):
        for hf in (*_LAYER_NAMES.values(), *_KV_HALVES):
            names.append(f"model.layers.{i}.{hf}")
    return names


def _target(model: Llama, name: str) -> torch.Tensor | None:
    """The parameter (or the slice of one) that HF tensor `name` fills; None when not ours."""
    if name == "model.embed_tokens.weight":
        return model.embed.weight
    if name == "model.norm.weight":
        return model.norm.weight
    if name == "lm_head.weight":
        return None if model.lm_head is None else model.lm_head.weight
    m = _LAYER_RE.fullmatch(name)
    if m is None or int(m.group(1)) >= model.config.num_layers:
        return None
    block, suffix = model.blocks[int(m.group(1))], m.group(2)
    if suffix in _KV_HALVES:
        rows = model.config.num_kv_heads * model.config.head_dim
        half = _KV_HALVES[suffix]
        return block.wkv.weight[half * rows : (half + 1) * rows]
    ours = next((k for k, v in _LAYER_NAMES.items() if v == suffix), None)
    return None if ours is None else block.get_parameter(ours)


@torch.no_grad()
def assign_hf_tensors(model: Llama, tensors: Iterable[tuple[str, np.ndarray | torch.Tensor]], source: str) -> None:
    """Copy HF-named tensors into `model` (converting dtype and device); every parameter must be
    filled exactly once. Streams: each tensor can be freed as soon as it is copied."""
    filled: set[str] = set()
    for name, value in tensors:
        if _IGNORED_RE.fullmatch(name):
            continue
        if name == "lm_head.weight" and model.lm_head is None:
            continue  # tied: some files store the head anyway; the embedding is the head
        target = _target(model, name)
        if target is None:
            raise InputError(f"{source}: unexpected tensor {name!r} for a Llama model")
        value = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        if tuple(value.shape) != tuple(target.shape):
            shapes = f"{tuple(value.shape)}, expected {tuple(target.shape)}"
            raise InputError(f"{source}: tensor {name!r} has shape {shapes}")
        if name in filled:
            raise InputError(f"{source}: tensor {name!r} appears twice")
        target.copy_(value)
        filled.add(name)
    missing = [n for n in hf_names(model) if n not in filled]
    if missing:
        raise InputError(f"{source}: missing {len(missing)} tensors, e.g. {missing[:3]}")


def hf_tensors(model: Llama) -> dict[str, torch.Tensor]:
    """The model's weights under HF names (contiguous host copies), for saving."""
    return {name: _target(model, name).detach().cpu().contiguous() for name in hf_names(model)}


def sha256_files(paths: Iterable[Path], chunk_bytes: int = 1 << 24) -> str:
    """Content hash of weight files (in the given order): the weights' identity in the fingerprint."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(chunk_bytes):
                h.update(chunk)
    return h.hexdigest()
