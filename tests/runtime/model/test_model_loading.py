"""Loading: built-in names, GGUF config, safetensors round trip, errors, fingerprints."""

from __future__ import annotations


import pytest
import torch

from dualpath.errors import InputError
from dualpath.runtime.model import load_model, save_hf_folder

PROMPT = [257, 72, 105, 33, 10, 258, 50, 51]


def test_smollm2_config_from_gguf_metadata(smollm2):
    cfg = smollm2.model.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (9, 3, 64, 49152)
    assert cfg.rope_theta == 100000.0 and cfg.rope_scaling is None and cfg.tie_word_embeddings
    assert (cfg.bos_token_id, cfg.eos_token_ids, cfg.max_position_tokens) == (1, (2,), 8192)
    assert cfg.kv_bytes_per_token_per_layer(torch.float32) == 2 * 3 * 64 * 4
    assert cfg.kv_bytes_per_token_per_layer(torch.bfloat16) == 2 * 3 * 64 * 2
    assert cfg.block_layout(torch.float32).full_block_bytes == 30 * 64 * 1536
    assert len(cfg.weights_id) == 64  # sha256 of the file


def test_tiny_is_deterministic_for_a_seed():
    a, b, c = load_model("tiny", seed=0), load_model("tiny", seed=0), load_model("tiny", seed=1)
    assert torch.equal(a.model(PROMPT), b.model(PROMPT))
    assert not torch.allclose(a.model(PROMPT), c.model(PROMPT))
    assert a.model.config.fingerprint() == b.model.config.fingerprint() != c.model.config.fingerprint()
    fp = a.model.config.fingerprint()
    assert a.model.config.fingerprint(torch.float32) != fp != a.model.config.fingerprint(torch.bfloat16)


def test_tiny_in_bfloat16_produces_bfloat16_kv():
    loaded = load_model("tiny", dtype=torch.bfloat16)
    res = loaded.model.prefill([(0, PROMPT)])
    assert res.new_kv[0][0].kv.dtype == torch.bfloat16
    ref = load_model("tiny").model(PROMPT)[-1]
    assert (res.logits[0] - ref).abs().max().item() < 0.5  # same model, coarser arithmetic


def test_safetensors_round_trip(tiny, tmp_path):
    folder = save_hf_folder(tiny, tmp_path / "tiny-hf")
    back = load_model(folder)
    assert torch.equal(back.model(PROMPT), tiny.model(PROMPT))
    text = "héllo <|im_start|>wörld 123"
    assert back.tokenizer.encode(text) == tiny.tokenizer.encode(text)
    chat = [{"role": "user", "content": "hi"}]
    assert back.tokenizer.apply_chat_template(chat) == tiny.tokenizer.apply_chat_template(chat)
    assert back.model.config.fingerprint() != tiny.model.config.fingerprint()  # other weights identity


def test_saved_folder_loads_in_transformers(tiny, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = save_hf_folder(tiny, tmp_path / "tiny-hf")
    hf_model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf_model(torch.tensor([PROMPT])).logits[0]
    assert (tiny.model(PROMPT) - ref).abs().max().item() <= 1e-4
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = "<|im_start|>user\nnaïve 🙂<|im_end|>"
    assert hf_tok.encode(text, add_special_tokens=False) == tiny.tokenizer.encode(text)


def test_bad_names_and_paths_raise_input_error(tmp_path):
    with pytest.raises(InputError, match="unknown model"):
        load_model("llama-9000")
    with pytest.raises(InputError, match="unknown model"):
        load_model(str(tmp_path / "missing.gguf"))
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(InputError, match="expected a .gguf file"):
        load_model(str(tmp_path / "weights.bin"))
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(InputError, match="GGUF"):
        load_model(str(tmp_path / "broken.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="Hugging Face model folder"):
        load_model(str(tmp_path / "empty"))


def test_folder_with_wrong_architecture_raises(tiny, tmp_path):
    import json

    folder = save_hf_folder(tiny, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="architectures"):
        load_model(folder)


def _same_weights(a, b) -> bool:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_gguf_conversion_cache_round_trips_and_survives_corruption(smollm2, tmp_path, monkeypatch):
    """The converted-model cache gives bit-identical weights and the same tokenizer; a corrupted
    entry is ignored (the GGUF is converted again), and `off` writes nothing."""
    monkeypatch.setenv("DUALPATH_CACHE_DIR", str(tmp_path / "cache"))
    first = load_model("smollm2-135m")  # converts and writes the entry
    (entry,) = (tmp_path / "cache" / "gguf").iterdir()
    assert sorted(p.name for p in entry.iterdir()) == ["metadata.json", "model.safetensors"]
    second = load_model("smollm2-135m")  # from the entry
    assert _same_weights(first, second) and _same_weights(first, smollm2)
    text = "Hello, world! The capital of France is Paris."
    assert second.tokenizer.encode(text) == smollm2.tokenizer.encode(text)
    assert second.model.config == smollm2.model.config

    blob = entry / "model.safetensors"
    blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])  # truncated entry
    third = load_model("smollm2-135m")
    assert _same_weights(third, smollm2)
    assert _same_weights(load_model("smollm2-135m"), smollm2)  # the rebuilt entry

    # `off`: no cache folder, so the loader (which writes only under `cache_dir()`) writes nothing
    from dualpath.runtime.model.gguf_loader import cache_dir

    monkeypatch.setenv("DUALPATH_CACHE_DIR", "off")
    assert cache_dir() is None
