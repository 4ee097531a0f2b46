"""Tokenizers through Hugging Face `tokenizers`, and chat templates.

A `tokenizers.Tokenizer` (the "engine": normalizer, pre-tokenizer, model, decoder) comes from:
1. a Hugging Face folder (`tokenizer_from_hf_folder`): its tokenizer.json, of any kind the library
   reads (BPE, WordPiece, WordLevel, Unigram; any normalizer, pre-tokenizer and decoder);
   tokenizer_config.json (or special_tokens_map.json) and chat_template.jinja give the special
   tokens, `add_bos_token` and the chat template;
2. GGUF metadata (`tokenizer_from_gguf_metadata`): byte-level BPE (`tokenizer.ggml.model` "gpt2")
   from `tokenizer.ggml.tokens` / `merges`, spelled in GPT-2's byte alphabet and split as
   `tokenizer.ggml.pre` says (`GGUF_PRE_SPLITS`; GPT-2's split otherwise, as transformers does);
   control tokens become special added tokens, user-defined ones plain added tokens, each keeping
   its GGUF id.

`Tokenizer` wraps an engine with what the runtime uses (`api.TokenizerLike`): `encode` never runs
the engine's post-processor (a BOS is the caller's choice, see `add_bos_token`); `decode` with or
without special tokens; the special token ids; chat templates rendered with jinja2 the way
transformers does (sandboxed, trim_blocks, lstrip_blocks).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from dualpath.errors import InputError

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp pre-tokenizer names (tokenizer.ggml.pre) with a split other than GPT-2's. Any other name
# gets GPT-2's split, as in transformers' GGUF tokenizer (e.g. "smollm": its vocabulary has no
# multi-digit tokens, so GPT-2's split gives the same ids as llama.cpp's per-digit split).
GGUF_PRE_SPLITS = {name: LLAMA3_SPLIT for name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx")}

GGUF_TOKEN_TYPE_NORMAL = 1
GGUF_TOKEN_TYPE_CONTROL = 3
GGUF_TOKEN_TYPE_USER_DEFINED = 4


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


@dataclass(frozen=True, slots=True)
class AddedToken:
    """A token matched whole in the text, with its id; `special` ones are dropped by
    decode(skip_special=True)."""

    content: str
    id: int
    special: bool


def _chat_environment():
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


class Tokenizer:
    """A `tokenizers.Tokenizer` (`engine`) plus special token ids and the chat template."""

    def __init__(
        self,
        engine: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        unk_token_id: int | None = None,
        chat_template: str | None = None,
        add_bos_token: bool = False,
    ) -> None:
        self.engine = engine
        added = engine.get_added_tokens_decoder()
        self._added_text = {i: t.content for i, t in added.items()}
        self._special_ids = frozenset(i for i, t in added.items() if t.special)
        self._plain_engine: tokenizers.Tokenizer | None = None  # made on first use
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id
        self.pad_token_id, self.unk_token_id = pad_token_id, unk_token_id
        self.chat_template = chat_template
        self.add_bos_token = add_bos_token
        self._compiled_template = None

    @property
    def vocab_size(self) -> int:
        return self.engine.get_vocab_size(with_added_tokens=True)

    def token_text(self, token_id: int) -> str:
        """An added token's content; any other token decoded alone."""
        text = self._added_text.get(token_id)
        return text if text is not None else self.engine.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (for logprobs): an added token's content; a byte-level BPE
        token's own bytes, which may be part of a UTF-8 character; else its text decoded alone."""
        text = self._added_text.get(token_id)
        piece = None if text is not None else self.engine.id_to_token(token_id)
        if piece is not None and isinstance(self.engine.decoder, decoders.ByteLevel):
            byte_of = _byte_of()
            if all(c in byte_of for c in piece):
                return bytes(byte_of[c] for c in piece)
        return self.token_text(token_id).encode()

    def to_json(self) -> str:
        """The engine as a Hugging Face tokenizer.json."""
        return self.engine.to_str()

    # ---- encode / decode ---------------------------------------------------------------------

    def encode(self, text: str, allow_added_tokens: bool = True) -> list[int]:
        """Token ids of `text` (no BOS or other post-processor tokens). With `allow_added_tokens`
        false, text like "<|im_start|>" is encoded as plain characters."""
        engine = self.engine if allow_added_tokens else self._engine_without_added_tokens()
        return engine.encode(text, add_special_tokens=False).ids

    def _engine_without_added_tokens(self) -> tokenizers.Tokenizer:
        if self._plain_engine is None:
            spec = json.loads(self.engine.to_str())
            spec["added_tokens"] = []  # their ids stay in the model's vocabulary; only matching stops
            self._plain_engine = tokenizers.Tokenizer.from_str(json.dumps(spec))
        return self._plain_engine

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of `ids`; bytes that do not complete a UTF-8 character decode to U+FFFD."""
        return self.engine.decode(list(ids), skip_special_tokens=skip_special)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def clear_cache(self) -> None:
        """Empty the engine's per-word cache (BPE and Unigram keep one), e.g. to time cold encodes."""
        clear = getattr(self.engine.model, "_clear_cache", None)
        if clear is not None:
            clear()

    # ---- chat --------------------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        """The conversation as text, through the model's chat template (as transformers renders it)."""
        if self.chat_template is None:
            raise InputError("this model's tokenizer has no chat template: send a plain prompt "
                             "(/v1/completions, or `dualpath generate --no-chat`)")
        if self._compiled_template is None:
            self._compiled_template = _chat_environment().from_string(self.chat_template)
        names = {"bos_token": self.bos_token_id, "eos_token": self.eos_token_id,
                 "pad_token": self.pad_token_id, "unk_token": self.unk_token_id}
        specials = {k: self.token_text(v) for k, v in names.items() if v is not None}
        return self._compiled_template.render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **specials
        )


# ---- byte-level BPE (GGUF, the tiny model) --------------------------------------------------


def _respell(token: str) -> str:
    """A token written outside the byte alphabet (e.g. raw UTF-8) in the byte alphabet."""
    if _byte_alphabet().issuperset(token):
        return token
    spell = bytes_to_unicode()
    return "".join(spell[b] for b in token.encode())


@lru_cache(maxsize=1)
def _byte_of() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


@lru_cache(maxsize=1)
def _byte_alphabet() -> frozenset[str]:
    return frozenset(bytes_to_unicode().values())


def byte_level_bpe(
    tokens: Sequence[str],
    merges: Sequence[tuple[str, str]],
    added_tokens: Sequence[AddedToken] = (),
    split_pattern: str | None = None,
) -> tokenizers.Tokenizer:
    """Token i is `tokens[i]`; ordinary tokens are respelled in the byte alphabet, added tokens
    keep their text (so they match it and decode to it). `split_pattern`: an isolated regex split
    before the byte mapping; None is GPT-2's split. No unknown token: a byte without a token is
    dropped, as Hugging Face does for SmolLM2 (it has no token for e.g. 0x04)."""
    added_ids = {t.id for t in added_tokens}
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok if i in added_ids else _respell(tok), i)
    try:
        engine = tokenizers.Tokenizer(models.BPE(vocab, [tuple(m) for m in merges]))
    except Exception as exc:  # the library's own error type is not exported
        raise InputError(f"bad BPE vocabulary or merges ({exc})") from exc
    if split_pattern is None:
        engine.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        engine.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(tokenizers.Regex(split_pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    engine.decoder = decoders.ByteLevel()
    engine.add_special_tokens([tokenizers.AddedToken(t.content, special=True, normalized=False)
                               for t in added_tokens if t.special])
    engine.add_tokens([tokenizers.AddedToken(t.content, special=False, normalized=False)
                       for t in added_tokens if not t.special])
    for t in added_tokens:
        if engine.token_to_id(t.content) != t.id:
            raise ValueError(f"added token {t.content!r} should have id {t.id}, not {engine.token_to_id(t.content)}")
    return engine


def tokenizer_from_gguf_metadata(meta: Mapping[str, Any]) -> Tokenizer:
    """From GGUF `tokenizer.*` metadata (values already decoded: lists of str / int)."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise InputError(f"GGUF tokenizer {model!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [GGUF_TOKEN_TYPE_NORMAL] * len(tokens)
    added = [
        AddedToken(tok, i, special=(ty == GGUF_TOKEN_TYPE_CONTROL))
        for i, (tok, ty) in enumerate(zip(tokens, types))
        if ty in (GGUF_TOKEN_TYPE_CONTROL, GGUF_TOKEN_TYPE_USER_DEFINED)
    ]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    engine = byte_level_bpe(tokens, merges, added, GGUF_PRE_SPLITS.get(meta.get("tokenizer.ggml.pre")))
    return Tokenizer(
        engine,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
        unk_token_id=meta.get("tokenizer.ggml.unknown_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    )


# ---- Hugging Face folders -------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc})") from exc


def _chat_template(folder: Path, tok_config: Mapping[str, Any]) -> str | None:
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: use the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


def tokenizer_from_hf_folder(folder: Path, config: Mapping[str, Any] | None = None) -> Tokenizer:
    """From tokenizer.json (+ tokenizer_config.json, special_tokens_map.json, chat_template.jinja)
    in a Hugging Face folder; special token ids fall back to `config` (config.json)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"{folder}: no tokenizer.json")
    try:
        engine = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises a bare Exception for files it cannot read
        raise InputError(f"{path}: not a tokenizer.json the tokenizers library can read ({exc})") from exc
    tok_config = _read_json(folder / "special_tokens_map.json") | _read_json(folder / "tokenizer_config.json")

    def special_id(name: str) -> int | None:
        value = tok_config.get(f"{name}_token")
        content = value.get("content") if isinstance(value, dict) else value
        token_id = engine.token_to_id(content) if isinstance(content, str) else None
        if token_id is not None:
            return token_id
        value = (config or {}).get(f"{name}_token_id")
        return value[0] if isinstance(value, list) else value

    return Tokenizer(
        engine,
        bos_token_id=special_id("bos"),
        eos_token_id=special_id("eos"),
        pad_token_id=special_id("pad"),
        unk_token_id=special_id("unk"),
        chat_template=_chat_template(folder, tok_config),
        add_bos_token=bool(tok_config.get("add_bos_token", False)),
    )
