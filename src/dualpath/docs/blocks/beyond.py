"""Beyond the paper: split reads (`dualpath+split`) against DualPath on the grid of
experiments/beyond.py, from its JSON."""

from __future__ import annotations

from ..fmt import num, pct, ratio, sig, table
from ..registry import block
from ..results import Node, Results

BEYOND_JSON = "beyond/beyond.json"
BEYOND_COMMAND = ("dualpath repro --only beyond --out DIR (then DIR/beyond.json and DIR/beyond.png copied to "
                  "docs/results/beyond/)")
MODES = ("basic", "dualpath", "dualpath+split", "oracle")


@block("beyond", reads=(BEYOND_JSON,), command=BEYOND_COMMAND)
def beyond(r: Results) -> str:
    d = r.json(BEYOND_JSON)
    g, t = d["goals"], d["thresholds"]
    rows = [_row(p) for p in d["table"]]
    text = (f"Scale `{d['scale']}`, seed {d['seed']}, simulator code `{d['simulator_code']}`, {num(d['num_sims'])} "
            f"simulations ({num(d['sim_wall_s'])} s). The goals of split reads hold on **{g['num_hold']} of "
            f"{g['num_points']} grid points**: JCT at most {pct(t['no_regression_jct_fraction'], 0, False)} over "
            f"dualpath's on {g['num_no_regression']} of {g['num_points']}; on the unbalanced ones (PE SNICs at a "
            f"fraction of the DE's), at least {pct(t['unbalanced_jct_gain_fraction'], 0, False)} lower JCT or "
            f"{pct(t['unbalanced_ttft_p99_gain_fraction'], 0, False)} lower TTFT p99 on {g['num_unbalanced_gain']} of "
            f"{g['num_unbalanced']}.")
    header = ["point", "agents", *(f"JCT s {m}" for m in MODES), "split JCT / dualpath", "split TTFT p99 / dualpath",
              "PE / DE path GB, dualpath", "PE / DE path GB, split", "binding, dualpath / split", "goal"]
    return text + "\n\n" + table(header, rows)


def _row(p: Node) -> list[str]:
    modes, goal = p["modes"], p["goal"]
    dual, split = modes["dualpath"], modes["dualpath+split"]
    return [p["point"], num(p["agents"]), *(sig(modes[m]["jct_s"]) for m in MODES),
            f"**{ratio(goal['split_jct_over_dualpath'], 3)}**", ratio(goal["split_ttft_p99_over_dualpath"], 3),
            f"{_gb(dual['pe_path_bytes'])} / {_gb(dual['de_path_bytes'])}",
            f"{_gb(split['pe_path_bytes'])} / {_gb(split['de_path_bytes'])}",
            f"{_binding(dual)} / {_binding(split)}", "holds" if goal["holds"] else "**fails**"]


def _gb(num_bytes: float) -> str:
    return num(num_bytes / 1e9, 1)


def _binding(mode: Node) -> str:
    names = {"pe_snic_read": "PE SNIC", "de_snic_read": "DE SNIC", "pe_compute": "PE compute"}
    return f"{names[mode['binding']]} {pct(mode['utilisation'][mode['binding']], 0, False)}"


TAIL_JSON = "beyond/tail_sweep.json"
TAIL_COMMAND = ("dualpath sweep docs/results/beyond/tail.yaml --out out/tail (then out/tail/sweep.json and sweep.png "
                "copied to docs/results/beyond/tail_sweep.json / .png)")


@block("tail", reads=(TAIL_JSON,), command=TAIL_COMMAND)
def tail(r: Results) -> str:
    """Each mode beside itself with `+tail`, per cluster: JCT and TTFT p50 / p99 with their ratios."""
    rows = r.json(TAIL_JSON)["rows"]
    by = {(x["model"], x["pd"], x["max_len_tokens"], x["agents"], x["mode"]): x for x in rows}
    out, jct, p50, p99 = [], [], [], []
    for key, x in by.items():
        if x["mode"].endswith("+tail"):
            continue
        t = by[(*key[:4], x["mode"] + "+tail")]
        jct.append(t["jct_s"] / x["jct_s"])
        p50.append(t["ttft_p50_s"] / x["ttft_p50_s"])
        p99.append(t["ttft_p99_s"] / x["ttft_p99_s"])
        out.append([x["model"], x["pd"], f"{key[2] // 1024}K", num(key[3]), x["mode"], sig(x["jct_s"]), sig(t["jct_s"]),
                    ratio(jct[-1]), f"{sig(x['ttft_p50_s'])} / {sig(t['ttft_p50_s'])}",
                    f"{sig(x['ttft_p99_s'])} / {sig(t['ttft_p99_s'])}", ratio(p99[-1])])
    text = (f"{len(out)} clusters and modes, each beside itself with `+tail`, offline: JCT with `+tail` over JCT "
            f"without from {ratio(min(jct))} to {ratio(max(jct))}; TTFT p99 from {ratio(min(p99))} to {ratio(max(p99))}; "
            f"TTFT p50 from {ratio(min(p50))} to {ratio(max(p50))}.")
    header = ["model", "P/D", "MaxLen", "agents", "mode", "JCT s", "JCT s +tail", "JCT ratio", "TTFT p50 s (+tail)",
              "TTFT p99 s (+tail)", "TTFT p99 ratio"]
    return text + "\n\n" + table(header, out)
