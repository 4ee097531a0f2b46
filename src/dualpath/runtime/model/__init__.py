"""The model layer of the runtime: a Llama-family decoder with layerwise prefill and paged decode,
weights from GGUF or safetensors, a tokenizer (the `tokenizers` library: tokenizer.json of any kind, or GGUF BPE) with chat templates, and generation.

Module map:
  config.py              LlamaConfig (shape, KV bytes per token, fingerprint)
  llama.py               the model: forward / layerwise prefill / paged decode
  kv_layout.py           LayerKV and the Layer Block / Full Block byte conversions
  paged_cache.py         PagedKVCache (block tables, conservation law, decode attention)
  decode_workspace.py    the decoding sequences' K,V kept dense, appended to each step
  tokenizer.py           `tokenizers` wrapper + chat template
  weights.py             Hugging Face tensor names <-> parameters
  gguf_loader.py         GGUF files (dequantized to float32)
  safetensors_loader.py  Hugging Face folders (read and write)
  loader.py              load_model: built-in names, files, folders
  generate.py            prefill + paged decode generation
"""

from dualpath.runtime.model.config import LlamaConfig, RopeScaling
from dualpath.runtime.model.generate import GenerationResult, SamplerParams, generate, generate_text
from dualpath.runtime.model.kv_layout import (
    LayerKV,
    full_blocks_from_layer_kvs,
    host_kv_buffer,
    kv_dtype_from_name,
    layer_kv_from_bytes,
    layer_kv_from_full_blocks,
    layer_kv_to_bytes,
)
from dualpath.runtime.model.llama import Llama, PrefillItem, PrefillResult, PrefillState
from dualpath.runtime.model.loader import BUILTIN_MODELS, load_model
from dualpath.runtime.model.paged_cache import DecodeBatch, OutOfBlocksError, PagedKVCache
from dualpath.runtime.model.safetensors_loader import save_hf_folder
from dualpath.runtime.model.tokenizer import Tokenizer
from dualpath.runtime.model.weights import LoadedModel

__all__ = [
    "BUILTIN_MODELS", "DecodeBatch", "GenerationResult", "LayerKV", "Llama", "LlamaConfig", "LoadedModel",
    "OutOfBlocksError", "PagedKVCache", "PrefillItem", "PrefillResult", "PrefillState", "RopeScaling",
    "SamplerParams", "Tokenizer", "full_blocks_from_layer_kvs", "generate", "generate_text", "host_kv_buffer",
    "kv_dtype_from_name", "layer_kv_from_bytes", "layer_kv_from_full_blocks", "layer_kv_to_bytes", "load_model",
    "save_hf_folder",
]
