"""Simulator speed: turns per second, pure Python and compiled; the 48P96D run; Table 3's scale
runs; the paper's experiments on Ray against serially."""

from __future__ import annotations

from ..fmt import num, ratio, sig, table
from ..registry import block
from ..results import Results


@block("sim_speed", reads=("sim_speed.json",),
       command=("git worktree add /tmp/base 438c27d (the code before this speed work, its pure build), then "
                "dualpath bench sim-speed --agents 512,1024,2048 --builds pure,compiled --against /tmp/base/src "
                "--json docs/results/sim_speed.json --plot docs/results/sim_speed.png"))
def sim_speed(r: Results) -> str:
    d = r.json("sim_speed.json")
    labels = [v["label"] for v in d["variants"]]
    code = {v["label"]: v["simulator_code"] for v in d["variants"]}
    mine = [v["label"] for v in d["variants"] if v["src"] == "this tree"]
    base = [v["label"] for v in d["variants"] if v["src"] != "this tree"]
    built = {v["label"]: v["build"] for v in d["variants"]}
    runs = {lab: [x for x in d["rows"] if x["variant"] == lab] for lab in labels}  # each in agent-count order
    pairs = [(f"{b} / {a}", a, b) for a, b in zip(mine[:1] * len(mine[1:]), mine[1:])]  # compiled over pure
    pairs += [(f"{m} / {b}", b, m) for b in base for m in mine if m == built[b]]  # the same build, older code
    rows, same = [], True
    for i, first in enumerate(runs[mine[0]]):
        at = {lab: runs[lab][i] for lab in labels}
        same = same and all(at[lab]["jct_s"] == first["jct_s"] and at[lab]["num_events"] == first["num_events"]
                            for lab in mine)
        ups = [f"**{at[slow]['wall_s'] / at[fast]['wall_s']:.2f}x**" for _, slow, fast in pairs]
        heap = [at[lab]["heap_ops_per_s"] / 1e6 for lab in labels]
        rows.append([num(first["agents"]), num(first["num_turns"]), num(first["num_events"]),
                     *[num(at[lab]["turns_per_wall_s"]) for lab in labels], *ups, f"{min(heap):.2f}-{max(heap):.2f}"])
    other = ""
    if base:
        b0 = base[0]
        same_base = all(x["jct_s"] == y["jct_s"] for x, y in zip(runs[b0], runs[mine[0]], strict=True))
        other = (f" `{b0}` is another checkout (code `{code[b0]}`, its {built[b0]} build): the code "
                 f"before this tree's speed work; its JCTs {'equal' if same_base else 'differ from'} this tree's.")
    return (f"{d['model']}, {d['pd']}, MaxLen {d['max_len']}, {d['mode']} mode, one process per run, every variant at one "
            f"agent count before the next (interleaved, so the machine's drift falls on all alike). This tree's code "
            f"`{code[mine[0]]}`; JCTs and event counts equal in its builds: {'yes' if same else 'NO'}.{other} Turns per "
            "second depend on the machine and its load; the ratios are of wall times measured side by side; the last "
            "column is the machine's own speed at push and pop on a binary heap around each run (`bench/sim_speed.py`).\n\n"
            + table(["agents", "turns", "events", *[f"{lab} turns/s" for lab in labels], *[p[0] for p in pairs],
                     "machine, M heap ops/s"], rows))


@block("sim_48p96d", reads=("sim/48p96d_offline.json", "repro/table3.json"),
       command="dualpath sim --model ds-v3.2-660b --pd 48P96D --max-len 64k --agents 49152 --mode dualpath --seed 1 "
               "--quiet --json docs/results/sim/48p96d_offline.json")
def sim_48p96d(r: Results) -> str:
    run = r.json("sim/48p96d_offline.json")["runs"][0]
    t = r.json("repro/table3.json")
    old = next(x for x in t["table"] if x["kind"] == "offline" and x["pd"] == "48P96D")
    decisions = run["scheduler"]["decisions"]
    rows = [[run["build"], num(run["num_agents"]), num(run["num_turns"]), num(decisions),
             f"{num(run['wall_s'])} ({run['wall_s'] / 60:.1f} min)", num(run["turns_per_wall_s"]),
             f"{sig(run['policy_wall_s'] / decisions * 1e6)} us per decision", num(run["jct_s"], 1)]]
    same = "equals" if round(run["jct_s"], 6) == round(old["jct_s"], 6) else "differs from"
    return (f"Its JCT {same} the one the last full `repro` recorded for the same run (Table 3 below, {num(old['jct_s'], 1)} s, "
            f"simulator code `{t['simulator_code']}`, {num(old['wall_s'])} s on its build and day).\n\n"
            + table(["build", "agents", "turns", "scheduling decisions", "simulation wall s", "turns/s", "policy",
                     "JCT s"], rows))


@block("table3", reads=("repro/table3.json",), command="dualpath repro --out DIR (the table3 experiment)")
def table3(r: Results) -> str:
    t = r.json("repro/table3.json")
    offline = [[x["size"], x["pd"], num(x["agents"]), num(x["jct_s"]), num(x["paper_jct_s"]), num(x["turns"]),
                num(x["decisions_per_s"]), sig(x["cpu_us_per_decision"]), sig(x["scheduler_cores"])]
               for x in t["table"] if x["kind"] == "offline"]
    online = [[x["size"], x["pd"], x["aps"], sig(x["ttft_mean_s"]), x["paper_ttft_s"], sig(x["ttst_mean_s"]),
               x["paper_ttst_s"], sig(x["tpot_mean_s"]), x["paper_tpot_s"], sig(x["scheduler_cores"])]
              for x in t["table"] if x["kind"] == "online"]
    return (table(["run", "P/D", "agents", "JCT s", "paper JCT s", "turns", "decisions/s", "CPU us/decision",
                   "scheduler cores"], offline) + "\n\n"
            + table(["run", "P/D", "APS", "TTFT s", "paper", "TTST s", "paper", "TPOT s", "paper", "scheduler cores"], online))


@block("ray_repro", reads=("ray/ray_repro_quick.json",),
       command="dualpath bench ray-repro --scale quick --workers 2 --out DIR "
               "(DIR/bench.json copied to docs/results/ray/ray_repro_quick.json)")
def ray_repro(r: Results) -> str:
    d = r.json("ray/ray_repro_quick.json")
    rows = [[d["scale"], d["num_sims"], num(d["serial_s"], 1), num(d["ray_s"], 1), f"{d['ray_startup_s']:.1f}",
             f"{d['ray_shutdown_s']:.1f}", f"**{ratio(d['ratio'])}**", "yes" if not len(d["differing"]) else "NO"]]
    return (f"A local Ray cluster of {d['workers']} CPUs on a {d['cpu_count']}-CPU machine (1-minute load average at the end "
            f"{d['load_avg_1min']:.1f}).\n\n"
            + table(["scale", "simulations", "serial s", "Ray s (start-up to shutdown)", "Ray start-up s", "shutdown s",
                     "Ray / serial", "experiment JSONs identical"], rows))
