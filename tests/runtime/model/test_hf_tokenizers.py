"""Any tokenizer.json the `tokenizers` library reads (here WordLevel with a normalizer), a folder
without tokenizer files (token ids in and out), and GGUF byte-level BPE built from metadata; greedy
ids compared with transformers' own generate on the same saved checkpoint."""

from __future__ import annotations

import json
import subprocess

import pytest
from cli_helpers import cli
import torch

from dualpath.errors import InputError
from dualpath.runtime.model import generate_text, load_model
from dualpath.runtime.model.tokenizer import bytes_to_unicode, tokenizer_from_gguf_metadata

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

VOCAB_SIZE = 200
SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2 (bos 1, eos 2 as in the model's config)
WORDS = [*SPECIALS, "user", "assistant", "hello", "world", *(f"w{i}" for i in range(VOCAB_SIZE - 7))]
VOCAB = {w: i for i, w in enumerate(WORDS)}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}"
)
MAX_NEW_TOKENS = 8


def _tiny_hf_llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # O(1) activations and peaked logits: greedy choices are not near-ties
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                scale = 1.0 if "embed_tokens" in name else p.shape[1] ** -0.5
                p.copy_(scale * torch.randn(p.shape, generator=gen))
    return model


def _write_word_level_tokenizer(folder) -> None:
    from tokenizers import models, normalizers, pre_tokenizers

    engine = tokenizers.Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    engine.normalizer = normalizers.Lowercase()
    engine.pre_tokenizer = pre_tokenizers.Whitespace()
    engine.add_special_tokens(SPECIALS)
    engine.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(transformers model, folder with a WordLevel tokenizer, folder without tokenizer files)."""
    transformers.logging.set_verbosity_error()
    model = _tiny_hf_llama()
    with_tok, without_tok = tmp_path_factory.mktemp("word-level"), tmp_path_factory.mktemp("no-tokenizer")
    for folder in (with_tok, without_tok):
        model.save_pretrained(folder)
    _write_word_level_tokenizer(with_tok)
    assert not list(without_tok.glob("tokenizer*"))
    return model, with_tok, without_tok


def _hf_greedy(model, prompt_ids: list[int]) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


def test_word_level_tokenizer_encodes_and_decodes_its_ids(folders):
    _, with_tok, _ = folders
    tok = load_model(with_tok).tokenizer
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (VOCAB_SIZE, 1, 2, 0)
    ids = tok.encode("Hello  WORLD w7 zzz")  # lowercased, split on whitespace, unknown word -> <unk>
    assert ids == [VOCAB["hello"], VOCAB["world"], VOCAB["w7"], VOCAB["<unk>"]]
    assert tok.decode(ids) == "hello world w7 <unk>"
    assert tok.decode(ids, skip_special=True) == "hello world w7"
    assert tok.encode("<s>hello") == [1, VOCAB["hello"]]
    assert 1 not in tok.encode("<s>hello", allow_added_tokens=False)
    chat = tok.apply_chat_template([{"role": "user", "content": "hello world"}])
    assert chat == "<s>user hello world assistant"


def test_generate_with_word_level_tokenizer_matches_transformers(folders):
    model, with_tok, _ = folders
    out = generate_text(str(with_tok), prompt="Hello world", max_tokens=MAX_NEW_TOKENS)
    assert list(out.prompt_ids) == [1, VOCAB["user"], VOCAB["hello"], VOCAB["world"], VOCAB["assistant"]]
    assert list(out.generated_ids) == _hf_greedy(model, list(out.prompt_ids))
    assert len(out.generated_ids) == MAX_NEW_TOKENS and not out.stopped_at_eos  # no early stop hides a mismatch
    assert out.text == " ".join(WORDS[i] for i in out.generated_ids if WORDS[i] not in SPECIALS)


def test_a_prompt_goes_raw_when_the_tokenizer_has_no_chat_template(folders, tmp_path):
    """generate_text's chat=None: the template when the tokenizer has one, else the raw prompt;
    --chat forced on a tokenizer without one is refused, naming the options that exist."""
    import shutil

    model, with_tok, _ = folders
    plain = tmp_path / "no-template"
    shutil.copytree(with_tok, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_model(plain).tokenizer
    raw = ([1] if tok.add_bos_token else []) + [VOCAB["hello"], VOCAB["world"]]  # the raw prompt, BOS as configured
    out = generate_text(str(plain), prompt="Hello world", max_tokens=MAX_NEW_TOKENS)
    assert list(out.prompt_ids) == raw
    assert list(out.generated_ids) == _hf_greedy(model, raw)
    assert list(generate_text(str(with_tok), prompt="Hello world", max_tokens=2, chat=False).prompt_ids) == raw
    with pytest.raises(InputError, match="--no-chat"):
        generate_text(str(plain), prompt="Hello world", max_tokens=2, chat=True)


def test_folder_without_tokenizer_takes_and_gives_ids(folders):
    model, _, without_tok = folders
    assert load_model(without_tok).tokenizer is None
    out = generate_text(str(without_tok), prompt_ids=[5, 6, 7], max_tokens=MAX_NEW_TOKENS)
    assert list(out.generated_ids) == _hf_greedy(model, [5, 6, 7]) and len(out.generated_ids) == MAX_NEW_TOKENS
    assert out.text is None
    with pytest.raises(InputError, match="--prompt-ids"):
        generate_text(str(without_tok), prompt="hello", max_tokens=2)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return cli(*args, timeout=120)


def test_cli_generate_without_tokenizer(folders):
    model, _, without_tok = folders
    p = _cli("generate", "--model", str(without_tok), "--prompt-ids", "9,8,7,6", "--max-tokens", str(MAX_NEW_TOKENS),
             "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["generated_ids"] == _hf_greedy(model, [9, 8, 7, 6]) and out["text"] is None
    assert f"no tokenizer in {without_tok}: text not decoded" in p.stderr

    p = _cli("generate", "--model", str(without_tok), "--prompt", "hello")
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("error: ") and str(without_tok) in line and "--prompt-ids" in line


# ---- GGUF byte-level BPE from metadata ------------------------------------------------------


def _gguf_meta(pre: str | None) -> dict:
    """Bytes 0..255 as tokens, then merged digits, a control and a user-defined token."""
    spell = bytes_to_unicode()
    tokens = [spell[b] for b in range(256)] + ["12", "34", "45", "123", "<|ctl|>", "<think>"]
    types = [1] * (len(tokens) - 2) + [3, 4]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": ["3 4", "1 2", "12 3", "4 5"], "tokenizer.ggml.eos_token_id": 260}
    return meta if pre is None else {**meta, "tokenizer.ggml.pre": pre}


def test_gguf_pre_tokenizer_name_picks_the_split():
    # GPT-2's split keeps "12345" whole: "3 4" merges first; llama3's cuts digits in threes: "123" "45"
    assert tokenizer_from_gguf_metadata(_gguf_meta(None)).encode("12345") == [256, 257, ord("5")]
    assert tokenizer_from_gguf_metadata(_gguf_meta("smollm")).encode("12345") == [256, 257, ord("5")]
    assert tokenizer_from_gguf_metadata(_gguf_meta("llama3")).encode("12345") == [259, 258]


def test_gguf_control_and_user_defined_tokens():
    tok = tokenizer_from_gguf_metadata(_gguf_meta(None))
    ids = tok.encode("a<|ctl|>b<think>é")
    assert ids == [ord("a"), 260, ord("b"), 261, 0xC3, 0xA9]  # added tokens whole, with their GGUF ids
    assert tok.decode(ids) == "a<|ctl|>b<think>é"
    assert tok.decode(ids, skip_special=True) == "ab<think>é"  # only control tokens are special
    assert tok.is_special(260) and not tok.is_special(261) and tok.eos_token_id == 260
    assert 260 not in tok.encode("<|ctl|>", allow_added_tokens=False)
