"""CUDA path check for the runtime model (needs a GPU; CI has none, so this is not a test).

    PYTHONPATH=src python3 tools/cuda_check.py [--json OUT.json]

Checks, on the built-in `tiny` model (random weights, no download):
  1. greedy generation on CUDA gives the same tokens as on the CPU;
  2. layerwise prefill on CUDA with cached KV that arrives as Layer Block bytes in a pinned host
     buffer (copied to the GPU asynchronously) gives the same logits as recomputing from scratch
     on CUDA, and the same new KV;
  3. a layer's KV round-trips GPU -> pinned host bytes -> GPU bit-exactly.
Prints one line per check and exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from dualpath.errors import InputError
from dualpath.runtime.engine.device import require_device
from dualpath.runtime.model import generate, layer_kv_from_bytes, layer_kv_to_bytes, load_model
from dualpath.runtime.model.kv_layout import host_kv_buffer

LOGIT_ATOL = 1e-3  # fp32 on two devices; the CPU tests use 1e-4 on one device


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda", help="cuda; or cpu to dry-run the script itself (no pinning)")
    args = ap.parse_args()
    dev = args.device
    try:
        require_device(dev)
    except InputError as e:
        print(e)
        return 2
    pin = dev != "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # compare fp32 with fp32
    name = torch.cuda.get_device_name(dev) if pin else "cpu (dry run)"
    out: dict = {"device": name, "torch": torch.__version__, "checks": {}}
    cpu = load_model("tiny", device="cpu").model
    gpu = load_model("tiny", device=dev).model
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, cpu.config.vocab_size, (n,), generator=gen).tolist() for n in (37, 130, 301)]

    # 1. same greedy tokens on both devices
    tok = load_model("tiny").tokenizer
    same = []
    for p in prompts:
        a = generate(cpu, tok, p, 24, stop_at_eos=False).generated_ids
        b = generate(gpu, tok, p, 24, stop_at_eos=False).generated_ids
        same.append(a == b)
    out["checks"]["greedy_tokens_cpu_eq_cuda"] = {"ok": all(same), "per_prompt": same}

    # 2. layerwise prefill from pinned host bytes == recompute, on CUDA
    cuts = [0, 64, 256]
    with torch.no_grad():
        prefix = gpu.prefill([(0, p[:c]) for p, c in zip(prompts, cuts) if c])
        with_prefix = [i for i, c in enumerate(cuts) if c]
        state = gpu.begin_prefill([(c, p[c:]) for p, c in zip(prompts, cuts)])
        new_kv = []
        for layer in range(gpu.config.num_layers):
            row = []
            for i in range(len(prompts)):
                if not cuts[i]:
                    row.append(None)
                    continue
                kv = prefix.new_kv[layer][with_prefix.index(i)]
                host = host_kv_buffer(gpu.config, kv.num_tokens, gpu.dtype, pin_memory=pin)
                layer_kv_to_bytes(kv, out=host)
                row.append(layer_kv_from_bytes(host, gpu.config, gpu.dtype))  # pinned host; prefill copies async
            new_kv.append(gpu.prefill_layer(state, layer, row))
        logits = gpu.finish_prefill(state)
        full = gpu.prefill([(0, p) for p in prompts])
        logit_err = (logits - full.logits).abs().max().item()
        kv_err = max((new_kv[layer][i].kv - full.new_kv[layer][i].kv[cuts[i]:]).abs().max().item()
                     for layer in range(gpu.config.num_layers) for i in range(len(prompts)))
    out["checks"]["layerwise_from_pinned_bytes_eq_recompute"] = {
        "ok": logit_err <= LOGIT_ATOL and kv_err <= LOGIT_ATOL, "max_logit_err": logit_err, "max_kv_err": kv_err}

    # 3. GPU -> pinned host bytes -> GPU, bit-exact, and its time
    kv = full.new_kv[0][2]
    host = host_kv_buffer(gpu.config, kv.num_tokens, gpu.dtype, pin_memory=pin)
    t0 = time.perf_counter()
    layer_kv_to_bytes(kv, out=host)
    back = layer_kv_from_bytes(host, gpu.config, gpu.dtype, device=dev)
    if pin:
        torch.cuda.synchronize()
    out["checks"]["pinned_round_trip_bit_exact"] = {
        "ok": bool(torch.equal(back.kv, kv.kv)), "pinned": bool(host.is_pinned()), "bytes": host.numel(),
        "wall_s": time.perf_counter() - t0}

    ok = all(c["ok"] for c in out["checks"].values())
    for name, c in out["checks"].items():
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {name}: {json.dumps({k: v for k, v in c.items() if k != 'ok'})}")
    print(json.dumps({"device": out["device"], "torch": out["torch"], "all_ok": ok}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
