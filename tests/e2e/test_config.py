import pytest

from dualpath.config import (EngineTransport, FaultPolicy, ForcedSide, KvTransfer, MooncakeProtocol, RuntimeConfig, SimConfig,
                             TensorParallelConfig, paper_cluster, parse_mode, parse_pd)
from dualpath.config.overrides import apply_overrides, config_from_json, config_to_json, set_fields
from dualpath.parsing import parse_tokens
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


def test_the_runtime_config_takes_the_same_spelling_in_sections_with_choices_as_enums():
    c = apply_overrides(RuntimeConfig(model="tiny"), ["faults.policy=fail", "engines.torch_threads=4", "store.location=/srv/kv",
                                                      "links.snic_bytes_per_s=2e6", "force_read_side=decode",
                                                      "transport.kind=tcp"])
    assert c.faults.policy is FaultPolicy.FAIL and c.transport.kind is EngineTransport.TCP
    assert c.force_read_side is ForcedSide.DECODE and c.engines.torch_threads == 4 and c.store.location == "/srv/kv"
    assert c.links.snic_bytes_per_s == 2e6 and c.links.cnic_rate == 8 * 2e6  # the CNIC follows the SNIC (8 per node)
    again = config_from_json(RuntimeConfig, config_to_json(c))  # what a joining engine is sent
    assert again == c and again.faults.policy is FaultPolicy.FAIL
    # values by path, a whole section too (a joined engine's own tensor-parallel placement)
    d = set_fields(c, {"faults.retries": 0, "tp": TensorParallelConfig(2), "num_decode": 2})
    assert (d.faults.retries, d.tp.ranks, d.num_decode, d.faults.policy) == (0, 2, 2, FaultPolicy.FAIL)


@pytest.mark.parametrize("bad,needle", [
    ("faults.policy=retry", "faults.policy must be one of recompute, fail, got 'retry'"),
    ("kv_dtype=int8", "kv_dtype must be one of float32, bfloat16, float16"),
    ("engines.de_kv_tokens=0", "engines.de_kv_tokens must be positive"),
    ("store.persist_wait_s=-1", "store.persist_wait_s must be >= 0"),
    ("faults=1", "is a section"),
    ("links.snic_bytes_per_s=fast", "expected a number"),
])
def test_bad_runtime_overrides_name_the_problem(bad, needle):
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        apply_overrides(RuntimeConfig(), [bad])


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


def test_the_kv_transfer_is_a_choice_of_its_own_beside_the_transport_kind():
    c = apply_overrides(RuntimeConfig(model="tiny"), ["transport.kind=tcp", "transport.transfer=mooncake",
                                                      "transport.mooncake_protocol=rdma",
                                                      "transport.mooncake_devices=mlx5_0,mlx5_1", "transport.mooncake_kv_sl=3"])
    t = c.transport
    assert (t.kind, t.transfer, t.mooncake_protocol) == (EngineTransport.TCP, KvTransfer.MOONCAKE, MooncakeProtocol.RDMA)
    assert (t.mooncake_devices, t.mooncake_kv_sl) == ("mlx5_0,mlx5_1", 3)
    assert config_from_json(RuntimeConfig, config_to_json(c)) == c  # what a joining engine is sent
    assert RuntimeConfig(model="tiny").transport.transfer is KvTransfer.REMOTE_WRITE  # the default
    for bad, needle in [(["transport.transfer=mooncake"], "needs transport.kind tcp"),  # one host: shared memory
                        (["transport.kind=tcp", "transport.transfer=nccl"], "transport.transfer must be one of"),
                        (["transport.mooncake_protocol=ib"], "transport.mooncake_protocol must be one of"),
                        (["transport.mooncake_kv_sl=16"], r"mooncake_kv_sl must be in \[0, 15\]")]:
        with pytest.raises(InputError, match=needle):
            apply_overrides(RuntimeConfig(model="tiny"), bad)
