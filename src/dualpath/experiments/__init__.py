"""The paper's experiments regenerated in the simulator (`dualpath repro`).

One module per experiment (table1, fig7, fig8, fig9, fig10_11, fig12, fig13_14, table3), each
with `run(ctx) -> ExperimentOutput`; `registry.EXPERIMENTS` lists them in report order, and
`registry.OPT_IN` those run only when named (beyond: split reads, beyond the paper);
`common` holds the context, headlines and markdown/figure helpers; `simrun` runs (and caches)
one simulation and its probes; `suite` writes DIR/<name>.json, DIR/report.md, DIR/summary.json;
`cli` is the `repro` command.
"""
