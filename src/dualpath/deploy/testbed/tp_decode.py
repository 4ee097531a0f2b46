"""A tensor-parallel decode engine's step loop, driven line by line (`bench tp-lanes`, its test).

`python -m dualpath.deploy.testbed.tp_decode --model M --batch B ...` is rank 0: it loads the model, runs
a batch of B prompts one process only (the reference), starts rank 1 (tp_launch.py, possibly in
another namespace), checks that the same prefill and first decode steps give the same greedy
tokens with two ranks, and prints one JSON line: {"ready", "same_tokens", "payload_bytes_per_step"}.
Then, per stdin line:
  `measure NAME STEPS`  the B sequences restart from their prompt's KV (so every measurement
                        attends over the same lengths), WARMUP_STEPS untimed, then STEPS timed
                        decode steps: one JSON line {"name", "step_s": [...], "payload_bytes"};
  `prefill NAME N`      N timed prefills of the first prompt alone (no cached KV): the compute and
                        collectives of a request's first token, its TTFT on an idle engine:
                        one JSON line {"name", "prefill_s": [...], "payload_bytes"};
  `quit`                stop rank 1 and exit.
A decode step of B sequences yields one token each: its time is the batch's TPOT.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ...runtime.model import PagedKVCache, load_model
from ...runtime.model.tp_launch import TpPlacement, start_tensor_parallel

WARMUP_STEPS = 3  # untimed steps before each measurement: caches and the TCP windows settle (project choice)
CHECK_STEPS = 4  # decode steps compared token for token between one and two ranks
PROMPT_SEED = 1234


def _prompts(vocab: int, batch: int, prompt_tokens: int) -> list[tuple[int, ...]]:
    gen = torch.Generator().manual_seed(PROMPT_SEED)
    return [tuple(torch.randint(0, vocab, (prompt_tokens,), generator=gen).tolist()) for _ in range(batch)]


class DecodeBatch:
    """B sequences: their prompt KV (kept), a paged cache rebuilt from it per measurement."""

    def __init__(self, model, prompts: list[tuple[int, ...]], max_steps: int) -> None:
        self.model, self.prompts = model, prompts
        result = model.prefill([(0, p) for p in prompts])
        self.prompt_kv = [[layer[i] for layer in result.new_kv] for i in range(len(prompts))]
        self.first = [int(t) for t in result.logits.argmax(-1)]
        bt = 16
        per_seq = -(-(len(prompts[0]) + max_steps + 1) // bt)
        self.cache = PagedKVCache(model.config, num_blocks=per_seq * len(prompts), block_tokens=bt, dtype=model.dtype)
        self.last: list[int] = []

    def restart(self) -> None:
        for sid in self.cache.seq_ids:
            self.cache.free(sid)
        for sid, kv in enumerate(self.prompt_kv):
            self.cache.load_prompt(sid, kv)
        self.last = list(self.first)

    def step(self) -> list[int]:
        logits = self.model.decode_step(self.cache, list(range(len(self.prompts))), self.last)
        self.last = [int(t) for t in logits.argmax(-1)]
        return self.last


def _greedy(batch: DecodeBatch, steps: int) -> list[list[int]]:
    batch.restart()
    return [list(batch.first)] + [batch.step() for _ in range(steps)]


def _prefills(model, prompt: tuple[int, ...], repeats: int, name: str, tp) -> dict:
    before = tp.collectives.payload_bytes
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.prefill([(0, prompt)])
        times.append(time.perf_counter() - t0)
    return {"name": name, "prefill_s": times, "payload_bytes": tp.collectives.payload_bytes - before}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tp_decode")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=256, help="most timed + warm-up steps of one measurement")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--leader-host", default="127.0.0.1")
    p.add_argument("--follower-host", default="127.0.0.1")
    p.add_argument("--follower-netns", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.model, seed=args.seed).model
    prompts = _prompts(model.config.vocab_size, args.batch, args.prompt_tokens)
    want = _greedy(DecodeBatch(model, prompts, CHECK_STEPS), CHECK_STEPS)
    prefix = () if args.follower_netns is None else ("ip", "netns", "exec", args.follower_netns)
    tp = start_tensor_parallel(model, args.model, args.seed, args.threads,
                               TpPlacement(args.leader_host, args.follower_host, prefix), 120.0)
    try:
        batch = DecodeBatch(model, prompts, args.max_steps)
        got = _greedy(batch, CHECK_STEPS)
        before = tp.collectives.payload_bytes
        batch.step()
        per_step = tp.collectives.payload_bytes - before
        print(json.dumps({"ready": True, "same_tokens": got == want, "payload_bytes_per_step": per_step}), flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "quit":
                break
            name, steps = words[1], int(words[2])
            if words[0] == "prefill":
                print(json.dumps(_prefills(model, prompts[0], steps, name, tp)), flush=True)
                continue
            batch.restart()
            for _ in range(WARMUP_STEPS):
                batch.step()
            before = tp.collectives.payload_bytes
            times = []
            for _ in range(min(steps, args.max_steps - WARMUP_STEPS)):
                t0 = time.perf_counter()
                batch.step()
                times.append(time.perf_counter() - t0)
            print(json.dumps({"name": name, "step_s": times, "payload_bytes": tp.collectives.payload_bytes - before}),
                  flush=True)
    finally:
        tp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
