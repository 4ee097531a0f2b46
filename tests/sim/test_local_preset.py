"""The simulator's `local` preset (core/measured.py, sim/compute_measured.py, fidelity/preset.py):
measured step times drive forwards and decode steps; the runtime's models have specs that match
the runtime's loader; the budgets follow the runtime's rules."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dualpath.config import EngineConfig, LinkConfig, RuntimeConfig, parse_mode
from dualpath.core.measured import MeasuredMachine, causal_keys
from dualpath.costmodel.models import SMOLLM2_135M, TINY
from dualpath.core.request import TurnSpec
from dualpath.errors import InputError
from dualpath.fidelity.preset import local_sim_config
from dualpath.metrics.decisions import DecisionLog
from dualpath.metrics.timeline import NULL_TIMELINE
from dualpath.sim.cpu_share import NO_CPU_SHARE
from dualpath.sim.compute_measured import MeasuredCompute
from dualpath.sim.simulator import Simulator
from dualpath.workloads import Trajectory

NO_TIER_FEATURES = SimpleNamespace(dram_tier=False)  # a fake context's mode: no `+dram` (sim/persists.py)


def _machine(**kw) -> MeasuredMachine:
    base = dict(prefill_fixed_s=0.01, prefill_per_token_s=1e-4, prefill_per_key_s=1e-7, decode_fixed_s=0.005,
                decode_per_seq_s=1e-3, decode_per_key_s=1e-6, quota_attention_flops_per_s=640e12,
                attention_flops_per_key=TINY.attn_flops_per_key, pe_landing_bytes=64 * 2**20, de_kv_tokens=32768,
                source="test")
    base.update(kw)
    return MeasuredMachine(**base)


def test_measured_compute_is_the_profile_fit():
    m = _machine()
    cm = MeasuredCompute(m)
    # one entry of 64 new tokens over 128 cached: fixed + tokens + keys
    attn = cm.attention_time_s(128, 64)
    assert attn == pytest.approx(1e-7 * (64 * 128 + 64 * 65 / 2))
    assert cm.prefill_forward_s(attn, 64) == pytest.approx(m.prefill_s(64, 128))
    # decode: the batch padded to its longest context (the runtime's decode_step gathers [B, L])
    m = _machine(decode_per_ctx_s=2e-5)
    cm = MeasuredCompute(m)
    assert cm.decode_pads_to_longest()
    assert [cm.decode_request_cost(c)[0] for c in (100, 300)] == [100, 300]
    assert cm.padded_decode_step_s(2, 300) == pytest.approx(0.005 + 2 * 1e-3 + 2e-5 * 300 + 1e-6 * 2 * 300)
    # the quota counts attention FLOPs at the runtime's quota rate
    assert cm.quota_attention_s(128, 64) == pytest.approx(TINY.attn_flops_per_key * causal_keys(64, 128) / 640e12)


def test_beta_derives_from_the_point_the_runtime_pe_measures():
    """Both worlds take the PE's prompt-token rate at the same probe point (core/measured.py): the
    runtime's PE times it at start, the local preset reads it from the profile, whatever the
    workload's turns (the paper preset uses the workload's mean turn)."""
    import inspect

    from dualpath.core.measured import PROBE_CACHED_TOKENS, PROBE_NEW_TOKENS
    from dualpath.runtime.engine.prefill import PrefillEngine

    m = _machine()
    rate = (PROBE_CACHED_TOKENS + PROBE_NEW_TOKENS) / m.prefill_s(PROBE_NEW_TOKENS, PROBE_CACHED_TOKENS)
    cm = MeasuredCompute(m)
    assert cm.prefill_tokens_per_s_per_gpu(900, 900, 1) == cm.prefill_tokens_per_s_per_gpu(64, 8, 5) == pytest.approx(rate)
    assert "PROBE_CACHED_TOKENS, PROBE_NEW_TOKENS" in inspect.getsource(PrefillEngine._profile)
    rt = RuntimeConfig(model="tiny", links=LinkConfig(snic_bytes_per_s=1e6))
    sim = Simulator(local_sim_config(rt, _profile(m), TINY.kv_bytes_per_token, "test"), parse_mode("dualpath"),
                    [Trajectory(0, (TurnSpec(500, 3),))], [0.0])
    assert sim.profile["beta_tokens"] == int(rt.scheduler.beta_compute_s * sim.compute.m.probe_prompt_tokens_per_s())


@pytest.mark.parametrize("spec,name", [(TINY, "tiny"), (SMOLLM2_135M, "smollm2-135m")])
def test_model_specs_match_the_runtime_loader(spec, name):
    from dualpath.runtime.model import load_model

    c = load_model(name, device="cpu").model.config  # `make test` installs the SmolLM2 wheel: a failure is a bug
    assert spec.num_layers == c.num_layers
    assert spec.kv_bytes_per_token_per_layer == c.kv_bytes_per_token_per_layer(__import__("torch").float32)
    assert spec.attn_flops_per_key == 4 * c.num_heads * c.head_dim * c.num_layers


def _profile(machine: MeasuredMachine):
    fit = SimpleNamespace
    return SimpleNamespace(prefill_fit=fit(fixed_s=machine.prefill_fixed_s, per_item_s=machine.prefill_per_token_s,
                                           per_key_s=machine.prefill_per_key_s),
                           decode_fit=fit(fixed_s=machine.decode_fixed_s, per_item_s=machine.decode_per_seq_s,
                                          per_key_s=machine.decode_per_key_s, per_ctx_s=machine.decode_per_ctx_s))


def test_a_decode_step_takes_the_longest_running_context():
    """Two sequences join one decode group at once, of 100 and 1,000 tokens: while both run each
    step costs the batch padded to the longer one (2 x its context); once the short one leaves, one
    sequence at its own length. Finish times follow exactly (fluid steps, sim/decode.py)."""
    import dualpath.sim.decode as decode_mod
    from dualpath.sim.events import EventLoop

    if not decode_mod.__file__.endswith(".py"):
        pytest.skip("the compiled build is imported; its classes take no stand-ins")
    per_key_s = 1e-5
    m = _machine(decode_fixed_s=0.0, decode_per_seq_s=0.0, decode_per_key_s=per_key_s, decode_per_ctx_s=0.0)
    loop, done = EventLoop(), {}
    ctx = SimpleNamespace(loop=loop, compute=MeasuredCompute(m), net=None, cpu=NO_CPU_SHARE, features=NO_TIER_FEATURES,
                          cfg=SimpleNamespace(cluster=SimpleNamespace(model="tiny", decode_waits_for_step_end=False), local=m),
                          timeline=NULL_TIMELINE)
    life = SimpleNamespace(decode_finished=lambda r: done.setdefault(r.input_tokens, loop.now_s))
    eng = SimpleNamespace(index=0, track="DE0")
    group = decode_mod.DecodeGroup(ctx, life, SimpleNamespace(engines=[eng]))
    for n, gen in ((100, 11), (1000, 21)):  # 10 and 20 decode steps
        group.join(SimpleNamespace(input_tokens=n, gen_tokens=gen, t_second=-1.0), eng)
    loop.run()
    longest = 1000 + 21 / 2  # a request's mean context over its decode (the fluid model's)
    both_s, alone_s = per_key_s * 2 * longest, per_key_s * longest
    assert done[100] == pytest.approx(10 * both_s, rel=1e-9)  # the short one pays the long one's padding
    assert done[1000] == pytest.approx(10 * both_s + 10 * alone_s, rel=1e-9)


@pytest.mark.parametrize("waits", [True, False])
def test_a_request_joins_a_running_batch_when_its_step_ends(waits):
    """Steps of 0.1 s. A (10 steps) joins the idle group at 0; B (2 steps) arrives at 0.25, inside
    A's third step: with `decode_waits_for_step_end` it joins at 0.3, as the runtime's DE starts it
    at a step's end (engine/mid_step.py), else at once. C (2 steps) arrives at 1.23, when the
    group is idle again: it joins at once and its first step starts then."""
    import dualpath.sim.decode as decode_mod
    from dualpath.sim.events import EventLoop

    if not decode_mod.__file__.endswith(".py"):
        pytest.skip("the compiled build is imported; its classes take no stand-ins")
    step_s = 0.1
    m = _machine(decode_fixed_s=step_s, decode_per_seq_s=0.0, decode_per_key_s=0.0, decode_per_ctx_s=0.0)
    loop, done = EventLoop(), {}
    ctx = SimpleNamespace(loop=loop, compute=MeasuredCompute(m), net=None, cpu=NO_CPU_SHARE, features=NO_TIER_FEATURES,
                          cfg=SimpleNamespace(cluster=SimpleNamespace(model="tiny", decode_waits_for_step_end=waits), local=m),
                          timeline=NULL_TIMELINE)
    life = SimpleNamespace(decode_finished=lambda r: done.setdefault(r.name, loop.now_s))
    eng = SimpleNamespace(index=0, track="DE0")
    group = decode_mod.DecodeGroup(ctx, life, SimpleNamespace(engines=[eng]))
    reqs = {name: SimpleNamespace(name=name, input_tokens=10, gen_tokens=gen, t_second=-1.0)
            for name, gen in (("A", 11), ("B", 3), ("C", 3))}
    for name, at_s in (("A", 0.0), ("B", 0.25), ("C", 1.23)):
        loop.call_at(at_s, lambda r: group.join(r, eng), reqs[name])
    loop.run()
    b_join_s = 0.3 if waits else 0.25
    assert done["A"] == pytest.approx(1.0)
    assert reqs["B"].t_second == pytest.approx(b_join_s + step_s)
    assert done["B"] == pytest.approx(b_join_s + 2 * step_s)
    assert done["C"] == pytest.approx(1.23 + 2 * step_s)  # an idle group: no wait, a fresh step


def test_steps_slow_while_the_node_moves_kv_and_a_join_costs_its_measured_time_once():
    """Steps of 0.1 s; the engine's CNIC carries a copy over [0.35, 0.55) with a slowdown of 1.0
    (steps take 0.2 s meanwhile: sim/cpu_share.py), the node's SNIC a read over [0.6, 1.3) that
    slows nothing; each join costs 0.05 s once. A (10 steps) joins
    at 0: 0.05 + 0.35 s of steps reaches progress 3.0; 0.2 s beside the write does 1 step; the last
    6 take 0.6 s: done at 1.15. B (2 steps) joining at 1.3, with no traffic: 1.3 + 0.05 + 0.2."""
    import dualpath.sim.decode as decode_mod
    from dualpath.sim.cpu_share import CpuShare
    from dualpath.sim.events import EventLoop

    if not decode_mod.__file__.endswith(".py"):
        pytest.skip("the compiled build is imported; its classes take no stand-ins")
    m = _machine(decode_fixed_s=0.1, decode_per_seq_s=0.0, decode_per_key_s=0.0, decode_per_ctx_s=0.0,
                 decode_io_slowdown=1.0, decode_join_s=0.05)
    loop, done = EventLoop(), {}
    cpu = CpuShare(1.0)
    ctx = SimpleNamespace(loop=loop, compute=MeasuredCompute(m), net=None, cpu=cpu, timeline=NULL_TIMELINE, features=NO_TIER_FEATURES,
                          cfg=SimpleNamespace(cluster=SimpleNamespace(model="tiny", decode_waits_for_step_end=False), local=m))
    life = SimpleNamespace(decode_finished=lambda r: done.setdefault(r.name, loop.now_s))
    cnic, snic = (SimpleNamespace(flows=({}, {}), watchers=[]) for _ in range(2))
    eng = SimpleNamespace(index=0, track="DE0", cnic_out=cnic)
    group = decode_mod.DecodeGroup(ctx, life, SimpleNamespace(nid=1, engines=[eng], snic_in=snic, snic_out=snic))

    def flow(link, on: bool) -> None:  # a flow starts or ends on `link` (links.py: its watchers are told)
        link.flows[1].clear() if not on else link.flows[1].update(f=1)
        for w in link.watchers:
            w()
    reqs = {name: SimpleNamespace(name=name, input_tokens=10, gen_tokens=gen, t_second=-1.0) for name, gen in (("A", 11), ("B", 3))}
    loop.call_at(0.0, lambda r: group.join(r, eng), reqs["A"])
    for link, t0, t1 in ((cnic, 0.35, 0.55), (snic, 0.6, 1.3)):
        loop.call_at(t0, lambda li: flow(li, True), link)
        loop.call_at(t1, lambda li: flow(li, False), link)
    loop.call_at(1.3, lambda r: group.join(r, eng), reqs["B"])
    loop.run()
    assert reqs["A"].t_second == pytest.approx(0.15)  # its first step, with the join's cost
    assert done["A"] == pytest.approx(1.15)
    assert done["B"] == pytest.approx(1.3 + 0.05 + 0.2)
    assert not snic.watchers  # the SNIC is not watched


def test_preset_carries_the_runtime_config():
    rt = RuntimeConfig(model="tiny", links=LinkConfig(snic_bytes_per_s=5e6),
                       engines=EngineConfig(pe_hbm_bytes=2**20, de_kv_tokens=4096, host_buffer_bytes=2**24))
    cfg = local_sim_config(rt, _profile(_machine()), TINY.kv_bytes_per_token, "test")
    node = cfg.cluster.node
    assert (node.gpus_per_node, node.snic_read_bytes_per_s, node.cnic_bytes_per_s) == (1, 5e6, 8 * 5e6)
    assert cfg.local.pe_landing_bytes == 2**20 and cfg.local.de_kv_tokens == 4096
    assert cfg.scheduler.basic_tokens_per_forward == rt.scheduler.basic_tokens_per_forward
    assert cfg.cluster.cnic_as_runtime_arbiter and cfg.cluster.decode_waits_for_step_end
    with pytest.raises(InputError, match="emulated SNIC"):
        local_sim_config(RuntimeConfig(model="tiny"), _profile(_machine()), TINY.kv_bytes_per_token, "test")
    with pytest.raises(InputError, match="KV bytes per token"):
        local_sim_config(rt, _profile(_machine()), 2 * TINY.kv_bytes_per_token, "test")


def _run(mode: str, machine: MeasuredMachine, rounds: int = 4):
    rt = RuntimeConfig(model="tiny", links=LinkConfig(snic_bytes_per_s=2e6),
                       engines=EngineConfig(pe_hbm_bytes=int(machine.pe_landing_bytes), de_kv_tokens=4096))
    cfg = local_sim_config(rt, _profile(machine), TINY.kv_bytes_per_token, "test")
    trajs = [Trajectory(a, (TurnSpec(126, 3),) + (TurnSpec(61, 3),) * (rounds - 1)) for a in range(3)]
    sim = Simulator(cfg, parse_mode(mode), trajs, [0.0] * 3)
    sim.driver.decisions = log = DecisionLog()
    return sim.run(), log.decisions, sim


def test_a_local_run_is_timed_by_the_machine_and_logs_every_decision():
    fast, _, _ = _run("dualpath", _machine())
    slow, log, sim = _run("dualpath", _machine(prefill_fixed_s=0.1))
    assert slow["jct_s"] > fast["jct_s"] + 0.1  # a slower forward slows the run
    assert sorted(d.request for d in log) == sorted(f"a{a}t{t}" for a in range(3) for t in range(4))
    assert all(d.pe == 0 and d.de == 0 for d in log)  # 1P1D: index 0 of each role
    hits = {d.request: d.hit_tokens for d in log}
    assert hits["a0t0"] == 0 and hits["a0t1"] == 128  # 126 + 2 generated tokens' KV = 2 full blocks
    assert [d.t_s for d in log] == sorted(d.t_s for d in log)
    sim.check_invariants()


def test_the_landing_zone_budget_chunks_a_basic_forward():
    """Basic mode (not layerwise) holds every layer of the batch's cached KV in the landing zone:
    a zone smaller than one request's cached KV makes the PE take fewer requests per forward."""
    roomy, _, a = _run("basic", _machine(pe_landing_bytes=64 * 2**20))
    tight, _, b = _run("basic", _machine(pe_landing_bytes=TINY.kv_bytes_per_token * 200))
    assert b.prefill_groups[0].num_forwards > a.prefill_groups[0].num_forwards


def test_each_engine_has_one_fifo_link_that_carries_the_copies_it_makes():
    """The runtime's arbiters (config.py: cnic_as_runtime_arbiter): the DE's link carries the DE
    path's layer streams, the H2D and the persisted blocks' D2H; the PE's the PE path's loads and the PD transfer."""
    from dualpath.core.lanes import Lane
    from dualpath.core.snapshot import ReadSide

    result, log, sim = _run("dualpath", _machine())
    pe, de = sim.engines_by_id[0], sim.engines_by_id[1]
    assert pe.cnic_out is pe.cnic_in and de.cnic_out is de.cnic_in and de.cnic_out.fifo
    assert {d.side for d in log} == {"prefill", "decode"}  # both paths taken
    de_streams = sim.reads.bytes_by_side[ReadSide.DECODE]  # one chunk each: each hit streams once
    pe_streams = sim.reads.bytes_by_side[ReadSide.PREFILL]
    b = result["bytes"]
    assert b["kv_layer_streams"] == pytest.approx(de_streams + pe_streams)

    def carried(link):  # served, plus what the last turn's D2H still has to move when the run ends
        sim.net.settle(link)
        return link.served_bytes[Lane.KV] + sum(f.left_bytes for f in link.flows[Lane.KV].values())

    assert carried(de.cnic_out) == pytest.approx(de_streams + b["de_h2d"] + b["persisted"])
    assert carried(pe.cnic_out) == pytest.approx(pe_streams + b["pd_transfer"])
    sim.check_invariants()
