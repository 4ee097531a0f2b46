"""The planner's space: the paper's bottleneck-free range from the node's numbers, the shapes a
budget allows and the unit each is simulated at."""

import pytest

from dualpath.costmodel.hardware import GB, NodeSpec
from dualpath.errors import InputError
from dualpath.plan.space import min_nodes_per_role, pd_range, shapes


def test_the_paper_node_gives_the_papers_range_and_names_what_binds_outside_it():
    r = pd_range(NodeSpec())  # g = 8, s = 1, M / (Bs) = 500 / 50
    assert r.low == pytest.approx(1 / 7) and r.high == pytest.approx(3.5)  # docs/paper.md §1.6: 1/7 <= P/D <= 7/2
    assert r.violated(1 / 7) is None and r.violated(3.5) is None and r.violated(1.0) is None
    assert r.violated(1 / 8) == "PE CNIC"
    assert r.violated(4.0) == "DE CNIC"  # CNIC write and DRAM both bind at 3.5; the CNIC is named
    slow_dram = pd_range(NodeSpec(), node_dram_bytes_per_s=300 * GB)  # (6 - 3) / 2 = 1.5 < 3.5
    assert slow_dram.high == pytest.approx(1.5) and slow_dram.violated(2.0) == "DE DRAM"
    fat_snic = pd_range(NodeSpec(snic_bytes_per_s=100 * GB))  # s = 2: 2/6 <= P/D <= min(2, 1.5, 1)
    assert fat_snic.low == pytest.approx(1 / 3) and fat_snic.high == pytest.approx(1.0)


def test_a_budget_spends_every_node_and_each_shape_reduces_to_its_smallest_unit_that_holds_the_weights():
    assert min_nodes_per_role("ds-v3.2-660b") == 2 and min_nodes_per_role("ds-27b") == 1
    got = {s.pd: (s.unit_pd, s.copies) for s in shapes("ds-v3.2-660b", 128, 4096)}
    assert list(got) == [f"{p}P{16 - p}D" for p in range(2, 15)]
    assert got["8P8D"] == ("2P2D", 4)
    assert got["4P12D"] == ("2P6D", 2)  # 1P3D would not hold DS 660B's weights
    assert got["2P14D"] == ("2P14D", 1) and got["3P13D"] == ("3P13D", 1)
    assert {s.pd: s.unit_pd for s in shapes("ds-27b", 64, 256)}["2P6D"] == "1P3D"
    # the agents must split evenly too
    assert {s.pd: s.unit_pd for s in shapes("ds-27b", 64, 250)}["4P4D"] == "2P2D"


@pytest.mark.parametrize("gpus, words", [(12, "multiple of 8"), (0, "multiple of 8"), (24, "at least 2 node(s) per role")])
def test_a_budget_that_cannot_hold_the_model_is_refused_by_name(gpus, words):
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")):
        shapes("ds-v3.2-660b", gpus, 64)


def test_a_reduced_shape_is_deployed_as_units_each_with_its_own_ep_groups():
    got = {s.pd: s for s in shapes("ds-v3.2-660b", 128, 4096)}
    assert got["4P12D"].ep_knobs() == ("cluster.ep_group_prefill_nodes=2", "cluster.ep_group_decode_nodes=6")
    assert got["3P13D"].ep_knobs() == ()  # its own unit: one group per role, as a plain `dualpath sim`
