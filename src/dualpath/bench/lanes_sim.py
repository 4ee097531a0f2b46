"""`dualpath bench lanes --sim`: what the lanes buy in the simulator (docs/results/sim/lanes_ep.json).

The MoE presets' EP dispatch/combine rides each GPU's CNIC on the latency-critical lane
(costmodel/ep_traffic.py, sim/ep_comm.py). One workload, DualPath mode, run six ways:

    KV on the CNICs:   the workload's own (streams, PD transfer, H2D)  |  + a flood on every CNIC
    EP bursts see:     an empty link (reference) | two classes, 99:1 | one FIFO class

"An empty link" is the counterfactual `ep_ignores_kv`: the bursts take their unloaded time and take
nothing from the KV lane, the rest of the run unchanged; it is TPOT "without KV traffic" on the same
schedule. The flood (`cnic_kv_flood`) is a KV flow that never ends on each CNIC direction: the KV
class saturated, the worst case for the latency-critical lane. Each case reports TPOT (mean, p90), TTFT and JCT, with
TPOT over its reference's; deterministic (a simulation), so one run per case.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..config import SimConfig

CASES = (("reference", False, True), ("two_classes", False, False), ("one_class", True, False))  # name, one_class, ignores


def _case_config(base: SimConfig, flood: bool, one_class: bool, ignores_kv: bool) -> SimConfig:
    weights = replace(base.scheduler.lane_weights, one_class=one_class)
    return replace(base, cluster=replace(base.cluster, cnic_kv_flood=flood, ep_ignores_kv=ignores_kv),
                   scheduler=replace(base.scheduler, lane_weights=weights))


def _row(result: dict[str, Any]) -> dict[str, float]:
    return {"tpot_mean_s": result["tpot_s"]["mean"], "tpot_p90_s": result["tpot_s"]["p90"],
            "ttft_p50_s": result["ttft_s"]["p50"], "jct_s": result["jct_s"],
            "cnic_lane_latency_critical_bytes": result["bytes"]["cnic_lane_latency_critical"],
            "cnic_lane_kv_bytes": result["bytes"]["cnic_lane_kv"], "cnic_mean_utilisation": result["nic_utilisation"]["cnic_mean"]}


def run_lanes_sim(base: SimConfig, progress=None) -> dict[str, Any]:
    from ..sim.runner import run_modes

    out: dict[str, Any] = {"model": base.cluster.model, "pd": base.cluster.pd, "agents": base.workload.num_agents,
                           "max_len_tokens": base.workload.max_len_tokens, "mode": "dualpath", "kv": {}}
    for kv, flood in (("workload", False), ("flood", True)):
        rows = {}
        for name, one_class, ignores in CASES:
            rows[name] = _row(run_modes(_case_config(base, flood, one_class, ignores), ["dualpath"])["runs"][0])
            if progress:
                progress(f"{kv} / {name}: TPOT {rows[name]['tpot_mean_s'] * 1e3:.2f} ms")
        ref = rows["reference"]["tpot_mean_s"]
        for r in rows.values():
            r["tpot_over_reference"] = r["tpot_mean_s"] / ref
        out["kv"][kv] = rows
    return out


def plot_lanes_sim(result: dict[str, Any], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [c[0] for c in CASES]
    for i, (kv, rows) in enumerate(result["kv"].items()):
        ax.bar([j + 0.38 * i for j in range(len(names))], [rows[n]["tpot_mean_s"] * 1e3 for n in names], 0.38,
               label=f"KV: {kv}")
    ax.set_xticks([j + 0.19 for j in range(len(names))], ["empty link (ref.)", "two classes 99:1", "one FIFO class"])
    ax.set_ylabel("TPOT mean, ms")
    ax.set_ylim(0, 1.3 * max(r["tpot_mean_s"] for rows in result["kv"].values() for r in rows.values()) * 1e3)
    ax.set_title(f"EP bursts on the CNICs, {result['model']} {result['pd']}, {result['agents']} agents (sim)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
