"""The experiments, in report order: name -> module with NAME, TITLE and run(ctx)."""

from __future__ import annotations

from types import ModuleType

from . import fig7, fig8, fig9, fig10_11, fig12, fig13_14, table1, table3

EXPERIMENTS: dict[str, ModuleType] = {m.NAME: m for m in (table1, fig7, fig8, fig9, fig10_11, fig12, fig13_14, table3)}
