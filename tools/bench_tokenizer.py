"""Encode speed of SmolLM2's tokenizer, built from the GGUF metadata, on an ~85K-character text;
with `--old FILE`, also a tokenizer module of another version (e.g. the hand-written BPE before
the `tokenizers` library: `git show e4c65dc~1:src/dualpath/runtime/model/tokenizer.py > old.py`),
side by side in one run, and whether both give the same ids.

    .venv/bin/python tools/bench_tokenizer.py [--old old.py]
"""

import argparse
import collections
import dataclasses
import importlib.util
import inspect
import sys
import time
import typing

from dualpath.runtime.model import tokenizer as current
from dualpath.runtime.model.gguf_loader import _open, read_metadata
from dualpath.runtime.model.loader import smollm2_gguf_path


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("tokenizer_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", help="another tokenizer module to compare against")
    args = ap.parse_args()
    meta = read_metadata(_open(smollm2_gguf_path()))
    text = "".join(inspect.getsource(m) for m in (typing, argparse, dataclasses, collections))[:85_000]
    text += "\nnaïve café, Straße, 東京タワー, Москва, 🙂🚀 <|im_start|>user\nhi<|im_end|>\n"
    mods = [("current", current)] + ([("old", load_module(args.old))] if args.old else [])
    ids = {}
    for name, mod in mods:
        tok = mod.tokenizer_from_gguf_metadata(meta)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            ids[name] = tok.encode(text)
            times.append(time.perf_counter() - t0)
        n = len(ids[name])
        print(f"{name}: {n} tokens; first run {n / times[0]:,.0f} tok/s; mean of 5 {5 * n / sum(times):,.0f} tok/s")
    if args.old:
        print("same ids:", ids["current"] == ids["old"])


if __name__ == "__main__":
    main()
