"""The fidelity figure: per mode, the runtime (mean, with its repeats), the predicted and the
replayed simulation side by side for each metric, normalised to the runtime's mean; and the TTFT
CDF of the runtime's runs and the prediction."""

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
        r = report["modes"][mode]
        stats = r["runtime"]
        ax = axes[0][j]
        x = np.arange(len(_SHOWN))
        real = [1.0 if stats[k]["mean"] else 0.0 for k in _SHOWN]
        ax.bar(x - 0.27, real, 0.27, label="runtime (mean)")
        for off, name in ((0.0, "predicted"), (0.27, "replayed")):
            e = r["errors"][name]
            ax.bar(x + off, [e[k]["sim"] / stats[k]["mean"] if stats[k]["mean"] else 0.0 for k in _SHOWN], 0.27,
                   label=f"simulator, {name}")
        for i, k in enumerate(_SHOWN):
            if stats[k]["mean"]:
                runs = stats[k]["runs"]
                ax.plot([i - 0.27] * len(runs), [v / stats[k]["mean"] for v in runs], "k.", ms=4)
        ax.set_xticks(x, [k.replace("_s", "").replace("_", " ") for k in _SHOWN], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("relative to the runtime's mean")
        ax.set_title(f"{mode}")
        ax.legend(fontsize=8)
        ax = axes[1][j]
        samples = report["modes"][mode]["ttft_samples"]
        for label, values in [("simulator, predicted", samples["sim"])] + [(f"runtime #{i + 1}", v) for i, v in enumerate(samples["runtime"])]:
            v = np.sort(np.asarray(values, dtype=float))
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=label)
        ax.set_xlabel("TTFT s")
        ax.set_ylabel("CDF")
        ax.legend(fontsize=8)
    fig.suptitle(f"fidelity: {report['workload']}, {report['model']} ({report['repeat']} runtime repeat(s); "
                 f"calibrated on {', '.join(report['calibration']['workloads']) or 'drift only'})", fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
