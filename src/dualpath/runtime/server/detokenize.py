"""Text from tokens for streaming: incremental detokenization that never splits a UTF-8
character, and stop strings."""

from __future__ import annotations

from dualpath.runtime.api import TokenizerLike

REPLACEMENT_CHAR = "\ufffd"  # what decode(errors="replace") gives for an incomplete UTF-8 tail


# ---- text from tokens --------------------------------------------------------------------------


class IncrementalDetokenizer:
    """Token ids in, text deltas out. A delta never ends inside a UTF-8 character: bytes of an
    incomplete character are held back until it completes (or `flush`). The deltas concatenate
    to `decode(all ids, skip_special=True)`.

    Each step decodes a window from `_prefix` (a character boundary, kept for tokenizers whose
    decode of a slice depends on the token before it) to the end; `_read` marks what was emitted."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        decode = self._tokenizer.decode
        emitted = decode(self._ids[self._prefix : self._read], skip_special=True)
        text = decode(self._ids[self._prefix :], skip_special=True)
        if not final and (len(text) <= len(emitted) or text.endswith(REPLACEMENT_CHAR)):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(emitted) :]


class StopStrings:
    """Holds back the text that could still become a stop string; once one appears, `stopped`
    is set and the text from the stop string on is dropped (OpenAI does not return it)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._hold_chars = max((len(s) for s in stops), default=1) - 1
        self._pending = ""  # text not yet returned; no stop string starts before it
        self.stopped = False

    def feed(self, text: str, final: bool) -> str:
        if not self._stops:
            return text
        self._pending += text
        hits = [i for s in self._stops if (i := self._pending.find(s)) >= 0]
        if hits:
            self.stopped = True
            out, self._pending = self._pending[: min(hits)], ""
            return out
        keep = 0 if final else min(self._hold_chars, len(self._pending))
        out, self._pending = self._pending[: len(self._pending) - keep], self._pending[len(self._pending) - keep :]
        return out


