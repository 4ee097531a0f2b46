import pytest

from dualpath.config import SimConfig, paper_cluster, parse_mode, parse_pd
from dualpath.parsing import parse_tokens
from dualpath.config_overrides import apply_overrides
from dualpath.errors import InputError


def test_overrides_reach_nested_fields_with_their_types():
    c = apply_overrides(SimConfig(), ["compute.ep_latency_per_layer_s=5e-4", "cluster.node.storage_read_bytes_per_s=none",
                                      "scheduler.basic_tokens_per_forward=8192", "cluster.expert_parallel=false"])
    assert c.compute.ep_latency_per_layer_s == 5e-4
    assert c.cluster.node.storage_read_bytes_per_s is None
    assert c.cluster.node.snic_read_bytes_per_s == c.cluster.node.snic_bytes_per_s
    assert c.scheduler.basic_tokens_per_forward == 8192 and c.cluster.expert_parallel is False


@pytest.mark.parametrize("bad,needle", [
    ("compute.nope=1", "has no field 'nope'"),
    ("compute=3", "is a section"),
    ("compute.prefill_mfu=abc", "expected a number"),
    ("compute.prefill_mfu=2", "must be in (0, 1]"),
    ("noequals", "path=value"),
])
def test_bad_overrides_name_the_problem(bad, needle):
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        apply_overrides(SimConfig(), [bad])


def test_parsers():
    assert parse_pd("2P4D") == (2, 4) and parse_pd(" 48p96d ") == (48, 96)
    assert parse_tokens("64k") == 65536 and parse_tokens("4096") == 4096
    f = parse_mode("basic+layerwise+de_read")
    assert (f.layerwise_prefill, f.de_read_path, f.dualpath_scheduler, f.io_free) == (True, True, False, False)
    assert parse_mode("oracle").io_free


def test_paper_presets():
    ds = paper_cluster("ds-v3.2-660b")
    assert (ds.num_prefill_nodes, ds.num_decode_nodes) == (2, 4)
    qw = paper_cluster("qwen2.5-32b")
    assert (qw.num_prefill_nodes, qw.num_decode_nodes) == (1, 2) and not qw.expert_parallel
    assert qw.node.dram_buffer_bytes == 320e9
    with pytest.raises(InputError, match="does not fit"):
        paper_cluster("ds-v3.2-660b", "1P1D").kv_hbm_bytes_per_gpu(1)
