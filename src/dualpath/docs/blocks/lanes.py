"""Lanes and tensor parallelism: latency-critical bursts beside saturated KV in the runtime's arbiter,
the simulator and the testbed; TPOT of a tp=2 decode engine beside KV; the demo across hosts."""

from __future__ import annotations

from ..fmt import mb, ms, num, ratio, span, table
from ..registry import block
from ..results import Node, Results

TP_RUNS = tuple(f"testbed/tp_lanes_{name}.json" for name in
                ("zerocopy_a", "zerocopy_b", "zerocopy_e", "zerocopy_gso16k", "copy_s28", "zerocopy_f", "zerocopy_g",
                 "mooncake"))
TESTBED_DEMOS = {"testbed/demo.json": "one process per engine", "testbed/demo_ray.json": "engines as Ray actors (`--ray`)",
                 "testbed/demo_tp2.json": "tensor-parallel engines (`--tp 2`)"}


@block("lanes_runtime", reads=("runtime/lanes.json",), command="dualpath bench lanes --json docs/results/runtime/lanes.json")
def lanes_runtime(r: Results) -> str:
    d = r.json("runtime/lanes.json")
    two, one = d["lanes"], d["fifo"]
    rows = [[f"burst completion p99, link time (unloaded {two['unloaded_p50_us']:.1f} us)",
             f"{two['loaded_p99_us']:.1f} us = **{ratio(two['p99_over_unloaded'])}x**",
             f"{num(one['loaded_p99_us'])} us = **{num(one['p99_over_unloaded'], 1)}x**"],
            ["burst completion p99, wall clock", f"{two['loaded_observed_p99_us']:.0f} us",
             f"{num(one['loaded_observed_p99_us'])} us"],
            ["KV throughput GB/s", ratio(two["kv_throughput_gbps"]), ratio(one["kv_throughput_gbps"])]]
    return (f"A {two['link_rate_gbps']:g} GB/s emulated link, the KV lane saturated ({num(two['kv_backlog_bytes'] / 2**20)} MiB "
            f"backlog, {num(two['chunk_bytes'] / 1024)} KiB chunks), {num(two['burst_bytes'] / 1024)} KiB latency-critical "
            f"bursts every {two['burst_interval_s'] * 1e3:g} ms, {two['num_bursts']} bursts; one KV chunk ahead of a burst "
            f"bounds the two lanes at {two['lanes_bound']:g}x.\n\n"
            + table(["", "two lanes (99:1)", "one FIFO"], rows))


@block("lanes_sim", reads=("sim/lanes_ep.json",),
       command="dualpath bench lanes --sim --json docs/results/sim/lanes_ep.json --plot docs/results/sim/lanes_ep.png")
def lanes_sim(r: Results) -> str:
    d = r.json("sim/lanes_ep.json")
    kv_label = {"workload": "the workload's", "flood": "+ a KV flood"}
    ep_label = {"reference": "an empty link (reference)", "two_classes": "two classes, 99:1", "one_class": "one FIFO class"}
    rows = [[kv_label[kv], ep_label[ep], ms(c["tpot_mean_s"], 2), ms(c["tpot_p90_s"], 2),
             f"{c['tpot_over_reference']:.4f}", f"{c['ttft_p50_s']:.2f}", num(c["jct_s"]),
             num(c["cnic_lane_latency_critical_bytes"] / 1e12), num(c["cnic_lane_kv_bytes"] / 1e12)]
            for kv in kv_label for ep in ep_label for c in [d["kv"][kv][ep]]]
    return (f"{d['model']}, {d['pd']}, MaxLen {num(d['max_len_tokens'] / 1024)}K, {num(d['agents'])} agents, {d['mode']}.\n\n"
            + table(["KV on the CNICs", "EP bursts see", "TPOT mean ms", "TPOT p90 ms", "TPOT / reference", "TTFT p50 s",
                     "JCT s", "LC lane TB", "KV lane TB"], rows))


@block("lanes_testbed", reads=("testbed/lanes.json",),
       command="dualpath bench lanes --testbed --json docs/results/testbed/lanes.json --plot docs/results/testbed/lanes.png")
def lanes_testbed(r: Results) -> str:
    return _lanes_testbed(r.json("testbed/lanes.json"))


@block("lanes_testbed_mooncake", reads=("testbed/lanes_mooncake.json",),
       command="dualpath bench lanes --testbed --bulk mooncake --json docs/results/testbed/lanes_mooncake.json "
               "--plot docs/results/testbed/lanes_mooncake.png")
def lanes_testbed_mooncake(r: Results) -> str:
    d = r.json("testbed/lanes_mooncake.json")
    c = d["de_port_class_bytes"]
    return (_lanes_testbed(d) + f"\n\nThe KV load: Mooncake Transfer Engine writing {num(d['bulk_write_bytes'] / 2**20)} MiB at a time. The DE host's "
            f"port sent {num(c['kv'] / 1e6, 1)} MB in the KV class and {num(c['lc'] / 1e6, 1)} MB in the LC class (the "
            f"bursts) over the unloaded and two-class runs: Mooncake's unmarked TCP took the KV class.")


def _lanes_testbed(d: Node) -> str:
    labels = {"unloaded": "unloaded", "two_classes": "KV saturating, two classes", "one_class": "KV saturating, one class"}
    rows = [[labels[name], ms(run["p50_s"], 2), ms(run["p99_s"], 2), ratio(d["p50_over_unloaded"][name]),
             f"**{ratio(d['p99_over_unloaded'][name])}**"] for name in labels for run in [d["runs"][name]]]
    return (f"{num(d['burst_bytes'] / 1024)} KiB bursts every {d['burst_period_s'] * 1e3:g} ms over a "
            f"{num(d['cnic_bytes_per_s'] / 1e6)} MB/s CNIC ({ms(d['wire_time_s'], 2)} ms on the wire), "
            f"{d['runs']['unloaded']['count']} bursts per run.\n\n"
            + table(["run", "burst p50 ms", "burst p99 ms", "p50 / unloaded", "p99 / unloaded"], rows))


def _tp_flags(d: Node) -> str:
    flags = [f"--rounds {d['rounds']}"]
    if d["gso_max_bytes"] is not None:
        flags.append(f"--gso-kib {d['gso_max_bytes'] // 1024}")
    if d["bulk"] in ("copy", "mooncake"):
        flags.append(f"--bulk-{d['bulk']}")
    return " ".join(flags)


def _paired(d: Node, classes: str, pair: str) -> Node:
    return d["paired_by_round"][classes][pair]


@block("tp_lanes", reads=TP_RUNS,
       command="dualpath bench tp-lanes --testbed --steps 240 FLAGS --json docs/results/testbed/tp_lanes_NAME.json "
               "--plot docs/results/testbed/tp_lanes_NAME.png")
def tp_lanes(r: Results) -> str:
    rows = []
    for rel in TP_RUNS:
        d = r.json(rel)
        runs, sat_idle = d["runs"], _paired(d, "two_classes", "saturated_over_idle")
        ci = sat_idle["ci95"]
        tpot = " / ".join(ms(runs[f"{load}_two_classes"]["tpot_mean_s"], 1) for load in ("idle", "kv_elsewhere", "saturated"))
        rows.append([rel.removeprefix("testbed/tp_lanes_").removesuffix(".json"), f"`{_tp_flags(d)}`", d["steps"],
                     f"{mb(d['cnic_bytes_per_s'])} MB/s", tpot,
                     f"{ratio(d['tpot_saturated_over_idle']['two_classes'])}, **{ratio(sat_idle['median'])}** "
                     f"[{ratio(ci[0])}-{ratio(ci[1])}]",
                     ratio(_paired(d, "two_classes", "saturated_over_kv_elsewhere")["median"]),
                     ratio(_paired(d, "two_classes", "kv_elsewhere_over_idle")["median"]),
                     f"{num(d['tpot_saturated_over_idle']['one_class'], 1)}, "
                     f"{num(_paired(d, 'one_class', 'saturated_over_idle')['median'], 1)}",
                     f"{ratio(d['ttft_saturated_over_idle']['two_classes'])}, "
                     f"{num(d['ttft_saturated_over_idle']['one_class'], 1)}",
                     "yes" if d["same_tokens"] else "NO"])
    return table(["run", "flags", "steps", "CNIC", "two classes: TPOT idle / KV elsewhere / saturated ms",
                  "saturated / idle: pooled, paired median [95%]", "saturated / KV elsewhere, median",
                  "KV elsewhere / idle, median", "one FIFO class, saturated / idle: pooled, median",
                  "TTFT saturated / idle: two classes, one", "same tokens as one rank"], rows)


ACK_BYTES_PER_SEGMENT_IN = 66 / 1448  # at most one 66-byte TCP ack per 1,448-byte segment received (Ethernet MTU 1,500)


def _ledger_span(d: Node, mode: str) -> str:
    """kernel / stated over the links that carried KV, and whether every link the runtime stated bytes
    on lies within stated <= kernel <= 1.02 x stated + the acks of what came in on the port (the
    testbed tests' bound; a CNIC that only received KV sends little but those acks)."""
    rows = [x for x in d["ledger_vs_kernel"] if x["mode"] == mode and x["kernel_over_stated"] is not None]
    kv = [x["kernel_over_stated"] for x in rows if x["runtime_bytes"] > 0]
    if any("kernel_in_bytes" not in x for x in rows):
        bound = "not recorded"
    else:
        bound = "yes" if all(x["stated_bytes"] <= x["kernel_bytes"] <= 1.02 * x["stated_bytes"]
                             + (x["kernel_in_bytes"] or 0) * ACK_BYTES_PER_SEGMENT_IN for x in rows) else "NO"
    return f"{span(kv, lambda v: f'{v:.3f}')} (all within bound: {bound})"


@block("testbed_demo", reads=tuple(TESTBED_DEMOS),
       command=("dualpath demo --testbed --json docs/results/testbed/demo.json --plot docs/results/testbed/demo.png",
                "the same with --ray into demo_ray.json, with --tp 2 into demo_tp2.json"))
def testbed_demo(r: Results) -> str:
    rows = []
    for rel, label in TESTBED_DEMOS.items():
        d = r.json(rel)
        runs = {m["mode"]: m for m in d["runs"]}
        for mode, m in runs.items():
            rows.append([label, mode, num(m["jct_s"], 1), num(m["ttft_s"]["p50"], 2), num(m["ttft_s"]["p90"], 2),
                         ms(m["tpot_s"]["mean"], 1), mb(m["bytes"]["storage_to_prefill"]), mb(m["bytes"]["storage_via_decode"]),
                         _ledger_span(d, mode), "yes" if m["tokens_sha256"] == d["reference_tokens_sha256"] else "NO"])
        rows[-1][1] += f" (**{ratio(runs['dualpath']['jct_s'] / runs['basic']['jct_s'])}** of basic's JCT)"
    failed = [f"`{rel}`: {c}" for rel in TESTBED_DEMOS for c in r.json(rel).get("failed_checks", [])]
    rates = "; ".join(f"{label}: SNIC {num(r.json(rel)['config']['rates']['snic_bytes_per_s'] / 1e6, 1)} MB/s, "
                      f"CNIC {num(r.json(rel)['config']['rates']['cnic_bytes_per_s'] / 1e6, 1)} MB/s, "
                      f"{num(r.json(rel)['runs'][0]['num_turns'])} turns"
                      for rel, label in TESTBED_DEMOS.items())
    return (f"Emulated rates and workload size, both set from the compute speed measured at the start of each run: "
            f"{rates}. Checks the demo failed: {'; '.join(failed) if failed else 'none'}.\n\n"
            + table(["run", "mode", "JCT s", "TTFT p50 s", "TTFT p90 s", "TPOT ms", "PE-path MB", "DE-path MB",
                     "kernel / stated, per link with KV", "tokens as one host"], rows))


@block("testbed_demo_ray_restart", reads=("testbed/demo_ray.json",),
       command="dualpath demo --testbed --ray --json docs/results/testbed/demo_ray.json "
               "--plot docs/results/testbed/demo_ray.png")
def testbed_demo_ray_restart(r: Results) -> str:
    restart = r.json("testbed/demo_ray.json")["ray"]["restart"]
    return table(["decode actor pid before / after kill -9", "in-flight request: same tokens, done after",
                  "next request: same tokens, done after", "restarts counted by /health"],
                 [[f"{restart['before']['pid']} / {restart['after']['pid']}",
                   f"{'yes' if restart['in_flight_same'] else 'NO'}, {restart['in_flight_s']:.1f} s",
                   f"{'yes' if restart['next_same'] else 'NO'}, {restart['next_done_s']:.1f} s",
                   ", ".join(f"engine {k}: {v}" for k, v in restart["health"]["restarts"].items())]])


@block("testbed_demo_tp2_collectives", reads=("testbed/demo_tp2.json",),
       command="dualpath demo --testbed --tp 2 --json docs/results/testbed/demo_tp2.json "
               "--plot docs/results/testbed/demo_tp2.png")
def testbed_demo_tp2_collectives(r: Results) -> str:
    d = r.json("testbed/demo_tp2.json")
    role = {"-p0": "PE", "-d0": "DE"}
    rows = [[x["mode"], next((v for k, v in role.items() if str(x["host"]).endswith(k)), x["host"]), mb(x["runtime_lc_bytes"]),
             mb(x["kernel_rank0_to_rank1_bytes"]), mb(x["kernel_rank1_to_rank0_bytes"]), mb(x["kernel_lc_class_bytes"]),
             num(x["kernel_kv_class_bytes"])] for x in d["collectives_vs_kernel"]]
    return table(["mode", "engine", "rank 0's collectives on the LC ledger, MB", "kernel, rank 0 -> rank 1, MB",
                  "kernel, rank 1 -> rank 0, MB", "kernel, LC class, both ways, MB", "kernel, KV class, both ways, bytes"],
                 rows)
