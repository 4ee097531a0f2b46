"""The one printer of run results (`dualpath sim`, `run`, `demo`, `bench cold`): a row per mode.

Both worlds write the same per-mode record (metrics.summary): JCT, TTFT, TPOT, bytes per read path,
turns. Each world adds the columns only it has (`SIM_COLUMNS`, `RUNTIME_COLUMNS`)."""

from __future__ import annotations

from typing import Callable, Sequence

from rich.table import Table

from .io import out

Column = tuple[str, Callable[[dict], str]]  # (header, cell of one run)


def _ratio(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None or x != x else fmt.format(x)


def _hit_percent(run: dict) -> str:
    """Share of the replayed prompt tokens that hit the store (a cold window shows 0)."""
    prompt = run.get("prompt_tokens") or 0
    return f"{100 * run.get('cached_tokens', 0) / prompt:.1f}" if prompt else "-"


def _snic_util(role: str) -> Callable[[dict], str]:
    """The mean SNIC utilisation of a role's engines (each its own node); runs without roles: the
    first engine is the PE, the second the DE (1P1D)."""
    def cell(run: dict) -> str:
        snic = run.get("snic", {})
        roles = run.get("engine_roles") or {e: r for e, r in zip(snic, ("prefill", "decode"))}
        util = [v.get("utilisation") for e, v in snic.items() if roles.get(e) == role]
        return _ratio(sum(util) / len(util)) if util and None not in util else "-"
    return cell


SIM_COLUMNS: Sequence[Column] = (
    ("SNIC max/avg", lambda r: _ratio(r["snic_max_over_avg"])),
    ("PE busy", lambda r: f"{r['gpu_busy']['prefill_mean']:.2f}"),
    ("wall s", lambda r: f"{r['wall_s']:.1f}"),
)
RUNTIME_COLUMNS: Sequence[Column] = (
    ("hit %", _hit_percent),
    ("SNIC util PE", _snic_util("prefill")),
    ("SNIC util DE", _snic_util("decode")),
)


def print_runs(result: dict, title: str, bytes_scale: float, bytes_unit: str, extra: Sequence[Column] = ()) -> None:
    """One table row per run in `result["runs"]`; bytes in `bytes_unit` (`bytes_scale` bytes each)."""
    def read_bytes(key: str) -> Callable[[dict], str]:
        return lambda r: "-" if r["bytes"][key] is None else f"{r['bytes'][key] / bytes_scale:.1f}"

    columns: list[Column] = [
        ("mode", lambda r: str(r["mode"])),
        ("JCT s", lambda r: f"{r['jct_s']:.1f}"),
        ("TTFT p50 s", lambda r: f"{r['ttft_s']['p50']:.2f}"),
        ("TTFT p90 s", lambda r: f"{r['ttft_s']['p90']:.2f}"),
        ("TPOT ms", lambda r: f"{r['tpot_s']['mean'] * 1e3:.1f}"),
        (f"PE-path {bytes_unit}", read_bytes("storage_to_prefill")),
        (f"DE-path {bytes_unit}", read_bytes("storage_via_decode")),
        *extra,
        ("turns", lambda r: str(r["num_turns"])),
    ]
    table = Table(title=title)
    for header, _ in columns:
        table.add_column(header, justify="right")
    for run in result["runs"]:
        table.add_row(*(cell(run) for _, cell in columns))
    out.print(table)
