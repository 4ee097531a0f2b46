"""The comparison figure shared by `dualpath sim`, `demo` and `run`: JCT, TTFT p50/p90, and KV
bytes read by path, one bar group per run."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_runs(result: dict[str, Any], path: str | Path, title: str = "", bytes_scale: float = 1e12, bytes_unit: str = "TB") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    names = [r["mode"] for r in runs]
    x = range(len(names))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    axes[0].bar(names, [r["jct_s"] for r in runs], color="#4c72b0")
    axes[0].set_ylabel("JCT (s)")
    axes[0].set_title("job completion time")
    axes[1].bar([i - 0.2 for i in x], [r["ttft_s"]["p50"] for r in runs], width=0.4, label="p50")
    axes[1].bar([i + 0.2 for i in x], [r["ttft_s"]["p90"] for r in runs], width=0.4, label="p90")
    axes[1].set_xticks(list(x), names)
    axes[1].set_ylabel("TTFT (s)")
    axes[1].legend()
    axes[1].set_title("time to first token")
    pe = [r["bytes"]["storage_to_prefill"] / bytes_scale for r in runs]
    de = [r["bytes"]["storage_via_decode"] / bytes_scale for r in runs]
    axes[2].bar(names, pe, label="PE read path")
    axes[2].bar(names, de, bottom=pe, label="DE read path")
    axes[2].set_ylabel(f"KV read from storage ({bytes_unit})")
    axes[2].legend()
    axes[2].set_title("bytes by read path")
    for ax in axes:
        ax.tick_params(axis="x", rotation=20)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=120)
    plt.close(fig)
