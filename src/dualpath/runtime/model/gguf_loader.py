"""Llama-family weights, config and tokenizer from a GGUF file (read with the `gguf` package).

1. Metadata: `{arch}.*` keys give the config, `tokenizer.*` keys the tokenizer and chat template.
2. Tensors: every tensor is dequantized to float32 (`gguf.quants.dequantize` handles F32, F16,
   BF16 and the Q* / K-quant / IQ types), renamed to Hugging Face names and streamed into the model.
3. llama.cpp's converter permutes the rows of attn_q / attn_k per head (interleaved RoPE pairs);
   `unpermute_rope_rows` undoes it exactly as transformers' GGUF loader does, giving the
   rotate-half layout this model (and Hugging Face) uses.
4. Conversion cache: parsing the GGUF (tens of thousands of tokenizer strings) and dequantizing
   takes seconds, paid by every engine process at start. The converted result (metadata as JSON,
   float32 Hugging Face tensors as safetensors) is kept under `cache_dir()/gguf/<sha256 of the
   file>-v<format>/`, written atomically (temporary folder, then rename); an unreadable entry is
   removed and rebuilt. `DUALPATH_CACHE_DIR` moves it; `DUALPATH_CACHE_DIR=off` disables it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from dualpath.errors import InputError
from dualpath.runtime.model.config import LlamaConfig, RopeScaling
from dualpath.runtime.model.llama import Llama
from dualpath.runtime.model.tokenizer import tokenizer_from_gguf_metadata
from dualpath.runtime.model.weights import LoadedModel, assign_hf_tensors, sha256_files

SUPPORTED_ARCHITECTURES = ("llama",)
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        return None
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute` of q/k projection rows: per head, rows (pair, 2) -> (2, pair)."""
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def read_metadata(reader: Any) -> dict[str, Any]:
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def config_from_metadata(meta: dict[str, Any], tensor_names: set[str], weights_id: str, source: str) -> LlamaConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise InputError(f"{source}: architecture {arch!r} is not supported (supported: {SUPPORTED_ARCHITECTURES})")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise InputError(f"{source}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden, num_heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // num_heads))
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise InputError(f"{source}: partial rotary embeddings are not supported")
    if "rope_freqs.weight" in tensor_names:
        raise InputError(f"{source}: per-frequency RoPE factors (rope_freqs) are not supported")
    scaling_kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling_kind not in ("none", "linear"):
        raise InputError(f"{source}: RoPE scaling {scaling_kind!r} is not supported")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return LlamaConfig(
        vocab_size=int(meta.get(f"{arch}.vocab_size", len(meta.get("tokenizer.ggml.tokens", [])))),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        max_position_tokens=int(get("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        rope_scaling=(
            RopeScaling("linear", float(get("rope.scaling.factor"))) if scaling_kind == "linear" else None
        ),
        weights_id=weights_id,
    )


def _hf_tensors(reader: Any, config: LlamaConfig, source: str) -> Iterator[tuple[str, np.ndarray]]:
    from gguf.quants import dequantize

    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            raise InputError(f"{source}: unexpected GGUF tensor {tensor.name!r}")
        weight = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        weight = weight.reshape(tuple(reversed([int(d) for d in tensor.shape])))  # GGUF lists dims fastest-first
        if name.endswith("q_proj.weight"):
            weight = unpermute_rope_rows(weight, config.num_heads)
        elif name.endswith("k_proj.weight"):
            weight = unpermute_rope_rows(weight, config.num_kv_heads)
        yield name, weight if weight.flags.writeable else weight.copy()  # F32 tensors are read-only memmap views


CACHE_FORMAT_VERSION = 1  # bump when the converted layout (names, unpermute, dtype) changes
_TENSOR_NAMES_KEY = "_dualpath.gguf_tensor_names"
# Models whose float32 weights exceed this are not cached (the cache would hold them all in memory
# while converting, and on disk at 4 bytes per weight); 2 GiB covers the ~0.5B-parameter models
# this CPU runtime is for.
CACHE_MAX_FLOAT32_BYTES = 2 * 2**30


def cache_dir() -> Path | None:
    """Where converted models are kept: $DUALPATH_CACHE_DIR, else $XDG_CACHE_HOME/dualpath, else
    ~/.cache/dualpath; None when DUALPATH_CACHE_DIR=off."""
    env = os.environ.get("DUALPATH_CACHE_DIR")
    if env == "off":
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dualpath"


def load_gguf(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"GGUF file not found: {path}")
    weights_id = sha256_files([path])
    root = cache_dir()
    entry = None if root is None else root / "gguf" / f"{weights_id}-v{CACHE_FORMAT_VERSION}"
    cached = None if entry is None else _read_cache(entry)
    if cached is not None:
        meta, tensors = cached
        config = config_from_metadata(meta, set(meta[_TENSOR_NAMES_KEY]), weights_id, str(path))
    else:
        reader = _open(path)
        meta = read_metadata(reader)
        meta[_TENSOR_NAMES_KEY] = sorted(t.name for t in reader.tensors)
        config = config_from_metadata(meta, set(meta[_TENSOR_NAMES_KEY]), weights_id, str(path))
        tensors = _hf_tensors(reader, config, str(path))  # streamed: one tensor in memory at a time
        float32_bytes = sum(4 * int(np.prod([int(d) for d in t.shape])) for t in reader.tensors)
        if entry is not None and float32_bytes <= CACHE_MAX_FLOAT32_BYTES:
            tensors = dict(tensors)
            _write_cache(entry, meta, tensors)
    model = Llama(config, device=device, dtype=dtype)
    assign_hf_tensors(model, tensors.items() if isinstance(tensors, dict) else tensors, str(path))
    return LoadedModel(model.eval(), tokenizer_from_gguf_metadata(meta), str(path))


def _open(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise InputError(f"{path}: not a readable GGUF file ({exc})") from exc


def _read_cache(entry: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    from safetensors.numpy import load_file

    try:
        meta = json.loads((entry / "metadata.json").read_text())
        return meta, load_file(entry / "model.safetensors")
    except Exception:  # noqa: BLE001 - any unreadable entry (missing, truncated, foreign) is a miss
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)  # rebuilt by this load
        return None


def _write_cache(entry: Path, meta: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    """Best effort: a read-only or full disk only costs the next start its conversion time."""
    from safetensors.numpy import save_file

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp / "model.safetensors")
        (tmp / "metadata.json").write_text(json.dumps(meta))
        try:
            tmp.rename(entry)
        except OSError:  # another process finished first: keep its entry
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        return
