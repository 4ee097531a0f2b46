"""The fidelity figure: per mode, the runtime (mean, with its repeats) and the simulator side by
side for each metric, normalised to the runtime's mean; and the TTFT CDF of both worlds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

_SHOWN = ("jct_s", "ttft_p50_s", "ttft_p90_s", "ttst_mean_s", "tpot_mean_s", "pe_path_bytes", "de_path_bytes")


def plot_fidelity(report: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(report["modes"])
    fig, axes = plt.subplots(2, len(modes), figsize=(6 * len(modes), 8), squeeze=False)
    for j, mode in enumerate(modes):
        m = report["modes"][mode]["metrics"]
        ax = axes[0][j]
        x = np.arange(len(_SHOWN))
        real = [1.0 if m[k]["runtime_mean"] else 0.0 for k in _SHOWN]
        sim = [m[k]["sim"] / m[k]["runtime_mean"] if m[k]["runtime_mean"] else 0.0 for k in _SHOWN]
        ax.bar(x - 0.2, real, 0.4, label="runtime (mean)")
        ax.bar(x + 0.2, sim, 0.4, label="simulator")
        for i, k in enumerate(_SHOWN):
            runs = m[k]["runtime_runs"]
            if m[k]["runtime_mean"]:
                ax.plot([i - 0.2] * len(runs), [r / m[k]["runtime_mean"] for r in runs], "k.", ms=4)
        ax.set_xticks(x, [k.replace("_s", "").replace("_", " ") for k in _SHOWN], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("relative to the runtime's mean")
        ax.set_title(f"{mode}")
        ax.legend(fontsize=8)
        ax = axes[1][j]
        samples = report["modes"][mode]["ttft_samples"]
        for label, values in [("simulator", samples["sim"])] + [(f"runtime #{i + 1}", v) for i, v in enumerate(samples["runtime"])]:
            v = np.sort(np.asarray(values, dtype=float))
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=label)
        ax.set_xlabel("TTFT s")
        ax.set_ylabel("CDF")
        ax.legend(fontsize=8)
    fig.suptitle(f"fidelity: {report['workload']} workload, {report['model']} ({report['repeat']} runtime repeat(s))")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
