"""Llama-family models in a local Hugging Face folder: config.json + *.safetensors (LlamaForCausalLM
names) + tokenizer.json (+ tokenizer_config.json). Without tokenizer.json the model loads with no
tokenizer (token ids in and out). `save_hf_folder` writes the same layout, which transformers can
load too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import torch

from dualpath.errors import InputError
from dualpath.runtime.model.config import LlamaConfig, RopeScaling
from dualpath.runtime.model.llama import Llama
from dualpath.runtime.model.tokenizer import tokenizer_from_hf_folder
from dualpath.runtime.model.weights import LoadedModel, assign_hf_tensors, hf_tensors, sha256_files

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


def _rope_scaling(cfg: dict[str, Any], source: Path) -> RopeScaling | None:
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ("linear", "llama3"):
        raise InputError(f"{source}: RoPE scaling {kind!r} is not supported")
    return RopeScaling(
        kind,
        float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_tokens=int(params.get("original_max_position_embeddings", 8192)),
    )


def config_from_hf(cfg: dict[str, Any], weights_id: str, source: Path) -> LlamaConfig:
    architectures = cfg.get("architectures") or []
    if not set(architectures) & set(SUPPORTED_ARCHITECTURES) and cfg.get("model_type") != "llama":
        raise InputError(f"{source}: architectures {architectures} not supported (need {SUPPORTED_ARCHITECTURES})")
    if cfg.get("attention_bias") or cfg.get("mlp_bias") or cfg.get("hidden_act", "silu") != "silu":
        raise InputError(f"{source}: only bias-free SiLU Llama layers are supported")
    try:
        num_heads = int(cfg["num_attention_heads"])
        eos = cfg.get("eos_token_id")
        return LlamaConfig(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // num_heads),
            rope_theta=float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_tokens=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),)),
            rope_scaling=_rope_scaling(cfg, source),
            weights_id=weights_id,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{source}: bad or missing field in config.json ({exc})") from exc


def _tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_hf_folder(
    folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> LoadedModel:
    folder = Path(folder)
    config_path = folder / "config.json"
    files = sorted(folder.glob("*.safetensors"))
    if not config_path.is_file() or not files:
        raise InputError(f"{folder}: not a Hugging Face model folder (needs config.json and *.safetensors)")
    cfg = json.loads(config_path.read_text())
    config = config_from_hf(cfg, sha256_files(files), config_path)
    tokenizer = tokenizer_from_hf_folder(folder, cfg) if (folder / "tokenizer.json").is_file() else None
    model = Llama(config, device=device, dtype=dtype)
    assign_hf_tensors(model, _tensors(files), str(folder))
    return LoadedModel(model.eval(), tokenizer, str(folder))


# ---- writing --------------------------------------------------------------------------------


def hf_config_dict(config: LlamaConfig, dtype: torch.dtype) -> dict[str, Any]:
    scaling = config.rope_scaling
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rope_theta": config.rope_theta,
        "rope_scaling": None if scaling is None else {
            "rope_type": scaling.kind,
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_tokens,
        },
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_tokens,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_ids) if len(config.eos_token_ids) != 1 else config.eos_token_ids[0],
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def save_hf_folder(loaded: LoadedModel, folder: str | Path) -> Path:
    """Write config.json, model.safetensors, and (when the model has a tokenizer) tokenizer.json and
    tokenizer_config.json."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model, tok = loaded.model, loaded.tokenizer
    (folder / "config.json").write_text(json.dumps(hf_config_dict(model.config, model.dtype), indent=2))
    save_file(hf_tensors(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
    if tok is None:
        return folder
    (folder / "tokenizer.json").write_text(tok.to_json())
    names = {"bos_token": tok.bos_token_id, "eos_token": tok.eos_token_id, "pad_token": tok.pad_token_id,
             "unk_token": tok.unk_token_id}
    tok_config = {k: tok.token_text(v) for k, v in names.items() if v is not None}
    tok_config |= {"chat_template": tok.chat_template, "add_bos_token": tok.add_bos_token,
                   "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False))
    return folder
