"""Bring a testbed up and down with `ip` and `tc` (needs root: CAP_NET_ADMIN), and read what the
kernel counted on its links.

`up` records the run in a state file (`state_dir()/<id>.json`) before it creates anything, and a
failed `up` runs `down` before it reports the failure. `down` deletes every namespace whose name
starts with the run's prefix (also those of an `up` killed before it wrote its state), which
removes every veth end and qdisc inside them. Nothing is
created in the root namespace.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

from ...core.lanes import Lane
from ...errors import InputError
from .plan import CLASS_MINOR, PREFIX, TestbedPlan, down_commands, up_commands

STATE_DIR_DEFAULT = "/run/dualpath/testbed"  # tmpfs: cleared at boot, as the namespaces are
COMMAND_TIMEOUT_S = 10.0  # one `ip` / `tc` call; they return in milliseconds


def state_dir() -> Path:
    return Path(os.environ.get("DUALPATH_TESTBED_DIR", STATE_DIR_DEFAULT))


def check_can_run() -> None:
    """Root and the two tools, or one clear error."""
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise InputError(f"testbed: {' and '.join(missing)} not found (install iproute2)")
    if os.geteuid() != 0:
        raise InputError("testbed: needs root (network namespaces and tc need CAP_NET_ADMIN)")


def run_command(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if check and p.returncode != 0:
        raise InputError(f"testbed: `{' '.join(cmd)}` failed: {p.stderr.strip() or p.stdout.strip()}")
    return p


def namespaces_with_prefix(prefix: str) -> list[str]:
    out = run_command(["ip", "netns", "list"]).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def run_prefix(run_id: str) -> str:
    return f"{PREFIX}{run_id}-"


def up(plan: TestbedPlan, commands: list[list[str]] | None = None) -> Path:
    """Create the plan's namespaces, links and classes; the state file's path. `commands`: the
    command list to run instead of `up_commands(plan)` (tests inject a failing one)."""
    check_can_run()
    taken = namespaces_with_prefix(run_prefix(plan.run_id))
    if taken:
        raise InputError(f"testbed {plan.run_id!r} is already up ({', '.join(taken)}): `dualpath testbed down --id {plan.run_id}`")
    state = state_dir() / f"{plan.run_id}.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps(plan_json(plan), indent=1))
    try:
        for cmd in up_commands(plan) if commands is None else commands:
            run_command(cmd)
    except BaseException:
        down(plan.run_id)
        raise
    return state


def down(run_id: str) -> list[str]:
    """Delete every namespace of the run and its state file; the namespaces deleted."""
    check_can_run()
    state = state_dir() / f"{run_id}.json"
    # every run's namespace carries its prefix (plan.py), so the scan finds what the state file
    # lists and what an `up` killed before writing it left behind
    present = namespaces_with_prefix(run_prefix(run_id))
    for cmd in down_commands(tuple(present)):
        run_command(cmd)
    state.unlink(missing_ok=True)
    return present


def plan_json(plan: TestbedPlan) -> dict:
    d = asdict(plan)
    d["namespaces"] = list(plan.namespaces)
    return d


def running() -> dict[str, dict]:
    """Testbeds with a state file: id -> the recorded plan (JSON)."""
    out = {}
    root = state_dir()
    for f in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            out[f.stem] = json.loads(f.read_text())
        except ValueError:
            continue
    return out


_CLASS_RE = re.compile(r"^class htb 1:(\d+) .*?\n Sent (\d+) bytes (\d+) pkt", re.M)


def class_bytes(ns: str, dev: str) -> dict[int, int]:
    """Bytes the kernel sent through each HTB class of `dev` (minor id -> bytes), from `tc -s`."""
    out = run_command(["ip", "netns", "exec", ns, "tc", "-s", "class", "show", "dev", dev]).stdout
    return {int(m.group(1)): int(m.group(2)) for m in _CLASS_RE.finditer(out)}


def interface_bytes(ns: str, dev: str) -> tuple[int, int]:
    """(tx bytes, rx bytes) of `dev` as the kernel counts them (headers included)."""
    tx, rx, _ = interface_stats(ns, dev)
    return tx, rx


def interface_stats(ns: str, dev: str) -> tuple[int, int, int]:
    """(tx bytes, rx bytes, tx packets) of `dev`; a packet is what the stack handed the device,
    a whole GSO burst as one (one set of headers counted for it)."""
    info = json.loads(run_command(["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev]).stdout)[0]
    stats = info.get("stats64") or info["stats"]
    return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"]), int(stats["tx"]["packets"])


def tcp_counters(ns: str) -> dict[str, int]:
    """The namespace's TCP segments sent and retransmitted so far (/proc/net/snmp, read inside it)."""
    out = run_command(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]).stdout
    names, values = [line.split()[1:] for line in out.splitlines() if line.startswith("Tcp:")][:2]
    tcp = dict(zip(names, map(int, values)))
    return {"out_segs": tcp["OutSegs"], "retrans_segs": tcp["RetransSegs"]}


def link_counters(plan_or_json) -> list[dict]:
    """Per link end: the lanes' bytes by class and the interface's tx / rx bytes and tx packets."""
    links = plan_or_json["links"] if isinstance(plan_or_json, dict) else [asdict(x) for x in plan_or_json.links]
    rows = []
    for link in links:
        for end in ("a", "b"):
            ns, dev = link[f"{end}_ns"], link[f"{end}_if"]
            by_class = class_bytes(ns, dev)
            tx, rx, tx_packets = interface_stats(ns, dev)
            rows.append({"link": link["name"], "host": link["host"], "ns": ns, "dev": dev, "tx_bytes": tx, "rx_bytes": rx,
                         "tx_packets": tx_packets,
                         "lc_class_bytes": by_class.get(CLASS_MINOR[Lane.LATENCY_CRITICAL], 0),
                         "kv_class_bytes": by_class.get(CLASS_MINOR[Lane.KV], 0)})
    return rows

