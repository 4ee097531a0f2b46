"""`dualpath bench tp-lanes --testbed`: TPOT of a tp=2 decode engine beside saturating KV traffic,
with the two lane classes and with one FIFO class (deploy/testbed/tp_lanes_bench.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import InputError
from .io import console, out

MB = 1e6


def bench_tp_lanes(
    testbed: Annotated[bool, typer.Option("--testbed", help="across emulated hosts (root): the only place it runs")] = False,
    model: Annotated[str, typer.Option(help="smollm2-135m or tiny")] = "smollm2-135m",
    batch: Annotated[int, typer.Option(help="decode sequences per step")] = 8,
    steps: Annotated[int, typer.Option(help="timed decode steps per measurement (over all its rounds)")] = 40,
    rounds: Annotated[int, typer.Option(help="rounds the loads are interleaved in (a busy machine's slow spells spread)")] = 2,
    cnic_mb_s: Annotated[Optional[float], typer.Option(help="CNIC (and SNIC) rate, MB/s (default: derived so the "
                                                             "collectives take 25% of a step on the wire)")] = None,
    # 64 KiB, the kernel's own: a NIC segments in hardware (TSO), the testbed in the ranks' cores, and
    # at 16 KiB that packet work alone cost 1.17x TPOT while the lanes' own effect was 1.03x at both
    # sizes (docs/results/testbed/tp_lanes_zerocopy_gso16k.json against tp_lanes_zerocopy_a.json; 16 KiB
    # was the earlier default)
    gso_kib: Annotated[int, typer.Option(help="cap GSO on every link at this many KiB (64: the kernel's default, "
                                              "no cap; 4: IB's MTU)")] = 64,
    bulk_copy: Annotated[bool, typer.Option("--bulk-copy", help="emulated KV flows that copy every byte through "
                                             "user space (CPU a NIC's DMA would not take) instead of zero-copy ones")] = False,
    bulk_mooncake: Annotated[bool, typer.Option("--bulk-mooncake", help="the KV flows moved by Mooncake Transfer "
                                                "Engine (as with --transfer mooncake; it copies through user space)")] = False,
    json_path: Annotated[Optional[Path], typer.Option("--json")] = Path("out/tp-lanes.json"),
    plot: Annotated[Optional[Path], typer.Option(help="write a PNG figure here")] = Path("out/tp-lanes.png"),
) -> None:
    """TPOT of a tp=2 decode engine on the testbed: idle vs KV-saturated CNIC, two classes vs one."""
    if not testbed:
        raise InputError("bench tp-lanes runs across emulated hosts only: add --testbed (needs root)")
    if batch <= 0 or not 10 <= steps <= 250 or not 1 <= rounds <= steps // 5 or (cnic_mb_s is not None and cnic_mb_s <= 0):
        raise InputError("--batch must be positive, --steps in 10..250, --rounds in 1..steps/5, --cnic-mb-s positive")
    if not 2 <= gso_kib <= 64:
        raise InputError("--gso-kib must be in 2..64")
    bulk = _bulk_kind(bulk_copy, bulk_mooncake)
    from ..deploy.testbed.tp_lanes_bench import plot_tp_lanes, run_tp_lanes
    from ..sim.runner import write_json
    from ..deploy.testbed.netns import check_can_run

    check_can_run()
    r = run_tp_lanes(model, batch, steps, None if cnic_mb_s is None else cnic_mb_s * MB, rounds=rounds,
                     gso_max_bytes=None if gso_kib == 64 else gso_kib * 1024,
                     bulk=bulk)
    _print(r, model, batch, cnic_mb_s, gso_kib)
    if json_path:
        write_json(r, json_path)
        console.print(f"wrote {json_path}")
    if plot:
        plot_tp_lanes(r, plot)
        console.print(f"wrote {plot}")


def _bulk_kind(bulk_copy: bool, bulk_mooncake: bool) -> str:
    """The KV flows' kind (deploy/testbed/tp_lanes_bench.py BULK_KINDS) from the flags, checked."""
    if bulk_copy and bulk_mooncake:
        raise InputError("--bulk-copy and --bulk-mooncake are two kinds of KV flow: give one")
    if bulk_mooncake:
        from ..runtime.transport.mooncake import require_mooncake

        require_mooncake()
        return "mooncake"
    return "copy" if bulk_copy else "zero_copy"


def _print(r: dict, model: str, batch: int, cnic_mb_s: Optional[float], gso_kib: int) -> None:
    how = "given" if cnic_mb_s is not None else (
        f"derived: {r['wire_bytes_per_step'] / 1e3:.1f} kB of collectives per {r['calibration_step_s'] * 1e3:.1f} ms step "
        f"at {r['collective_share']:.0%} of it")
    gso = "64 KiB (kernel)" if gso_kib == 64 else f"{gso_kib} KiB"
    out.print(f"tp=2 {model}, batch {batch}: CNIC {r['cnic_bytes_per_s'] / MB:.1f} MB/s ({how}), GSO {gso}; "
              f"KV flows: {r['bulk'].replace('_', '-')}; same tokens as one process: {r['same_tokens']}")
    for name, s in r["runs"].items():
        k = s["kernel"]["out"]
        out.print(f"  {name:24s} TPOT mean {s['tpot_mean_s'] * 1e3:7.2f} ms  p99 {s['tpot_p99_s'] * 1e3:7.2f} ms  "
                  f"TTFT mean {s['ttft_mean_s'] * 1e3:7.1f} ms  (DE CNIC out: 1:10 {k['lc_class_bytes'] / MB:.2f} MB, 1:20 {k['kv_class_bytes'] / MB:.2f} MB)")
    for classes, x in r["tpot_saturated_over_idle"].items():
        y = r["tpot_saturated_over_kv_elsewhere"][classes]
        out.print(f"  TPOT saturated / idle, {classes.replace('_', ' ')}: x{x:.2f}  (/ KV elsewhere: x{y:.2f});  "
                  f"TTFT saturated / idle: x{r['ttft_saturated_over_idle'][classes]:.2f}")
    for classes in ("two_classes", "one_class"):
        for what, x in r["paired_by_round"][classes].items():
            out.print(f"  paired by round, {classes.replace('_', ' ')}, TPOT {what.replace('_', ' ')}: median x{x['median']:.3f} "
                      f"(95% interval {x['ci95'][0]:.3f}-{x['ci95'][1]:.3f}; rounds {', '.join(f'{v:.2f}' for v in x['per_round'])})")
