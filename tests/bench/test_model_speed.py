"""`dualpath bench model-speed`: the per-repeat ratios and medians, the prefill's GEMM FLOPs
against torch's own count, and bad input."""

from __future__ import annotations

import pytest
from cli_helpers import cli_here
from torch.utils.flop_counter import FlopCounterMode

from dualpath.bench.model_speed import _prefill_gemm_flops, _summary, model_speed
from dualpath.runtime.model import load_model


def test_ratios_are_per_repeat_time_ratios_and_medians_of_rates():
    pairs = [{"ours_prefill": 1.0, "transformers_prefill": 1.5, "ours_decode": 4.0, "ours_gather_decode": 5.0,
              "transformers_decode": 6.0},
             {"ours_prefill": 2.0, "transformers_prefill": 2.0, "ours_decode": 3.0, "ours_gather_decode": 6.0,
              "transformers_decode": 6.0},
             {"ours_prefill": 1.0, "transformers_prefill": 1.2, "ours_decode": 5.0, "ours_gather_decode": 6.0,
              "transformers_decode": 5.0}]
    s = _summary(pairs, prompt_tokens=100, decode_tokens=60)
    assert s["tokens_per_s"]["ours_prefill"] == 100.0  # median of 100, 50, 100
    assert s["tokens_per_s"]["ours_decode"] == 15.0  # median of 15, 20, 12
    by = {(c["ours"], c["theirs"]): c for c in s["ratios"]}
    assert set(by) == {("ours_prefill", "transformers_prefill"), ("ours_decode", "transformers_decode"),
                       ("ours_gather_decode", "transformers_decode")}  # no last-logits run: no such row
    p = by[("ours_prefill", "transformers_prefill")]
    assert (p["median"], p["min"], p["max"]) == (1.2, 1.0, 1.5)
    d = by[("ours_decode", "transformers_decode")]
    assert (d["median"], d["min"], d["max"]) == (1.5, 1.0, 2.0)


def test_the_prefill_gemm_flops_are_the_ones_torch_counts():
    model = load_model("tiny", seed=0).model
    with FlopCounterMode(display=False) as counter:
        model.prefill([(0, list(range(1, 38)))])
    counts = counter.get_flop_counts()["Global"]
    gemm = sum(n for op, n in counts.items() if "mm" in str(op) and "bmm" not in str(op))
    assert gemm == _prefill_gemm_flops(model.config, 37)


@pytest.mark.parametrize("args", [["--repeats", "0"], ["--decode-batch", "0"], ["--threads", "0"]])
def test_bad_input_is_one_line_and_exit_2(args):
    p = cli_here("bench", "model-speed", *args)
    assert p.returncode == 2 and "must be at least 1" in p.stderr and "Traceback" not in p.stderr


def test_a_small_run_times_every_variant_each_repeat_and_summarises_them():
    """The tiny model, transformers loading the same weights from the folder ours writes: every
    repeat times the six runs, and the summary is made of those seconds."""
    pytest.importorskip("transformers")
    r = model_speed("tiny", prompt_tokens=24, decode_tokens=2, batch=2, repeats=2)
    names = {"ours_prefill", "ours_decode", "ours_gather_decode", "transformers_prefill",
             "transformers_prefill_last_logits", "transformers_decode"}
    assert [set(p) for p in r["seconds"]] == [names, names] and all(t > 0 for p in r["seconds"] for t in p.values())
    assert r["summary"] == _summary(r["seconds"], 24, 2 * 2)
    assert len(r["summary"]["ratios"]) == 4
