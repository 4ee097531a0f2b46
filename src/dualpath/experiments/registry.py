"""The experiments, in report order: name -> module with NAME, TITLE and run(ctx).

`EXPERIMENTS` is the default suite, the paper's experiments (`dualpath repro`); `OPT_IN` runs only
when named (`--only NAME`): `beyond`, `selective`, `dram` and `policies` compare no number of the paper, and its grid would lengthen
the default suite and its smoke test (tests/experiments/test_repro.py). `ALL` is both, the names
`--only` accepts and the sections a report collects."""

from __future__ import annotations

from types import ModuleType

from . import beyond, dram, fig7, fig8, fig9, fig10_11, fig12, fig13_14, policies, selective, table1, table3

EXPERIMENTS: dict[str, ModuleType] = {m.NAME: m for m in (table1, fig7, fig8, fig9, fig10_11, fig12, fig13_14, table3)}
OPT_IN: dict[str, ModuleType] = {m.NAME: m for m in (beyond, selective, dram, policies)}
ALL: dict[str, ModuleType] = {**EXPERIMENTS, **OPT_IN}
