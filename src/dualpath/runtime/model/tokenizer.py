"""Byte-level BPE tokenizer (GPT-2 style, as SmolLM2 uses) and chat templates.

Encoding a text:
1. added tokens (e.g. `<|im_start|>`) are cut out whole, longest first, wherever they occur;
2. the rest is pre-tokenized by regular expressions (GPT-2's by default), each piece spelled in
   the byte alphabet (`bytes_to_unicode`: one printable character per byte);
3. each piece is merged with BPE, lowest merge rank first, ties to the leftmost pair (the order
   Hugging Face `tokenizers` uses). A heap over adjacent pairs keeps this O(n log n) per piece, and
   results are cached per piece, so long prompts cost about one dictionary lookup per word.

Built from GGUF metadata (`tokenizer.ggml.*`, `tokenizer_from_gguf_metadata`) or from a Hugging Face
folder (tokenizer.json + tokenizer_config.json, `tokenizer_from_hf_folder`).
Chat templates are rendered with jinja2 the way transformers does (sandboxed, trim_blocks, lstrip_blocks).
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import regex

from dualpath.errors import InputError

# GPT-2's pre-tokenizer (Hugging Face ByteLevel(use_regex=True))
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp pre-tokenizer names (tokenizer.ggml.pre) with a split other than GPT-2's. Any other name
# gets GPT-2's split, as in transformers' GGUF tokenizer (e.g. "smollm": its vocabulary has no
# multi-digit tokens, so GPT-2's split gives the same ids as llama.cpp's per-digit split).
GGUF_PRE_SPLITS = {name: (LLAMA3_SPLIT,) for name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx")}

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
    """A token matched whole in the text; `special` ones are dropped by decode(skip_special=True)."""

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
    """Byte-level BPE. `vocab[i]` is token i spelled in the byte alphabet; `merges` in rank order."""

    def __init__(
        self,
        vocab: Sequence[str],
        merges: Sequence[tuple[str, str]],
        added_tokens: Sequence[AddedToken] = (),
        split_patterns: Sequence[str] = (GPT2_SPLIT,),
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        unk_token_id: int | None = None,
        chat_template: str | None = None,
        add_bos_token: bool = False,
        ignore_merges: bool = False,
        unknown_symbol_id: int | None = None,
        max_cached_pieces: int = 200_000,
    ) -> None:
        """`unknown_symbol_id`: emitted for a byte with no token; None drops such bytes, as a Hugging
        Face BPE model without `unk_token` does (SmolLM2 lacks tokens for some bytes, e.g. 0x04)."""
        self.vocab = tuple(vocab)
        self._ids = {tok: i for i, tok in enumerate(self.vocab)}
        self.merges = tuple((a, b) for a, b in merges)
        self._ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self.added_tokens = tuple(added_tokens)
        for t in self.added_tokens:
            if not 0 <= t.id < len(self.vocab):
                raise ValueError(f"added token {t.content!r} has id {t.id} outside the vocabulary")
        self._special_ids = frozenset(t.id for t in self.added_tokens if t.special)
        by_length = sorted(self.added_tokens, key=lambda t: -len(t.content))
        self._added_ids = {t.content: t.id for t in by_length}
        self._added_re = regex.compile("|".join(regex.escape(t.content) for t in by_length)) if by_length else None
        self.split_patterns = tuple(split_patterns)
        self._splits = tuple(regex.compile(p) for p in self.split_patterns)
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id
        self.pad_token_id, self.unk_token_id = pad_token_id, unk_token_id
        self.chat_template = chat_template
        self.add_bos_token = add_bos_token
        self._ignore_merges = ignore_merges
        self._unknown_symbol_id = unknown_symbol_id
        self._max_cached_pieces = max_cached_pieces
        self._piece_cache: dict[str, tuple[int, ...]] = {}
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        self._token_bytes = [
            bytes(byte_of[c] for c in tok) if all(c in byte_of for c in tok) else tok.encode() for tok in self.vocab
        ]
        for t in self.added_tokens:
            self._token_bytes[t.id] = t.content.encode()
        self._compiled_template = None

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def token_text(self, token_id: int) -> str:
        return self._token_bytes[token_id].decode("utf-8", errors="replace")

    # ---- encode ------------------------------------------------------------------------------

    def encode(self, text: str, allow_added_tokens: bool = True) -> list[int]:
        """Token ids of `text` (no BOS is added; see `add_bos_token`). With `allow_added_tokens`
        false, text like "<|im_start|>" is encoded as plain characters."""
        ids: list[int] = []
        pos = 0
        if allow_added_tokens and self._added_re is not None:
            for match in self._added_re.finditer(text):
                self._encode_ordinary(text[pos : match.start()], ids)
                ids.append(self._added_ids[match.group()])
                pos = match.end()
        self._encode_ordinary(text[pos:], ids)
        return ids

    def _pretokenize(self, text: str) -> list[str]:
        pieces = [text] if text else []
        for split in self._splits:  # "isolated" splits: matches and the gaps between them are pieces
            out = []
            for piece in pieces:
                pos = 0
                for m in split.finditer(piece):
                    if m.start() > pos:
                        out.append(piece[pos : m.start()])
                    if m.end() > m.start():
                        out.append(m.group())
                    pos = m.end()
                if pos < len(piece):
                    out.append(piece[pos:])
            pieces = out
        return pieces

    def _encode_ordinary(self, text: str, ids: list[int]) -> None:
        if not text:
            return
        cache = self._piece_cache
        spell = bytes_to_unicode()
        for piece in self._pretokenize(text):
            cached = cache.get(piece)
            if cached is None:
                cached = self._bpe("".join(spell[b] for b in piece.encode()))
                if len(cache) >= self._max_cached_pieces:
                    cache.clear()
                cache[piece] = cached
            ids.extend(cached)

    def _bpe(self, word: str) -> tuple[int, ...]:
        """Merge the characters of one piece; heap entries are (rank, left position), stale ones skipped."""
        if self._ignore_merges and word in self._ids:
            return (self._ids[word],)
        symbols: list[str | None] = list(word)
        n, ranks = len(symbols), self._ranks
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        heap = [(r, i) for i in range(n - 1) if (r := ranks.get((word[i], word[i + 1]))) is not None]
        heapq.heapify(heap)
        while heap:
            rank, i = heapq.heappop(heap)
            j = nxt[i]
            if symbols[i] is None or j < 0 or ranks.get((symbols[i], symbols[j])) != rank:
                continue  # stale: one side was merged since this pair was pushed
            symbols[i] += symbols[j]
            symbols[j] = None
            nxt[i] = nxt[j]
            if nxt[i] >= 0:
                prv[nxt[i]] = i
            if prv[i] >= 0 and (r := ranks.get((symbols[prv[i]], symbols[i]))) is not None:
                heapq.heappush(heap, (r, prv[i]))
            if nxt[i] >= 0 and (r := ranks.get((symbols[i], symbols[nxt[i]]))) is not None:
                heapq.heappush(heap, (r, i))
        ids = tuple(self._ids.get(s, self._unknown_symbol_id) for s in symbols if s is not None)
        return ids if None not in ids else tuple(i for i in ids if i is not None)

    # ---- decode ------------------------------------------------------------------------------

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        if skip_special:
            ids = [i for i in ids if i not in self._special_ids]
        return b"".join(self._token_bytes[i] for i in ids).decode("utf-8", errors="replace")

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    # ---- chat --------------------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        """The conversation as text, through the model's chat template (as transformers renders it)."""
        if self.chat_template is None:
            raise InputError("this model's tokenizer has no chat template; pass a plain prompt (chat off)")
        if self._compiled_template is None:
            self._compiled_template = _chat_environment().from_string(self.chat_template)
        names = {"bos_token": self.bos_token_id, "eos_token": self.eos_token_id,
                 "pad_token": self.pad_token_id, "unk_token": self.unk_token_id}
        specials = {k: self.token_text(v) for k, v in names.items() if v is not None}
        return self._compiled_template.render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **specials
        )


# ---- builders -------------------------------------------------------------------------------


def _respell(token: str) -> str:
    """A token written outside the byte alphabet (e.g. raw UTF-8) in the byte alphabet."""
    if _byte_alphabet().issuperset(token):
        return token
    spell = bytes_to_unicode()
    return "".join(spell[b] for b in token.encode())


@lru_cache(maxsize=1)
def _byte_alphabet() -> frozenset[str]:
    return frozenset(bytes_to_unicode().values())


def tokenizer_from_gguf_metadata(meta: Mapping[str, Any]) -> Tokenizer:
    """From GGUF `tokenizer.*` metadata (values already decoded: lists of str / int)."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise InputError(f"GGUF tokenizer {model!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens = [_respell(t) for t in meta["tokenizer.ggml.tokens"]]
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    added = [
        AddedToken(tok, i, special=(ty == GGUF_TOKEN_TYPE_CONTROL))
        for i, (tok, ty) in enumerate(zip(tokens, types))
        if ty in (GGUF_TOKEN_TYPE_CONTROL, GGUF_TOKEN_TYPE_USER_DEFINED)
    ]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    return Tokenizer(
        tokens,
        merges,
        added,
        split_patterns=GGUF_PRE_SPLITS.get(meta.get("tokenizer.ggml.pre"), (GPT2_SPLIT,)),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
        unk_token_id=meta.get("tokenizer.ggml.unknown_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    )


def _split_patterns(pre: Mapping[str, Any] | None, source: Path) -> tuple[str, ...]:
    """Hugging Face pre_tokenizer -> isolated regex splits (the subset byte-level BPE models use)."""
    if pre is None:
        return ()
    kind = pre.get("type")
    if kind == "Sequence":
        return tuple(p for sub in pre["pretokenizers"] for p in _split_patterns(sub, source))
    if kind == "ByteLevel" and not pre.get("add_prefix_space", False):
        return (GPT2_SPLIT,) if pre.get("use_regex", True) else ()
    if kind == "Digits":
        return (r"[0-9]",) if pre.get("individual_digits", False) else (r"[0-9]+",)
    if kind == "Split" and pre.get("behavior") == "Isolated" and not pre.get("invert", False):
        pattern = pre["pattern"]
        return (pattern["Regex"],) if "Regex" in pattern else (regex.escape(pattern["String"]),)
    raise InputError(f"{source}: pre_tokenizer {json.dumps(pre)[:200]} is not supported")


def _token_content(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def tokenizer_from_hf_folder(folder: Path, config: Mapping[str, Any] | None = None) -> Tokenizer:
    """From tokenizer.json (+ tokenizer_config.json, chat_template.jinja) in a Hugging Face folder;
    special token ids fall back to `config` (config.json) when tokenizer_config.json lacks them."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"{folder}: no tokenizer.json")
    spec = json.loads(path.read_text())
    model = spec.get("model", {})
    if model.get("type") != "BPE" or spec.get("normalizer") is not None:
        raise InputError(f"{path}: only byte-level BPE without a normalizer is supported")
    added_specs = spec.get("added_tokens", [])
    size = max([*model["vocab"].values(), *(t["id"] for t in added_specs)], default=-1) + 1
    vocab = [""] * size
    for tok, i in model["vocab"].items():
        vocab[i] = tok
    added = [AddedToken(t["content"], t["id"], bool(t.get("special", False))) for t in added_specs]
    for t in added:
        vocab[t.id] = vocab[t.id] or _respell(t.content)
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
    tok_config_path = folder / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text()) if tok_config_path.is_file() else {}
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: use the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    by_content = {t.content: t.id for t in added} | {tok: i for i, tok in enumerate(vocab)}

    def special_id(name: str) -> int | None:
        content = _token_content(tok_config.get(f"{name}_token"))
        if content is not None and content in by_content:
            return by_content[content]
        value = (config or {}).get(f"{name}_token_id")
        return value[0] if isinstance(value, list) else value

    return Tokenizer(
        vocab,
        merges,
        added,
        split_patterns=_split_patterns(spec.get("pre_tokenizer"), path),
        bos_token_id=special_id("bos"),
        eos_token_id=special_id("eos"),
        pad_token_id=special_id("pad"),
        unk_token_id=special_id("unk"),
        chat_template=template,
        add_bos_token=bool(tok_config.get("add_bos_token", False)),
        ignore_merges=bool(model.get("ignore_merges", False)),
        unknown_symbol_id=by_content.get(model.get("unk_token")),
    )
