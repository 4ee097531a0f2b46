"""The simulator's timeline (metrics/timeline.py): each request's spans in the order its path
takes them, serial engines' spans never overlapping, and a run's results the same with and without
recording."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dualpath.config import EngineConfig, LinkConfig, RuntimeConfig, parse_mode
from dualpath.core.measured import MeasuredMachine
from dualpath.costmodel.models import TINY
from dualpath.core.request import TurnSpec
from dualpath.fidelity.preset import local_sim_config
from dualpath.metrics.timeline import (INSTANT_NAMES, NULL_TIMELINE, SPAN_NAMES, Timeline, merge_traces, read_trace,
                                       timeline_path)
from dualpath.sim.runner import run_modes, sim_trace
from dualpath.sim.simulator import Simulator
from dualpath.workloads import Trajectory
from sim_helpers import trajs

_VOLATILE = {"wall_s", "turns_per_wall_s", "policy_wall_s", "cpu_s_per_decision", "decisions_per_s"}


def _local_cfg():
    """The `local` preset (as `dualpath fidelity` simulates the runtime) on a made-up machine."""
    m = MeasuredMachine(prefill_fixed_s=0.01, prefill_per_token_s=1e-4, prefill_per_key_s=1e-7, decode_fixed_s=0.005,
                        decode_per_seq_s=1e-3, decode_per_key_s=1e-6, quota_attention_flops_per_s=640e12,
                        attention_flops_per_key=TINY.attn_flops_per_key, pe_landing_bytes=64 * 2**20,
                        de_kv_tokens=4096, source="test")
    fit = SimpleNamespace
    profile = SimpleNamespace(
        prefill_fit=fit(fixed_s=m.prefill_fixed_s, per_item_s=m.prefill_per_token_s, per_key_s=m.prefill_per_key_s),
        decode_fit=fit(fixed_s=m.decode_fixed_s, per_item_s=m.decode_per_seq_s, per_key_s=m.decode_per_key_s,
                       per_ctx_s=m.decode_per_ctx_s))
    rt = RuntimeConfig(model="tiny", links=LinkConfig(snic_bytes_per_s=2e6),
                       engines=EngineConfig(pe_hbm_bytes=64 * 2**20, de_kv_tokens=4096))
    return local_sim_config(rt, profile, TINY.kv_bytes_per_token, "test")


AGENTS = [Trajectory(a, (TurnSpec(126, 3),) + (TurnSpec(61, 3),) * 3) for a in range(3)]


def _simulate(mode: str, timeline=NULL_TIMELINE) -> tuple[dict, Simulator]:
    sim = Simulator(_local_cfg(), parse_mode(mode), AGENTS, [0.0] * len(AGENTS), timeline)
    return sim.run(), sim


def _by_request(spans) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in spans:
        for r in s.requests:
            out.setdefault(r, []).append(s)
    return out


def _ordered(*times_s: float) -> bool:
    """Non-decreasing, within the trace's rounding (a nanosecond: microseconds to 3 decimals)."""
    return all(a <= b + 1e-8 for a, b in zip(times_s, times_s[1:]))


def _first(spans, name: str, **args):
    hits = [s for s in spans if s.name == name and all(s.args.get(k) == v for k, v in args.items())]
    return min(hits, key=lambda s: s.start_s) if hits else None


def test_each_request_reads_then_prefills_then_transfers_then_decodes():
    """The `local` preset, dualpath mode, 3 agents x 4 rounds: every request's spans follow its
    path (docs/structure.md, one request's path): the read of its hit ends before its forward
    starts; its prompt KV leaves with that forward; the DE's H2D starts once the transfer ended and
    its first decode step once the H2D ended; the first token comes between its forward and that step."""
    _, sim = _simulate("dualpath", Timeline())
    spans, instants = read_trace(sim_trace(sim))
    by_req, marks = _by_request(spans), _by_request(instants)
    names = {f"a{a}t{t}" for a in range(3) for t in range(4)}
    assert set(by_req) == set(marks) == names
    sides = set()
    for req in sorted(names):
        mine, (placed,), (first,) = by_req[req], [m for m in marks[req] if m.name == "placed"], \
            [m for m in marks[req] if m.name == "first_token"]
        sides.add(placed.args["side"])
        reads = [s for s in mine if s.name == "read"]
        assert len(reads) == (1 if placed.args["hit_tokens"] else 0), req
        fwd = _first(mine, "prefill")
        pd = [s for s in mine if s.name == "transfer" and s.args["direction"] == "PE->DE"]
        h2d = [s for s in mine if s.name == "h2d" and s.track.startswith("CNIC DE")]
        step = _first(mine, "decode")
        assert fwd is not None and pd and len(h2d) == 1 and step is not None, req
        if reads:
            assert _ordered(placed.start_s, reads[0].start_s, reads[0].end_s, fwd.start_s), req
            assert reads[0].track == f"SNIC node{0 if placed.args['side'] == 'prefill' else 1} read", req
        assert _ordered(fwd.start_s, min(s.start_s for s in pd)), req
        assert _ordered(max(s.end_s for s in pd), h2d[0].start_s, h2d[0].end_s, step.start_s), req
        assert _ordered(fwd.end_s, first.start_s, step.start_s), req
        stream = [s for s in mine if s.name == "transfer" and s.args["direction"] == "DE->PE"]
        assert bool(stream) == (placed.args["side"] == "decode" and placed.args["hit_tokens"] > 0), req
    assert sides == {"prefill", "decode"}  # both read paths are in the run
    assert {s.name for s in spans} == set(SPAN_NAMES) and {i.name for i in instants} == set(INSTANT_NAMES)


@pytest.mark.parametrize("mode", ["dualpath", "basic"])
def test_a_serial_engine_s_spans_never_overlap(mode):
    """One PE's forwards and one DE's steps follow each other; so do a node's persists (one
    writer). The trace splits only tracks whose spans overlap into lanes, so these have none."""
    _, sim = _simulate(mode, Timeline())
    trace = sim_trace(sim)
    spans, _ = read_trace(trace)
    serial = {"PE0": "prefill", "DE0": "decode", "SNIC node1 write": "persist"}
    for track, name in serial.items():
        mine = sorted((s for s in spans if s.track == track), key=lambda s: s.start_s)
        assert len(mine) > 3 and {s.name for s in mine} == {name}, track
        assert all(_ordered(a.end_s, b.start_s) for a, b in zip(mine, mine[1:])), track
    threads = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert not [t for t in threads if t.split(" (")[0] in serial and " (" in t]
    assert all(e["dur"] >= 0 for e in trace["traceEvents"] if e["ph"] == "X")


@pytest.mark.parametrize("mode", ["dualpath", "basic", "oracle"])
def test_recording_changes_no_result(mode):
    plain, _ = _simulate(mode)
    recorded, sim = _simulate(mode, Timeline())
    assert sim_trace(sim)["traceEvents"]
    strip = lambda r: {k: v for k, v in r.items() if k not in _VOLATILE}  # noqa: E731
    assert json.dumps(strip(recorded), sort_keys=True, default=str) == json.dumps(strip(plain), sort_keys=True, default=str)


def test_a_paper_preset_run_writes_a_trace_per_mode(tmp_path):
    """`dualpath sim --timeline F` (run_modes): F.<mode>.json per mode, each a Chrome trace of
    the simulated world with a track per GPU of its eight-GPU nodes, the same bytes for the same run."""
    from dualpath.config import SimConfig, WorkloadConfig, paper_cluster
    from dualpath.workloads import write_trajectories

    work = tmp_path / "w.jsonl"
    write_trajectories(work, trajs([[(300, 5), (100, 4), (70, 3)], [(500, 3), (64, 6)], [(128, 2)]]))
    cfg = SimConfig(cluster=paper_cluster("ds-27b", "1P1D"), workload=WorkloadConfig(num_agents=3, trajectory_file=str(work)))
    first = run_modes(cfg, ["basic", "dualpath"], timeline=tmp_path / "t.json")
    run_modes(cfg, ["basic", "dualpath"], timeline=tmp_path / "again.json")
    assert [r.pop("timeline_file") for r in first["runs"]] == [str(tmp_path / "t.basic.json"), str(tmp_path / "t.dualpath.json")]
    plain = run_modes(cfg, ["basic", "dualpath"])  # and recording changed no result
    strip = lambda res: json.dumps([{k: v for k, v in r.items() if k not in _VOLATILE} for r in res["runs"]],  # noqa: E731
                                   sort_keys=True, default=str)
    assert strip(first) == strip(plain)
    for mode in ("basic", "dualpath"):  # deterministic, byte for byte
        assert timeline_path(tmp_path / "t.json", mode).read_text() == timeline_path(tmp_path / "again.json", mode).read_text()
    trace = json.loads((tmp_path / "t.dualpath.json").read_text())
    spans, _ = read_trace(trace)
    assert {s.world for s in spans} == {"sim"}
    assert {s.track for s in spans if s.name == "decode"} == {f"DE{i}" for i in range(8)}
    processes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert processes == {"sim router", "sim prefill", "sim decode", "sim storage"}
    with pytest.raises(ValueError, match="one trace per world"):
        merge_traces(trace, trace)


def test_steps_cut_fluid_progress_at_whole_steps():
    """sim/decode.py's group tells Steps each stretch of constant step time; a span ends wherever
    progress crosses a whole step, and a stretch that does not continue the last (an idle group
    whose progress was rounded up) ends the step left in progress where the last stretch ended."""
    tl = Timeline()
    steps = tl.steps(["DE0", "DE1"], "decode")
    args = lambda: [{"batch": 1}, {"batch": 0}]  # noqa: E731
    steps.advance(0.0, 0.25, 0.0, 2.5, 0.1, args)  # steps end at 0.1, 0.2; half of the third runs
    steps.advance(0.25, 0.45, 2.5, 3.5, 0.2, args)  # slower: the third ends at 0.35
    steps.advance(1.0, 1.05, 4.0, 4.5, 0.1, args)  # idle since 0.45: the fourth ended there, half-done
    spans, _ = read_trace(tl.to_chrome("sim"))  # the export ends the step in progress, too
    de0 = [(round(s.start_s, 6), round(s.end_s, 6)) for s in spans if s.track == "DE0"]
    assert de0 == [(0.0, 0.1), (0.1, 0.2), (0.2, 0.35), (0.35, 0.45), (1.0, 1.05)]
    assert [s.args["batch"] for s in spans if s.track == "DE1"] == [0] * 5


def test_overlapping_spans_take_lanes_and_read_back_as_one_track():
    tl = Timeline(t0_s=10.0)
    tl.name(7, "a0t1")
    for start_s, end_s in ((10.0, 11.0), (10.5, 12.0), (11.0, 11.5), (12.0, 13.0)):
        tl.span("SNIC node0 read", "read", start_s, end_s, 7)
    tl.instant("router", "placed", 10.0, 7, {"hit_tokens": 64, "side": "prefill"})
    trace = tl.to_chrome("runtime")
    threads = sorted(e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name")
    assert threads == ["SNIC node0 read", "SNIC node0 read (2)", "router"]
    spans, instants = read_trace(trace)
    assert [(s.track, s.start_s, s.end_s, s.requests) for s in spans][:2] == [
        ("SNIC node0 read", 0.0, 1.0, ("a0t1",)), ("SNIC node0 read", 0.5, 2.0, ("a0t1",))]
    assert instants[0].args == {"hit_tokens": 64, "side": "prefill"} and instants[0].world == "runtime"
    merged = merge_traces(trace, Timeline().to_chrome("sim"))
    assert merged["otherData"]["worlds"] == ["runtime", "sim"]
    assert timeline_path("out/t.json", "basic").name == "t.basic.json"


def test_an_engine_s_spans_cross_to_the_router_and_the_null_timeline_records_nothing():
    """An engine's spans (begun and ended in different places, on its clock) are drained into its
    Counters and added to the router's timeline; the null timeline reads no clock, keeps nothing."""
    now = [5.0]
    engine = Timeline(clock=lambda: now[0])
    engine.begin(("pd", 3))
    now[0] = 5.5
    engine.begin(("pd", 3))  # a later begin of an open span keeps its start
    engine.end(("pd", 3), "CNIC PE0", "transfer", 3)
    engine.end(("pd", 3), "CNIC PE0", "transfer", 3)  # nothing open: nothing recorded
    engine.until_now("PE0", "prefill", 5.2, None, lambda: {"requests": [3], "tokens": 64})
    sent = engine.drain()
    assert engine.drain() == [] and len(sent) == 2
    router = Timeline(t0_s=5.0)
    router.add(sent)
    router.name(3, "a1t0")
    spans, _ = read_trace(router.to_chrome("runtime"))
    assert [(s.name, s.start_s, s.end_s, s.requests) for s in spans] == [
        ("transfer", 0.0, 0.5, ("a1t0",)), ("prefill", 0.2, 0.5, ("a1t0",))]
    calls = []
    NULL_TIMELINE.begin(("pd", 3))
    NULL_TIMELINE.until_now("PE0", "prefill", 1.0, None, lambda: calls.append(1))
    NULL_TIMELINE.steps(["DE0"], "decode").advance(0.0, 1.0, 0.0, 5.0, 0.2, lambda: calls.append(1))
    assert NULL_TIMELINE.drain() == [] and NULL_TIMELINE.now_s() == 0.0 and not calls
    assert NULL_TIMELINE.spans == [] and NULL_TIMELINE._open == {}


def test_sim_timeline_option_writes_one_trace_per_mode_and_refuses_ray(tmp_path):
    from cli_helpers import cli_here

    base = tmp_path / "t.json"
    p = cli_here("sim", "--model", "ds-27b", "--pd", "1P1D", "--agents", "2", "--max-len", "4k", "--mode", "basic",
                 "--mode", "dualpath", "--quiet", "--timeline", str(base))
    assert p.returncode == 0, p.stderr[-2000:]
    for mode in ("basic", "dualpath"):
        spans, _ = read_trace(json.loads(timeline_path(base, mode).read_text()))
        assert {s.name for s in spans} >= {"prefill", "decode", "transfer"}
        assert f"wrote {timeline_path(base, mode)}" in p.stderr + p.stdout
    p = cli_here("sim", "--ray", "local", "--timeline", str(base))
    assert p.returncode == 2 and "need the simulations in this process" in p.stderr
