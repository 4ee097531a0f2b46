"""A real replay's timeline (metrics/timeline.py; `dualpath run --timeline`): the simulator's span
names and request names for the same workload, and each request's spans in the causal order of
its path (all of one host's processes read one CLOCK_MONOTONIC). Tiny model, real engine processes."""

from __future__ import annotations

import asyncio
import json

from dualpath.config import SimConfig, WorkloadConfig, paper_cluster
from dualpath.metrics.timeline import COPY_OUT_SPANS, INSTANT_NAMES, SPAN_NAMES, read_trace
from dualpath.runtime.apps.run import run_trace
from dualpath.sim.runner import run_modes

WORKLOAD = '{"agent": 0, "rounds": [[150, 3], [40, 3], [70, 2]]}\n{"agent": 1, "rounds": [[90, 2], [64, 4]]}\n'
NAMES = {"a0t0", "a0t1", "a0t2", "a1t0", "a1t1"}


def _requests(events) -> set[str]:
    return {r for e in events for r in e.requests}


def _ordered(*times_s: float) -> bool:
    return all(a <= b + 1e-8 for a, b in zip(times_s, times_s[1:]))  # the trace rounds to a nanosecond


def test_a_replay_writes_the_simulator_s_spans_for_the_simulator_s_requests(tmp_path):
    work = tmp_path / "t.jsonl"
    work.write_text(WORKLOAD)
    result = asyncio.run(run_trace(work, "tiny", "1P1D", ["dualpath"], limit=2, max_len=4096, time_scale=1.0,
                                   snic_mb_s=None, timeline=tmp_path / "rt.json"))
    assert result["runs"][0]["timeline_file"] == str(tmp_path / "rt.dualpath.json")
    spans, instants = read_trace(json.loads((tmp_path / "rt.dualpath.json").read_text()))
    sim_cfg = SimConfig(cluster=paper_cluster("ds-27b", "1P1D"), workload=WorkloadConfig(num_agents=2, trajectory_file=str(work)))
    run_modes(sim_cfg, ["dualpath"], timeline=tmp_path / "sim.json")
    sim_spans, sim_instants = read_trace(json.loads((tmp_path / "sim.dualpath.json").read_text()))
    assert {s.name for s in spans} <= {s.name for s in sim_spans} | set(COPY_OUT_SPANS)
    assert {s.name for s in sim_spans} == set(SPAN_NAMES) - set(COPY_OUT_SPANS)  # a paper preset: no D2H timed
    assert {s.name for s in spans} == set(SPAN_NAMES)  # hits are read, persisted blocks copied out and written
    assert {i.name for i in instants} == {i.name for i in sim_instants} == set(INSTANT_NAMES)
    assert _requests(spans) == _requests(instants) == _requests(sim_spans) == _requests(sim_instants) == NAMES
    assert {s.world for s in spans} == {"runtime"} and {s.world for s in sim_spans} == {"sim"}
    for track, name in (("PE0", "prefill"), ("DE0", "decode")):  # one engine loop: one forward or step at a time
        mine = sorted((s for s in spans if s.track == track), key=lambda s: s.start_s)
        assert {s.name for s in mine} == {name} and all(_ordered(a.end_s, b.start_s) for a, b in zip(mine, mine[1:]))
    for req in sorted(NAMES):
        _check_path(req, [s for s in spans if req in s.requests], [i for i in instants if req in i.requests])


def _check_path(req: str, mine: list, marks: list) -> None:
    """The read ends before the request's first forward starts, its PD transfer starts in a
    forward and ends before the DE's H2D starts, which ends before the request's first step."""
    (placed,) = [m for m in marks if m.name == "placed"]
    assert [m.name for m in marks].count("first_token") == 1, req
    reads = [s for s in mine if s.name == "read"]
    forwards = sorted((s for s in mine if s.name == "prefill"), key=lambda s: s.start_s)
    pd = [s for s in mine if s.name == "transfer" and s.args["direction"] == "PE->DE"]
    (h2d,) = [s for s in mine if s.name == "h2d" and s.track == "CNIC DE0"]
    first_step = min((s for s in mine if s.name == "decode"), key=lambda s: s.start_s)  # every turn takes a step
    assert len(reads) == (1 if placed.args["hit_tokens"] else 0), req
    if reads:
        assert _ordered(placed.start_s, reads[0].start_s, reads[0].end_s, forwards[0].start_s), req
    assert forwards and pd and _ordered(forwards[0].start_s, min(s.start_s for s in pd)), req
    assert _ordered(max(s.end_s for s in pd), h2d.start_s, h2d.end_s, first_step.start_s), req


def test_the_testbed_writes_no_timeline():
    from cli_helpers import cli_here

    for args in (["demo", "--testbed", "--timeline", "t.json"],
                 ["run", __file__, "--testbed", "--snic-mb-s", "5", "--timeline", "t.json"]):
        p = cli_here(*args)
        assert p.returncode == 2 and "--timeline" in p.stderr and "not written on the testbed" in p.stderr, p.stderr
