"""Simulator speed: turns per second, pure Python and compiled; the 48P96D run; Table 3's scale
runs; the paper's experiments on Ray against serially."""

from __future__ import annotations

from ..fmt import num, ratio, sig, table
from ..registry import block
from ..results import Results


@block("sim_speed", reads=("sim_speed.json", "sim_speed_compiled.json"),
       command=("dualpath bench sim-speed --agents 512,1024,2048 --json docs/results/sim_speed.json "
                "--plot docs/results/sim_speed.png",
                "make compiled, then the same into sim_speed_compiled.json / .png"))
def sim_speed(r: Results) -> str:
    pure, compiled = r.json("sim_speed.json"), r.json("sim_speed_compiled.json")
    rows, same = [], True
    for p, c in zip(pure["rows"], compiled["rows"], strict=True):
        same = same and p["jct_s"] == c["jct_s"] and p["num_events"] == c["num_events"]
        rows.append([num(p["agents"]), num(p["num_turns"]), num(p["num_events"]), f"{p['wall_s']:.1f}",
                     num(p["turns_per_wall_s"]), num(p["turns_per_million_heap_ops"]), f"{c['wall_s']:.1f}",
                     num(c["turns_per_wall_s"]), num(c["turns_per_million_heap_ops"]), f"{p['wall_s'] / c['wall_s']:.2f}x",
                     f"{min(x['heap_ops_per_s'] for x in (p, c)) / 1e6:.2f}-{max(x['heap_ops_per_s'] for x in (p, c)) / 1e6:.2f}"])
    code = {pure.get("simulator_code", "unrecorded"), compiled.get("simulator_code", "unrecorded")}
    return (f"{pure['model']}, {pure['pd']}, MaxLen {pure['max_len']}, {pure['mode']} mode, one process, simulator code "
            f"`{', '.join(sorted(code))}`. JCTs and event counts equal in both builds: {'yes' if same else 'NO'}. Turns per "
            "second depend on the machine and its load; \"per M heap ops\" divides them by the machine's own speed at "
            "push and pop on a binary heap, measured around each run (`bench/sim_speed.py`), and compares runs made on "
            "different machines or days.\n\n"
            + table(["agents", "turns", "events", "pure wall s", "pure turns/s", "pure turns per M heap ops",
                     "compiled wall s", "compiled turns/s", "compiled turns per M heap ops", "speed-up",
                     "machine, M heap ops/s"], rows))


@block("sim_48p96d", reads=("repro/table3.json",),
       command="dualpath repro --out DIR (the table3 experiment; its 48P96D offline run)")
def sim_48p96d(r: Results) -> str:
    t = r.json("repro/table3.json")
    run = next(x for x in t["table"] if x["kind"] == "offline" and x["pd"] == "48P96D")
    rows = [[", ".join(t["sim_builds"]), num(run["agents"]), num(run["turns"]), num(run["decisions"]),
             f"{num(run['wall_s'])} ({run['wall_s'] / 60:.1f} min)", num(run["turns"] / run["wall_s"]),
             f"{sig(run['cpu_us_per_decision'])} us per decision", num(run["jct_s"], 1)]]
    return (f"Simulator code `{t['simulator_code']}`.\n\n"
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
