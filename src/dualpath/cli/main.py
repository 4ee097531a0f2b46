"""The command line: one Typer app, every command a top-level function in the module of its
world (sim.py, runtime.py, demo.py, bench.py; repro in experiments/cli.py). This module only wires
them; nothing imports cli/.

Bad input prints one clear message and exits with code 2, never a traceback (errors.run_cli).
"""

from __future__ import annotations

import typer

from ..errors import run_cli
from ..experiments.cli import repro
from . import bench, bench_tp, chaos, demo, docs, fidelity, plan, runtime, sim, store, sweep, testbed

app = typer.Typer(add_completion=False, no_args_is_help=True, help="DualPath: dual-path KV-cache loading (runtime + simulator).")
trace_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Generate and inspect workloads.")
bench_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Benchmarks that print and save their figures.")
app.add_typer(trace_app, name="trace")
app.add_typer(bench_app, name="bench")
store_app = typer.Typer(add_completion=False, no_args_is_help=True, help="The KV storage service.")
app.add_typer(store_app, name="store")
store_app.command("serve")(store.serve)
testbed_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Emulated hosts on this machine (root).")
app.add_typer(testbed_app, name="testbed")
testbed_app.command("up")(testbed.up)
testbed_app.command("down")(testbed.down)
testbed_app.command("status")(testbed.status)
app.add_typer(docs.docs_app, name="docs")

app.command()(sim.sim)
app.command()(sweep.sweep)
app.command()(plan.plan)
trace_app.command("gen")(sim.trace_gen)
trace_app.command("stats")(sim.trace_stats)
app.command("repro", help="Regenerate the paper's experiments (Table 1, Figs. 7-14, Table 3) in the simulator.")(repro)
app.command()(runtime.generate)
app.command()(runtime.serve)
app.command()(runtime.engine)
app.command()(runtime.run)
app.command()(demo.demo)
app.command()(demo.calibrate)
app.command()(fidelity.fidelity)
app.command()(chaos.chaos)
bench_app.command("sim-speed")(bench.bench_sim_speed)
bench_app.command("plan")(plan.bench_plan)
bench_app.command("plan-local")(plan.bench_plan_local)
bench_app.command("lanes")(bench.bench_lanes)
bench_app.command("tp-lanes")(bench_tp.bench_tp_lanes)
bench_app.command("transport")(bench.bench_transport)
bench_app.command("store")(bench.bench_store)
bench_app.command("checksum")(bench.bench_checksum)
bench_app.command("remote-write")(bench.bench_remote_write)
bench_app.command("overload")(bench.bench_overload)
bench_app.command("soak")(bench.bench_soak)
bench_app.command("salts")(bench.bench_salts)
bench_app.command("ray-repro")(bench.bench_ray_repro)
bench_app.command("model-speed")(demo.bench_model_speed)
bench_app.command("demo-robustness")(demo.bench_demo_robustness)
bench_app.command("cold")(demo.bench_cold)


def main() -> None:
    """Entry point (see `errors.run_cli` for how errors exit)."""
    run_cli(app)


if __name__ == "__main__":
    main()
