"""Table 1 (PAPER.md 4.1): cache-compute ratio, GB of KV loaded per PFLOP of prefill, at 16K-64K
context with a 429-token append (`core.cost.cache_compute_ratio_gb_per_pflop`). Pure arithmetic:
the same at every scale."""

from __future__ import annotations

from ..core.cost import cache_compute_ratio_gb_per_pflop
from ..core.models import get_model
from .common import Context, ExperimentOutput, Headline, headline_table, md_table, pyplot, save_figure

NAME = "table1"
TITLE = "Table 1: cache-compute ratio (GB/PFLOP)"
CONTEXTS = (16384, 32768, 49152, 65536)
# PAPER.md 4.1 Table 1 [P]: (16K, 64K) ends of each model's range.
PAPER = {
    "ds-v3.2-660b": ("DeepSeek-V3.2 660B", 13.0, 36.0),
    "ds-v3-660b": ("DeepSeek-V3 660B", 4.8, 5.8),
    "qwen2.5-32b": ("Qwen2.5-32B (FP16 KV)", 117.0, 267.0),
    "gpt-oss-120b": ("GPT-OSS-120B", 47.0, 95.0),
    "qwen3-235b-a22b": ("Qwen3-235B-A22B", 39.0, 60.0),
}
TARGET = 0.10
DS_V3_NOTE = (
    "known miss: HARDWARE.md 6 and tests/core/test_cost.py count FP8 latent KV (656 B/layer) and dense "
    "MQA-mode attention and get 4.37 / 5.16; the paper's V3 accounting is not published and the same "
    "convention reproduces the four other rows"
)
QUOTED_V32 = 22.0  # PAPER.md 4.1 [P]: "about 22 GB/PFLOP" at the trace's mean context 32.7K


def run(ctx: Context) -> ExperimentOutput:
    table, headlines = [], []
    for name, (label, p16, p64) in PAPER.items():
        m = get_model(name)
        row = {"model": name, "label": label, **{f"ctx_{c // 1024}k": cache_compute_ratio_gb_per_pflop(m, c) for c in CONTEXTS},
               "paper_16k": p16, "paper_64k": p64}
        table.append(row)
        for ctx_k, paper in (("16k", p16), ("64k", p64)):
            note = DS_V3_NOTE if name == "ds-v3-660b" else ""
            headlines.append(Headline(NAME, f"{label} @ {ctx_k.upper()}", row[f"ctx_{ctx_k}"], paper, TARGET, note=note))
    v32_mean = cache_compute_ratio_gb_per_pflop(get_model("ds-v3.2-660b"), 32721 - 429)
    headlines.append(Headline(NAME, "DeepSeek-V3.2 @ 32.7K (trace mean)", v32_mean, QUOTED_V32, TARGET))
    fig = _figure(ctx, table)
    md = _markdown(table, headlines)
    return ExperimentOutput(NAME, TITLE, table, headlines, [fig], md)


def _figure(ctx: Context, table: list[dict]) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    xs = [c / 1024 for c in CONTEXTS]
    for i, row in enumerate(table):
        color = f"C{i}"
        ax.plot(xs, [row[f"ctx_{c // 1024}k"] for c in CONTEXTS], "-o", color=color, label=f"{row['label']} (ours)")
        ax.plot([16, 64], [row["paper_16k"], row["paper_64k"]], "x", color=color, markersize=10, mew=2)
    ax.plot([], [], "kx", label="paper (Table 1 ends)")
    ax.set_yscale("log")
    ax.set_xlabel("context length (K tokens), append 429")
    ax.set_ylabel("cache-compute ratio (GB / PFLOP)")
    ax.set_title("Table 1: KV bytes loaded per prefill FLOP")
    ax.legend(fontsize=7)
    return save_figure(fig, ctx, "table1.png")


def _markdown(table: list[dict], headlines: list[Headline]) -> str:
    rows = [[r["label"], *(r[f"ctx_{c // 1024}k"] for c in CONTEXTS), f"{r['paper_16k']:g}-{r['paper_64k']:g}"] for r in table]
    return "\n\n".join([
        "Formula (PAPER.md 4.1 [I], HARDWARE.md 6): C cached tokens loaded at the Table-1 KV convention, "
        "429 appended tokens each costing F(C) = linear + attention over C keys (DSA: top-k plus indexer).",
        md_table(["model", "16K", "32K", "48K", "64K", "paper"], rows),
        headline_table(headlines),
        f"DeepSeek-V3: {DS_V3_NOTE}.",
        "![Table 1](table1.png)",
    ])
