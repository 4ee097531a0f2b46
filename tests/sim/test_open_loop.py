"""Open-loop Mooncake replay in the simulator: hits from a simulated store of block ids, visible
when the runtime makes them visible; arrivals at scaled timestamps; `dualpath sim` auto-detects
the workload format."""

from __future__ import annotations

import csv
import json

import pytest
from cli_helpers import cli, cli_here

from dualpath.config import SimConfig, WorkloadConfig, paper_cluster, parse_mode
from dualpath.errors import InputError
from dualpath.sim.hits import StoreHits, TraceRequest
from dualpath.sim.runner import TraceReplay, load_workload, run_modes
from dualpath.sim.simulator import Simulator
from dualpath.workloads import MooncakeRecord

MC = 512  # the trace's block size (workloads.mooncake.MOONCAKE_BLOCK_TOKENS)
# (timestamp ms, input tokens, output tokens, 512-token block ids); ids are prefix-chained
EARLY = (0, 1100, 10, [1, 2, 3])
SAME_PREFIX_AT_ONCE = (1, 1100, 0, [1, 2, 5])  # 1 ms later: EARLY's blocks are not stored yet
SAME_PREFIX_LATER = (20000, 1200, 5, [1, 2, 4])  # shares EARLY's two full 512-token blocks
FIRST_BLOCK_LATER = (30000, 600, 3, [1, 8])  # shares EARLY's first block only
TRACE = (EARLY, SAME_PREFIX_AT_ONCE, SAME_PREFIX_LATER, FIRST_BLOCK_LATER)


def _write(path, rows):
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n"
                            for t, i, o, h in rows))
    return path


def _cfg(path, max_len=65536, check_every=1):
    return SimConfig(cluster=paper_cluster("ds-27b", "1P1D"),
                     workload=WorkloadConfig(max_len_tokens=max_len, num_agents=1, trajectory_file=str(path)),
                     check_invariants_every=check_every)


def _simulate(cfg, replay=TraceReplay(), mode="dualpath"):
    w = load_workload(cfg, replay)
    sim = Simulator(cfg, parse_mode(mode), w.agents, w.arrivals_s)
    sim.run()
    rec = sim.recorder
    by_agent = sorted(zip(rec.agent, rec.arrival_s, rec.hit_tokens, rec.gen_tokens))
    return sim, w, by_agent


@pytest.mark.parametrize("mode", ["basic", "dualpath", "oracle"])
def test_a_later_request_hits_exactly_the_shared_full_blocks(tmp_path, mode):
    _, _, rows = _simulate(_cfg(_write(tmp_path / "mc.jsonl", TRACE)), mode=mode)
    hits = [h for _, _, h, _ in rows]
    # the one arriving 1 ms after EARLY misses (EARLY's KV is not in a DE yet); the later ones hit
    # the full 512-token blocks they share, not EARLY's third block (partial, and another id)
    assert hits == [0, 0, 2 * MC, 1 * MC]


def test_the_whole_trace_is_replayed_unless_a_limit_is_given(tmp_path):
    """`sim --trace` replays every request of the file by default (`run` takes its first 8)."""
    rows = [(1000 * i, 100, 2, [i]) for i in range(12)]
    _, w, got = _simulate(_cfg(_write(tmp_path / "mc.jsonl", rows)))
    assert len(got) == 12 and w.stats["num_requests"] == 12 and w.stats["limit"] is None
    _, w, got = _simulate(_cfg(_write(tmp_path / "mc.jsonl", rows)), TraceReplay(limit=5))
    assert len(got) == 5 and w.stats["num_requests"] == 5


def test_every_request_misses_when_all_arrive_before_anything_is_stored(tmp_path):
    _, w, rows = _simulate(_cfg(_write(tmp_path / "mc.jsonl", TRACE)), TraceReplay(time_scale=0.0))
    assert w.arrivals_s == (0.0,) * len(TRACE)
    assert [h for _, _, h, _ in rows] == [0] * len(TRACE)


def test_arrivals_follow_timestamps_times_the_time_scale_after_filtering(tmp_path):
    rows = [(5000, 700, 5, [1, 2]), (6000, 3000, 200, [7] * 6), (9000, 100, 0, [3]), (12000, 300, 9, [4]), (15000, 64, 1, [5])]
    path = _write(tmp_path / "mc.jsonl", rows)
    # max_len 1024 drops the 3000 + 200 record; limit 3 keeps the first three that fit
    _, w, got = _simulate(_cfg(path, max_len=1024), TraceReplay(time_scale=0.5, limit=3))
    kept = [rows[0], rows[2], rows[3]]
    expect = [(t - 5000) / 1000 * 0.5 for t, _, _, _ in kept]
    assert list(w.arrivals_s) == expect
    assert [a for _, a, _, _ in got] == expect  # the recorded turns arrive then
    assert [g for _, _, _, g in got] == [max(1, o) for _, _, o, _ in kept]  # output 0 still generates one token
    assert w.stats["num_requests"] == 3 and w.stats["time_scale"] == 0.5 and w.stats["limit"] == 3


def test_blocks_become_visible_at_the_decode_engines_copy_not_at_the_finish(tmp_path):
    """The runtime persists (and the router waits for) a prompt's blocks once the DE has copied its
    KV in (decode.py `_copy_done`): a request arriving while the earlier one still decodes hits."""
    first = MooncakeRecord(0.0, 1100, 400, (1, 2, 3))
    later = MooncakeRecord(0.0, 1200, 5, (1, 2, 4))
    cfg = _cfg(_write(tmp_path / "unused.jsonl", [EARLY]))
    probe = Simulator(cfg, parse_mode("dualpath"), [TraceRequest.of(first)], [0.0])
    probe.run()
    second_s, finish_s = probe.recorder.second_s[0], probe.recorder.finish_s[0]
    assert finish_s - second_s > 0.1  # 399 decode steps: a window to arrive in

    def hit_when_arriving_at(t_s):
        sim = Simulator(cfg, parse_mode("dualpath"), [TraceRequest.of(first), TraceRequest.of(later)], [0.0, t_s])
        sim.run()
        rec = sim.recorder
        assert rec.finish_s[rec.agent.index(0)] == finish_s  # the later request does not move the first
        return rec.hit_tokens[rec.agent.index(1)]

    assert hit_when_arriving_at((second_s + finish_s) / 2) == 2 * MC
    assert hit_when_arriving_at(probe.recorder.first_s[0] / 2) == 0  # the first is still in prefill


def test_persisted_tokens_follow_the_decode_engines_rule(tmp_path):
    """Prompt full blocks beyond the hit, then generated blocks that filled ((in + gen - 1) // b)."""
    sim, _, rows = _simulate(_cfg(_write(tmp_path / "mc.jsonl", TRACE)))
    b = sim.block_tokens
    expect = sum(i // b - h // b + (i + g - 1) // b - i // b
                 for (_, i, _, _), (_, _, h, g) in zip(TRACE, rows))
    assert sim.writes.persisted_bytes == expect * b * sim.kv_bytes_per_token
    hits = sim.hits
    assert isinstance(hits, StoreHits)
    # every prompt's full blocks are stored, and only those: generated tokens have no ids
    assert hits.stored == {x for blocks in hits.blocks for x in blocks}
    assert not hits.persisting  # every queued write ended


def test_two_runs_give_equal_results(tmp_path):
    cfg = _cfg(_write(tmp_path / "mc.jsonl", TRACE), check_every=0)

    def numbers():
        out = run_modes(cfg, ["basic", "dualpath"])
        for r in out["runs"]:
            for k in ("wall_s", "turns_per_wall_s", "policy_wall_s", "cpu_s_per_decision", "decisions_per_s"):
                r.pop(k, None)
        return json.dumps(out, sort_keys=True, default=str)

    assert numbers() == numbers()


@pytest.mark.parametrize("kw,needle", [({"time_scale": -1.0}, "--time-scale must be >= 0"),
                                       ({"limit": 0}, "--limit must be positive")])
def test_bad_replay_options_are_input_errors(kw, needle):
    with pytest.raises(InputError, match=needle):
        TraceReplay(**kw)


def test_a_trace_none_of_whose_requests_fits_max_len_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no request fits --max-len 1000"):
        load_workload(_cfg(_write(tmp_path / "mc.jsonl", [EARLY, SAME_PREFIX_LATER]), max_len=1000))


# --- the command line ------------------------------------------------------------------------------

def _cli(*args):
    return cli("sim", "--model", "ds-27b", "--pd", "1P1D", "--quiet", *args, timeout=300)


def test_sim_detects_a_mooncake_trace_and_a_trajectory_file(tmp_path):
    mc = _write(tmp_path / "mc.jsonl", TRACE)
    traj = tmp_path / "traj.jsonl"
    traj.write_text('{"agent": 0, "rounds": [[1100, 10], [300, 5]]}\n')
    p = _cli("--trace", str(mc), "--mode", "dualpath", "--json", str(tmp_path / "mc.json"), "--turns", str(tmp_path / "mc.csv"))
    assert p.returncode == 0, p.stderr
    q = _cli("--trajectories", str(traj), "--agents", "1", "--mode", "dualpath", "--json", str(tmp_path / "traj.json"))
    assert q.returncode == 0, q.stderr
    m, t = json.loads((tmp_path / "mc.json").read_text()), json.loads((tmp_path / "traj.json").read_text())
    assert m["workload"]["num_requests"] == len(TRACE) and m["workload"]["limit"] is None  # the whole file
    assert m["runs"][0]["num_turns"] == len(TRACE)
    with open(tmp_path / "mc.csv", newline="") as f:
        turns = sorted(csv.DictReader(f), key=lambda r: int(r["agent"]))
    assert [int(r["hit_tokens"]) for r in turns] == [0, 0, 2 * MC, 1 * MC]
    assert t["workload"]["num_requests"] == 2 and "limit" not in t["workload"]
    assert t["runs"][0]["num_turns"] == 2


@pytest.mark.parametrize("args,message", [
    (["--time-scale", "-1"], "error: --time-scale must be >= 0, got -1.0"),
    (["--limit", "0"], "error: --limit must be positive, got 0"),
    (["--max-len", "1000"], "error: {mc}: no request fits --max-len 1000 (input + output tokens)"),
])
def test_bad_trace_input_exits_2_with_one_line(tmp_path, args, message):
    mc = _write(tmp_path / "mc.jsonl", [EARLY, SAME_PREFIX_LATER])
    p = cli_here("sim", "--model", "ds-27b", "--pd", "1P1D", "--quiet", "--trace", str(mc), *args)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.splitlines() == [message.format(mc=mc)]
