"""CPU taken by the testbed's saturating KV flows (the cores `bench tp-lanes`'s ranks share), as root:
`python tools/bulk_cpu.py [GSO_BYTES] [copy|zero-copy]`. A 1P1D testbed at 33 MB/s; idle, one bulk flow, two (both
directions of the DE's CNIC, as bench tp-lanes runs them); /proc/stat and the flows' own processes
over 8 s, in cores."""
import os, time, sys
from dualpath.testbed.plan import plan_testbed
from dualpath.testbed import netns
from dualpath.bench.tp_lanes import de_class_bytes, start_bulk, stop
def stat():
    f = open("/proc/stat").readline().split()[1:]
    return list(map(int, f))
def ptimes(pid):
    f = open(f"/proc/{pid}/stat").read().split(")")[1].split()
    return int(f[11]) + int(f[12])
gso = int(sys.argv[1]) if len(sys.argv) > 1 else 0
zc = (sys.argv[2] if len(sys.argv) > 2 else "zero-copy") == "zero-copy"
plan = plan_testbed("cpu1", 1, 1, 33e6, 33e6, run_index=243)
netns.up(plan)
try:
    if gso:
        from dualpath.testbed.tp_hosts import gso_commands
        for c in gso_commands(plan, gso): netns.run_command(c)
    pe, de = plan.hosts
    for label, n in (("idle", 0), ("one flow", 1), ("two flows", 2)):
        procs = []
        if n >= 1: procs += start_bulk(pe, de, plan.cnic_addr_of[de], 7421, zc)
        if n >= 2: procs += start_bulk(de, pe, plan.cnic_addr_of[pe], 7422, zc)
        time.sleep(1.0)
        a = stat(); pa = [ptimes(p.pid) for p in procs]; t0 = time.time(); ka = de_class_bytes(plan, de)
        time.sleep(8)
        b = stat(); pb = [ptimes(p.pid) for p in procs]; dt = time.time() - t0; kb = de_class_bytes(plan, de)
        d = [y - x for x, y in zip(a, b)]
        hz = os.sysconf("SC_CLK_TCK")
        names = ["user","nice","system","idle","iowait","irq","softirq","steal"]
        busy = {k: d[i] / hz / dt for i, k in enumerate(names) if k != "idle"}
        print(label, {k: round(v, 3) for k, v in busy.items()}, "procs cores:", [round((y - x) / hz / dt, 3) for x, y in zip(pa, pb)],
              "DE CNIC MB/s out/in:", [round(sum(kb[s][k] - ka[s][k] for k in kb[s]) / dt / 1e6, 1) for s in ("out", "in")])
        stop(procs)
finally:
    netns.down("cpu1")
