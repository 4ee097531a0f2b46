"""What the report says about calibration: knob kinds read from the config's comments, the
hardware-only estimate of a fitted knob, and headlines met by construction left out of the count."""

from dataclasses import dataclass, replace

import pytest

from dualpath.config import paper_cluster
from dualpath.experiments.common import Headline, with_hardware_only
from dualpath.experiments.knobs import (
    all_knob_rows, calibration_sentence, classify, comment_sources, demo_knob_rows, field_sources, hardware_only_assignments,
    hardware_only_knob_names, knob_counts,
)
from dualpath.experiments.simrun import SimSpec, _cache_key, hardware_only, sim_config
from dualpath.experiments.suite import _counts
from dualpath.sim.compute import ComputeModel


def test_knob_kinds_are_read_from_the_config_comments():
    knobs = {k.name: k for k in all_knob_rows()}
    fig3 = knobs["compute.fig3_overhead_per_request_ratio"]
    assert fig3.kind == "fitted" and fig3.figure == "Fig. 3 right" and "t0 = 2.5 * t1" in fig3.source
    assert fig3.hardware_only == ("compute.prefill_forward_overhead_s=0",)
    assert knobs["compute.prefill_forward_overhead_s"].kind == "fitted"  # the same comment block
    assert hardware_only_knob_names() == ("compute.prefill_forward_overhead_s", "compute.fig3_overhead_per_request_ratio")
    assert {n for n, k in knobs.items() if k.kind == "choice"} == {
        "cluster.storage_egress_bytes_per_s", "cluster.reads_in_flight_per_node", "cluster.hbm_usable_fraction",
        "cluster.storage_read_latency_s", "cluster.prefill_snic_scale", "cluster.ep_group_prefill_nodes",
        "cluster.ep_group_decode_nodes", "cluster.dram_tier_gb_per_node", "scheduler.recompute_when_faster",
        "scheduler.split_min_blocks", "scheduler.local_prefill_max_tokens",
        "metrics.balance_window_s", "metrics.balance_min_utilisation", "generator.EXTRA_PREFIX_TOKENS",
        "generator.FIRST_PROMPT_SIGMA", "generator.FIRST_PROMPT_CAP_FRACTION", "generator.APPEND_TURN_SIGMA",
        "generator.GEN_RATE_SIGMA", "generator.GEN_TURN_SIGMA", "generator.GEN_CAP_FRACTION", "generator.MAX_TURNS_UP_TO_64K"}
    assert knobs["compute.prefill_mfu"].kind == "hardware" and knobs["scheduler.z_factor"].kind == "paper"
    assert all(k.kind != "unclassified" for k in knobs.values())
    assert not any(k.source.startswith(("fitted", "choice")) for k in knobs.values())  # markers stripped


def test_the_generator_parameters_are_fitted_to_table_2():
    """Each MaxLen anchor's six GeneratorParams, read from the comment above CALIBRATED, with the
    value the generator runs; no hardware-only estimate, so the hardware-only runs keep them."""
    from dualpath.workloads.generator import CALIBRATED

    knobs = {k.name: k for k in all_knob_rows()}
    table2 = {n: k for n, k in knobs.items() if k.kind == "fitted" and k.figure == "Table 2"}
    assert len(table2) == 6 * len(CALIBRATED) == 18
    assert table2["generator.CALIBRATED[64K].stop_sigma"].value == CALIBRATED[65536].stop_sigma
    assert all("Nelder-Mead" in k.source and not k.hardware_only for k in table2.values())
    assert knobs["generator.BASE_SET_SIZE"].kind == "paper"
    assert knob_counts()["fitted"] == {"Fig. 3 right": 2, "Table 2": 18}
    assert sum(v for kind, v in knob_counts().items() if kind != "fitted") + 20 == len(knobs)


def test_the_runtime_demo_knob_is_read_from_its_comment():
    from dualpath.runtime.profile.emulation import LOAD_OVER_COMPUTE

    (demo,) = demo_knob_rows()
    assert demo.value == LOAD_OVER_COMPUTE and demo.kind == "fitted" and demo.figure == "Fig. 1"
    assert demo.name not in {k.name for k in all_knob_rows()}  # behind no headline


def test_comment_sources_reads_module_constants_as_fields():
    lines = ["A = 1  # trailing", "# block for B", "B: int = 2", "C = 3", "", "D = 4"]
    assert comment_sources(lines, "ABCD") == {"A": "trailing", "B": "block for B", "C": "block for B", "D": ""}


def test_classify_reads_the_markers_of_any_dataclass():
    @dataclass
    class K:
        # fitted (Fig. 9 left; hardware-only: compute.a=1, compute.b=none): a value read off a figure
        a: float = 2.0
        b: int = 3  # choice: ours
        c: int = 4  # docs/hardware.md §1.1
        d: int = 5  # docs/paper.md §3.3
        e: int = 6  # a reason without a source

    src = field_sources(K)
    kinds = {name: classify(name, 0, src[name]) for name in "abcde"}
    assert kinds["a"].kind == "fitted" and kinds["a"].figure == "Fig. 9 left"
    assert kinds["a"].hardware_only == ("compute.a=1", "compute.b=none") and kinds["a"].source == "a value read off a figure"
    assert [kinds[n].kind for n in "bcde"] == ["choice", "hardware", "paper", "unclassified"]
    assert kinds["b"].kind_label == "project choice" and kinds["a"].kind_label == "fitted to Fig. 9 left"


def test_hardware_only_estimate_is_the_ep_latency_term_alone():
    """DS 660B: the Fig. 3 rule gives ~0.27 s per prefill forward; without it, 61 layers x 0.29 ms."""
    spec = SimSpec("ds-v3.2-660b", "2P4D", 65536, 16, "dualpath")
    overheads = []
    for s in (spec, hardware_only(spec)):
        cfg = sim_config(s, 1)
        cl = cfg.cluster
        cm = ComputeModel(cl.model_spec, cl.gpu_spec, cfg.compute, cl.node.gpus_per_node,
                          cl.weight_shards(cl.num_prefill_nodes), cl.weight_shards(cl.num_decode_nodes))
        overheads.append(cm.prefill_overhead_s)
    knobs = sim_config(spec, 1).compute
    assert overheads[1] == pytest.approx(knobs.ep_latency_per_layer_s * 61) == pytest.approx(0.0177, rel=0.01)  # ~18 ms
    assert overheads[0] == pytest.approx(0.267, abs=0.001)  # the value config.py's comment states
    assert sim_config(hardware_only(spec), 1).cluster == sim_config(spec, 1).cluster == paper_cluster("ds-v3.2-660b")
    assert _cache_key(hardware_only(spec), 1) != _cache_key(spec, 1)
    assert "[compute.prefill_forward_overhead_s=0]" in hardware_only(spec).label()


def test_with_hardware_only_pairs_by_metric_and_skips_by_construction():
    base = [Headline("x", "a", 2.0, 1.87, 0.15), Headline("x", "b", 1.5, 1.53, 0.1, by_construction="arithmetic"),
            Headline("x", "c", 1.0, 1.0, 0.1)]
    alt = [Headline("x", "a", 2.28, 1.87, 0.15), Headline("x", "b", 9.0, 1.53, 0.1)]
    a, b, c = with_hardware_only(base, alt, why_missing="not run")
    assert a.hardware_only == 2.28 and a.fitted == hardware_only_knob_names() and a.met and not a.hardware_only_met
    assert a.hardware_only_rel_error == pytest.approx(2.28 / 1.87 - 1)
    assert b == base[1] and not b.counted
    assert c.hardware_only is None and c.hardware_only_met is None and c.note == "not run"
    assert Headline.from_dict(a.to_dict()) == a


def test_counts_leave_out_headlines_met_by_construction():
    hs = [Headline("x", "a", 1.0, 1.0, 0.1), Headline("x", "b", 1.5, 1.53, 0.1, by_construction="arithmetic"),
          replace(Headline("x", "c", 2.0, 1.0, 0.1), fitted=("k",), hardware_only=1.05),
          replace(Headline("x", "d", 1.0, 1.0, 0.1), fitted=("k",))]
    c = _counts([h.to_dict() for h in hs])
    assert c == {"headlines": 3, "met": 2, "by_construction": 1, "hardware_only_simulated": 1, "hardware_only_met": 1,
                 "fitted_without_hardware_only": 1, "simulated": 3, "simulated_met": 2, "arithmetic": 0, "arithmetic_met": 0,
                 "derived": 0, "derived_met": 0, "unidentified": 3}


def test_calibration_sentence_names_the_fitted_knob_and_its_estimate():
    text = calibration_sentence()
    assert "nothing is tuned" not in text
    assert "`compute.fig3_overhead_per_request_ratio`" in text and "Fig. 3 right" in text
    assert hardware_only_assignments()[0] in text
    assert "`generator.CALIBRATED` (18 values)" in text and "those fitted to Table 2 have none" in text


def test_field_sources_reads_trailing_block_and_group_comments():
    @dataclass
    class K:
        a: int = 1  # trailing
        # block for b
        # and c
        b: int = 2
        c: int = 3

        d: int = 4

    assert field_sources(K) == {"a": "trailing", "b": "block for b and c", "c": "block for b and c", "d": ""}
