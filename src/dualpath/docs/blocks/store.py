"""Store and transport: KV store reads against a plain read, the storage service against the local
store, KV between engine processes through shared memory, and remote writes over TCP."""

from __future__ import annotations

from ...deploy.testbed.demo import cnic_framing_bytes
from ..fmt import num, ratio, table
from ..registry import block
from ..results import Results


@block("store_local", reads=("runtime/store.json",), command="dualpath bench store --json docs/results/runtime/store.json")
def store_local(r: Results) -> str:
    d = r.json("runtime/store.json")
    rows = [["store reads", f"{d['store_read_gbps']:.2f}"],
            ["a direct sequential read of a same-size file", f"{d['direct_read_gbps']:.2f}"],
            ["**store / direct**", f"**{ratio(d['ratio'])}** (target >= {d['target_ratio']:g})"],
            [f"{d['checksum']} verification, one thread", f"{d['checksum_gbps']:.1f}"]]
    return (f"{d['num_blocks']} Full Blocks of {num(d['full_block_bytes'] / 1e6, 1)} MB "
            f"({num(d['payload_bytes'] / 1e9, 2)} GB), "
            f"{d['num_threads']} reader threads, page cache bypassed ({d['cache_bypass']}) on both sides.\n\n"
            + table(["", "GB/s"], rows))


@block("store_service", reads=("store/service_vs_local.json",),
       command="dualpath bench store --service --total-mib 512 --json docs/results/store/service_vs_local.json")
def store_service(r: Results) -> str:
    d = r.json("store/service_vs_local.json")
    labels = {"cold": "cold (page cache dropped: from the disk)", "warm": "warm (from the page cache)"}
    rows = [[label, f"{d[state]['local_read_gbps']:.2f}", f"{d[state]['service_read_gbps']:.2f}",
             f"**{ratio(d[state]['ratio'])}**"]
            for state, label in labels.items()]
    return (f"{d['num_blocks']} blocks of {num(d['full_block_bytes'] / 1e6, 1)} MB, {d['num_threads']} threads, "
            f"{d['rounds']} alternating rounds per cache state, service and local store on the same disk; target "
            f"service / local >= {d['target_ratio']:g} from the disk; checksum failures {d['service_checksum_failures']}.\n\n"
            + table(["cache state", "local GB/s", "service GB/s", "service / local"], rows))


TRANSPORT_COMMAND = ("dualpath bench transport --json docs/results/transport/transport.json "
                     "--plot docs/results/transport/transport.png")
TRANSPORT_LABELS = {"memcpy": "in-process memcpy (the reference)", "shm": "shared memory, engine -> engine process",
                    "tcp": "our remote writes, loopback TCP", "mooncake": "Mooncake Transfer Engine, loopback TCP"}


@block("transport", reads=("transport/transport.json",), command=TRANSPORT_COMMAND)
def transport(r: Results) -> str:
    return transport_table(r.json("transport/transport.json"))


def transport_table(d) -> str:
    """Per transfer and block size: GB/s (median and spread of the rounds), ratio to memcpy, latency."""
    sizes = sorted(d["sizes"], key=lambda s: d["sizes"][s])
    rows = [[TRANSPORT_LABELS.get(t, t), f"{s} ({num(d['sizes'][s] / 1024)} KiB)", f"{d['rows'][t][s]['gbps_median']:.2f}",
             f"{d['rows'][t][s]['gbps_min']:.2f}-{d['rows'][t][s]['gbps_max']:.2f}",
             f"**{ratio(d['rows'][t][s]['ratio_to_memcpy'])}**", num(d["rows"][t][s]["latency_p50_us"]),
             num(d["rows"][t][s]["latency_p90_us"]), "yes" if d["rows"][t][s]["intact"] else "NO"]
            for t in d["transfers"] for s in sizes]
    skipped = "".join(f" {t} skipped: {why}." for t, why in d["skipped"].items())
    notes = "".join(f"\n\n{line}" for line in d["notes"] if ": skipped: " not in line)
    return (f"{d['model']} KV blocks: a layer's slice of a block and a whole block ({d['block_tokens']} tokens, "
            f"{d['kv_dtype']}); {num(d['total_bytes'] / 2**20, 1)} MiB per transfer per size per round, {d['rounds']} "
            f"alternating rounds, {num(d['chunk_bytes'] / 1024)} KiB link chunks, {d['cpus']} CPUs; ratios to memcpy "
            f"measured in the same round.{skipped}\n\n"
            + table(["transfer", "block", "GB/s", "min-max", "vs memcpy", "latency p50 us", "p90 us", "intact"], rows)
            + notes)


@block("remote_write", reads=("transport/remote_write.json",),
       command="dualpath bench remote-write --json docs/results/transport/remote_write.json")
def remote_write(r: Results) -> str:
    d = r.json("transport/remote_write.json")
    labels = {"memcpy": "memcpy into shared memory", "memcpy + arbiter": "memcpy through a LinkArbiter",
              "remote": "remote write, loopback TCP", "remote + arbiter": "remote write through a LinkArbiter"}
    base = d["rows"]["memcpy"]["gb_per_s"]
    rows = [[labels.get(name, name), f"{row['seconds']:.3f}", f"{row['gb_per_s']:.2f}", ratio(row["gb_per_s"] / base)]
            for name, row in d["rows"].items()]
    return (f"{num(d['total_bytes'] / 2**30)} GiB in {num(d['chunk_bytes'] / 2**20)} MiB chunks, best of {d['repeat']}, "
            f"{d['cpus']} CPUs; the target in a child process.\n\n" + table(["way", "s", "GB/s", "vs memcpy"], rows))


DEMO_TRANSFERS = {"remote-write": "transport/demo_remote_write.json", "mooncake": "transport/demo_mooncake.json"}


@block("demo_transfers", reads=tuple(DEMO_TRANSFERS.values()),
       command="dualpath demo --rounds 15 --snic-mb-s 24 [--transfer mooncake] --json docs/results/transport/demo_T.json "
               "(T: remote_write, mooncake; one after the other)")
def demo_transfers(r: Results) -> str:
    """The demo's workload and rates fixed, once per transfer: JCT per mode, the ratio, the tokens."""
    runs = {t: {m["mode"]: m for m in r.json(path)["runs"]} for t, path in DEMO_TRANSFERS.items()}
    tokens = {m["tokens_sha256"] for by_mode in runs.values() for m in by_mode.values()}
    rows = [[t, r.json(DEMO_TRANSFERS[t])["config"]["transport"]["kind"], num(by["basic"]["jct_s"], 1),
             num(by["dualpath"]["jct_s"], 1), f"**{ratio(by['dualpath']['jct_s'] / by['basic']['jct_s'])}**",
             by["basic"]["tokens_sha256"][:16]] for t, by in runs.items()]
    ratios = [by["dualpath"]["jct_s"] / by["basic"]["jct_s"] for by in runs.values()]
    return (table(["transfer", "engines talk over", "JCT basic s", "JCT dualpath s", "dualpath / basic", "tokens_sha256"], rows)
            + f"\n\nOne tokens_sha256 across both transfers and both modes: {'yes' if len(tokens) == 1 else '**NO**'}; "
            f"the ratios differ by {max(ratios) - min(ratios):.2f} (goal: within 0.05).")


def _by_transfer(stem: str) -> dict[str, str]:
    """A testbed run's JSON per transfer: testbed/STEM_remote_write.json and testbed/STEM_mooncake.json."""
    return {t: f"testbed/{stem}_{t.replace('-', '_')}.json" for t in ("remote-write", "mooncake")}


TESTBED_TRANSFERS = _by_transfer("demo_transfer")


def _cnic_packets(rows: list) -> tuple[str, str]:
    """Over the CNIC rows that carried KV: bytes per packet sent, and the framing left once one
    header per packet is taken off, as a share of the stated bytes (ranges)."""
    cnic = [x for x in rows if x["what"].startswith("CNIC") and x["runtime_bytes"] > 0 and x.get("kernel_packets")]
    per = [x["kernel_bytes"] / x["kernel_packets"] for x in cnic]
    framing = [cnic_framing_bytes(x) / x["stated_bytes"] for x in cnic]
    if not cnic:
        return "-", "-"
    return f"{num(min(per))}-{num(max(per))}", f"{100 * min(framing):.1f}-{100 * max(framing):.1f}%"


def _kernel_over_stated(rows: list, prefix: str) -> str:
    """The range of the kernel's bytes over the runtime's stated bytes on the links whose rows start
    with `prefix`, where the runtime sent something."""
    xs = [x["kernel_over_stated"] for x in rows if x["what"].startswith(prefix) and x["runtime_bytes"] > 0]
    return f"{min(xs):.3f}-{max(xs):.3f}" if xs else "-"


@block("testbed_transfers", reads=tuple(TESTBED_TRANSFERS.values()),
       command="dualpath demo --testbed --snic-mb-s 4.8 --rounds 6 [--transfer mooncake] --json "
               "docs/results/testbed/demo_transfer_T.json (T: remote_write, mooncake; one after the other)")
def testbed_transfers(r: Results) -> str:
    """The testbed demo, rates and rounds fixed, once per transfer."""
    return _testbed_transfers(r, TESTBED_TRANSFERS)


def _trace_block(name: str, stem: str, flags: str) -> None:
    """Register block `name`: the Mooncake trace's first requests replayed on the testbed once per
    transfer (`run ... --testbed` with `flags`), from testbed/STEM_T.json."""
    paths = _by_transfer(stem)
    block(name, reads=tuple(paths.values()),
          command=f"dualpath run src/dualpath/workloads/data/mooncake_conversation_slice.jsonl --testbed --snic-mb-s 4.8 "
                  f"{flags}--mode basic --mode dualpath [--transfer mooncake] --json docs/results/testbed/{stem}_T.json "
                  "(T: remote_write, mooncake; one after the other)")(lambda r: _testbed_transfers(r, paths))


_trace_block("testbed_trace_transfers", "run_transfer", "")  # at the trace's own timing
_trace_block("testbed_trace_transfers_spread", "run_transfer_ts2", "--time-scale 2 ")  # arrivals twice as far apart


TESTBED_RAY_TRANSFERS = _by_transfer("demo_ray_transfer")


@block("testbed_ray_transfers", reads=tuple(TESTBED_RAY_TRANSFERS.values()),
       command="dualpath demo --testbed --ray --snic-mb-s 4.8 --rounds 6 [--transfer mooncake] --json "
               "docs/results/testbed/demo_ray_transfer_T.json (T: mooncake, remote_write; one after the other)")
def testbed_ray_transfers(r: Results) -> str:
    """The testbed demo with the engines as Ray actors, once per transfer, and each run's restart check."""
    rows = []
    for t, path in TESTBED_RAY_TRANSFERS.items():
        x = r.json(path)["ray"]["restart"]
        rows.append([t, f"{x['before']['pid']} / {x['after']['pid']}",
                     f"{'yes' if x['in_flight_same'] else '**NO**'}, {x['in_flight_s']:.1f} s",
                     f"{'yes' if x['next_same'] else '**NO**'}, {x['next_done_s']:.1f} s"])
    return (_testbed_transfers(r, TESTBED_RAY_TRANSFERS) + "\n\nThe restart check after each run (kill -9 of the "
            "decode actor's process mid-request, then the next request):\n\n"
            + table(["transfer", "decode actor pid before / after", "in-flight request: same tokens, done after",
                     "next request: same tokens, done after"], rows))


def _testbed_transfers(r: Results, paths: dict[str, str]) -> str:
    """Per transfer: JCTs, the tokens against the single-host run, and the kernel's link counters
    over the runtime's ledger (bytes, and packets on the CNIC)."""
    rows, ratios, same, back = [], [], True, []
    for t, path in paths.items():
        d = r.json(path)
        de = d["config"]["testbed"]["hosts"][1]
        back += [f"{num(x['kernel_bytes'] / 1e6, 2)} MB with {t}" for x in d["ledger_vs_kernel"]
                 if x["mode"] == "basic" and x["host"] == de and x["what"].startswith("CNIC")]
        by = {m["mode"]: m for m in d["runs"]}
        ratios.append(by["dualpath"]["jct_s"] / by["basic"]["jct_s"])
        same = same and all(m["tokens_sha256"] == d["reference_tokens_sha256"] for m in d["runs"])
        rows.append([t, num(by["basic"]["jct_s"], 1), num(by["dualpath"]["jct_s"], 1), f"**{ratio(ratios[-1])}**",
                     f"{num(by['basic']['cached_tokens'])} / {num(by['dualpath']['cached_tokens'])}",
                     _kernel_over_stated(d["ledger_vs_kernel"], "SNIC"), _kernel_over_stated(d["ledger_vs_kernel"], "CNIC"),
                     *_cnic_packets(d["ledger_vs_kernel"])])
    return (table(["transfer", "JCT basic s", "JCT dualpath s", "dualpath / basic", "cached tokens basic / dualpath", "SNIC kernel / stated",
                   "CNIC out kernel / stated", "CNIC out bytes per packet", "CNIC framing less packet headers"], rows)
            + f"\n\nBoth modes' tokens equal the single-host run's with both transfers: {'yes' if same else '**NO**'}; "
            f"the ratios differ by {max(ratios) - min(ratios):.2f} (goal: within 0.05). In `basic` the decode node "
            f"sends no KV; the kernel counted out of its CNIC port {' and '.join(back)}.")
