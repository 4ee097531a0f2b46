"""Faults and integrity: the chaos matrix (one host and across hosts), corruptions and torn writes,
the checksum candidates, overload at 3x capacity, the soak at 70%, and cache salts timed."""

from __future__ import annotations

from ..fmt import num, ratio, span, table
from ..registry import block
from ..results import Node, Results

VICTIMS = {"pe": "PE", "de": "DE", "store": "storage service"}


def _groups(results: Node) -> dict[tuple[str, str], list[Node]]:
    """Scenarios `VICTIM-SIGNAL-MOMENT` grouped by (victim, signal), in the matrix's order."""
    groups: dict[tuple[str, str], list[Node]] = {}
    for s in results:
        victim, signal, _ = str(s["scenario"]).split("-", 2)
        groups.setdefault((victim, signal), []).append(s)
    return groups


def _matrix(d: Node) -> str:
    rows = []
    for (victim, signal), scenarios in _groups(d["results"]).items():
        faults = [s["store_faults"] for s in scenarios]
        rows.append([VICTIMS.get(victim, victim), signal, ", ".join(str(s["scenario"]).split("-", 2)[2] for s in scenarios),
                     sum(s["requests"] for s in scenarios), sum(s["finished"] for s in scenarios),
                     sum(s["errored"] for s in scenarios), sum(s["lost"] for s in scenarios),
                     sum(s["wrong_tokens"] for s in scenarios), span([s["recovery_s"] for s in scenarios]),
                     sum(f["persist_failures"] for f in faults),
                     sum(f["router_skipped_calls"] + f["engine_skipped_calls"] for f in faults)])
    all_ = list(d["results"])
    c = d["config"]
    head = (f"{sum(bool(s['fired']) for s in all_)} of {len(all_)} scenarios fired; block writes left pending after "
            f"them: {sum(s['writes_pending'] for s in all_)}. Model `{c['model']}`, {c['pd']}, policy `{c['policy']}`, "
            f"{c['num_requests']} requests x 2 turns of {c['gen_tokens']} tokens; heartbeat timeout "
            f"{c['heartbeat_timeout_s']:g} s, store timeout {c['store_timeout_s']:g} s, a request counted lost after "
            f"{c['terminal_bound_s']:g} s.")
    return head + "\n\n" + table(["victim", "signal", "moments", "requests", "finished", "errored", "lost", "wrong tokens",
                                  "recovery s", "persists failed", "store calls skipped"], rows)


@block("chaos", reads=("chaos/chaos.json",), command="dualpath chaos --scenario all --json docs/results/chaos/chaos.json")
def chaos(r: Results) -> str:
    return _matrix(r.json("chaos/chaos.json"))


@block("chaos_mooncake", reads=("chaos/matrix_mooncake.json",),
       command="dualpath chaos --scenario all --transfer mooncake --json docs/results/chaos/matrix_mooncake.json")
def chaos_mooncake(r: Results) -> str:
    d = r.json("chaos/matrix_mooncake.json")
    t = d["config"]["transport"]
    return f"KV between the engines through `{t['transfer']}`, the engines talking over `{t['kind']}`. " + _matrix(d)


@block("chaos_testbed", reads=("chaos/chaos_testbed.json",),
       command="dualpath chaos --testbed --scenario all --json docs/results/chaos/chaos_testbed.json")
def chaos_testbed(r: Results) -> str:
    return _testbed(r.json("chaos/chaos_testbed.json"))


@block("chaos_testbed_mooncake", reads=("chaos/chaos_testbed_mooncake.json",),
       command="dualpath chaos --testbed --scenario all --transfer mooncake --json docs/results/chaos/chaos_testbed_mooncake.json")
def chaos_testbed_mooncake(r: Results) -> str:
    d = r.json("chaos/chaos_testbed_mooncake.json")
    return f"KV between the hosts through `{d['config']['transport']['transfer']}`. " + _testbed(d)


def _testbed(d: Node) -> str:
    tb = d["config"]["testbed"]
    return (f"Every engine and the storage service on an emulated host of its own: SNIC links "
            f"{num(tb['snic_bytes_per_s'] / 1e6)} MB/s, CNIC ports {num(tb['cnic_bytes_per_s'] / 1e6)} MB/s, capped by `tc`; "
            f"the fault-free reference equals a single host's tokens: {'yes' if d['reference_equals_single_host'] else 'NO'}. "
            + _matrix(d))


INTEGRITY_COLUMNS = {"requests": "requests", "wrong_outputs": "wrong outputs", "flips_in_flight": "flips in flight",
                     "flips_on_disk": "flips on disk", "layer_checksum_failures": "layer failures",
                     "pd_checksum_failures": "PD failures", "layer_retransmits": "retransmits",
                     "kv_recomputes": "recomputes", "quarantined_blocks": "quarantined"}


@block("integrity", reads=("integrity/integrity.json",),
       command="dualpath chaos --corruptions 1000 --torn-writes 100 --json docs/results/integrity/integrity.json")
def integrity(r: Results) -> str:
    d = r.json("integrity/integrity.json")
    cor, torn = d["corruptions"], d["torn_writes"]
    rows = [[x["side"], *(x[k] for k in INTEGRITY_COLUMNS)] for x in cor["rounds"]]
    rows.append(["**total**", *(cor["total"][k] for k in INTEGRITY_COLUMNS)])
    c, stall = cor["config"], torn["stall_points"]
    return (f"Corruptions: {c['conversations']} conversations x {c['turns']} turns per round, model `{c['model']}`, "
            f"{c['pd']}, flip probability {c['probability_per_piece']:g} per block piece; "
            f"**{num(cor['total']['injected'])} corruptions injected, {cor['total']['wrong_outputs']} wrong outputs**.\n\n"
            + table(["read side", *INTEGRITY_COLUMNS.values()], rows)
            + f"\n\nTorn writes: {torn['kills']} writers killed mid-put ({torn['killed_by_sigkill']} by SIGKILL; "
            f"{stall['in_header']} in a header, {stall['in_payload']} in a payload, {stall['all_written_not_renamed']} "
            f"written but not renamed): **{torn['torn_visible_after_each_restart']} torn blocks visible** after each "
            f"reopen, {torn['torn_visible_at_final_restart']} at a final one over {torn['whole_blocks_checked']} whole blocks.")


@block("checksum", reads=("checksum/checksum.json",), command="dualpath bench checksum --json docs/results/checksum/checksum.json")
def checksum(r: Results) -> str:
    d = r.json("checksum/checksum.json")
    sizes = d["sizes_bytes"]
    rows = [[f"`{fn}`", *(f"{by_size[k]:.1f}" for k in sizes)] for fn, by_size in d["gbps"].items()]
    header = ["GB/s, one thread", *(f"{k.replace('_', ' ')} ({num(sizes[k] / 1024)} KiB)" for k in sizes)]
    return table(header, rows) + f"\n\nFastest at every size: `{d['winner']}`."


def _overload_rows(name: str, d: Node) -> list[list[object]]:
    rows = []
    for phase, label in (("capacity", f"capacity (closed loop, {d['max_inflight_requests']} clients)"),
                         ("overload", f"3x capacity (open loop, {d['overload_rate_per_s']:.1f} req/s)")):
        p = d[phase]
        p99 = "-" if p["refusal_p99_s"] is None else f"{p['refusal_p99_s'] * 1e3:.1f} ms"
        rows.append([name, label, p["requests"], p["finished"], p["refused_429"], p["lost"], f"{p['throughput_per_s']:.1f}",
                     f"{p['ttft_p50_s']:.2f} / {p['ttft_p90_s']:.2f}", p99])
    rows[-1][0] = f"{name}: TTFT p90 {ratio(d['ttft_p90_over_capacity'])}x capacity's"
    return rows


@block("overload", reads=("overload/overload.json", "overload/overload_tiny.json"),
       command=("dualpath bench overload --json docs/results/overload/overload.json",
                "dualpath bench overload --model tiny --inflight 8 --json docs/results/overload/overload_tiny.json"))
def overload(r: Results) -> str:
    rows = []
    for rel in ("overload/overload.json", "overload/overload_tiny.json"):
        d = r.json(rel)
        rows += _overload_rows(f"`{d['model']}`, {d['max_inflight_requests']} in flight", d)
    return table(["server", "phase", "requests", "finished", "429", "lost", "finished/s", "TTFT p50 / p90 s", "429 p99"], rows)


def _statuses(s: Node) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(s.items()))


@block("soak", reads=("soak/soak_30min.json",),
       command=("dualpath bench soak --minutes 30 --json docs/results/soak/soak_30min.json "
                "--plot docs/results/soak/soak_30min.png",))
def soak(r: Results) -> str:
    d = r.json("soak/soak_30min.json")
    c = d["checks"]
    every = max(1, round(300 / d["sample_s"]))  # a row per five minutes
    rows = [[f"{s['t_s'] / 60:.0f}", s["requests"], _statuses(s["statuses"]),
             f"{s['ttft_p50_s']:.2f} / {s['ttft_p90_s']:.2f}", f"{s['tpot_p50_s'] * 1e3:.0f}",
             f"{s['rss_bytes'] / 2**20:.0f} ({s['private_bytes'] / 2**20:.0f})", s["open_fds"]]
            for i, s in enumerate(d["samples"]) if i and (i % every == 0 or i == len(d["samples"]) - 1)]
    head = (f"`{d['model']}` on {d['cpus']} CPUs: capacity {d['capacity_per_s']:.2f} finished/s, soaked at "
            f"{d['rate_per_s']:.2f} req/s ({d['load_fraction']:.0%}) for {d['minutes']:g} minutes. All requests: "
            f"{_statuses(c['by_status'])}. Responses 5xx: {c['responses_5xx']}; lost: {c['lost']}; incomplete 200s: "
            f"{c['incomplete_200']}; requests the server held after the drain: {c['server_inflight_after_drain']:g}; "
            f"hits across salts: {c['cached_across_salts']} in {c['first_turns_under_a_new_salt']} first turns under a new "
            f"salt (hits under a conversation's own salt: {c['hits_under_the_same_salt']}). RSS at the end / minute 5's: "
            f"{c['rss_end_over_baseline']:.3f} (not shared: {c['private_end_over_baseline']:.3f}); open fds "
            f"{c['open_fds_baseline']} -> {c['open_fds_end']}. Checks {'passed' if c['passed'] else 'FAILED'}.")
    return head + "\n\n" + table(["minute", "sent", "statuses", "TTFT p50 / p90 s (streamed)", "TPOT p50 ms",
                                  "RSS MiB (not shared)", "open fds"], rows)


@block("salts", reads=("salts/salts.json",),
       command=("dualpath bench salts --json docs/results/salts/salts.json --plot docs/results/salts/salts.png",))
def salts(r: Results) -> str:
    d = r.json("salts/salts.json")
    s = d["summary"]
    labels = {"cold": "cold, salt A", "other_salt": "the same prompt, salt B", "hit": "the same prompt, salt A again"}
    rows = [[labels[g], f"{s[g]['ttft_p50_s'] * 1e3:.0f}", f"{s[g]['ttft_p10_s'] * 1e3:.0f} - {s[g]['ttft_p90_s'] * 1e3:.0f}",
             ", ".join(str(c) for c in s[g]["cached_tokens"])] for g in ("cold", "other_salt", "hit")]
    return (f"`{d['model']}`, {d['prompts']} prompts of {d['prompt_tokens']} tokens, one request at a time. "
            f"Another salt / cold (medians): {s['other_salt_over_cold']:.3f}, "
            f"{'within' if s['other_salt_within_cold_spread'] else 'OUTSIDE'} the cold requests' p10-p90; "
            f"hit / cold: {s['hit_over_cold']:.3f}.\n\n"
            + table(["request", "TTFT p50 ms", "p10 - p90 ms", "cached tokens told"], rows))
