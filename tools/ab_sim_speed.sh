#!/bin/bash
# Simulator speed of two revisions side by side, in one run on one machine (issue 14's check):
#
#   tools/ab_sim_speed.sh OLD_REV [ROUNDS] [AGENTS]      e.g. tools/ab_sim_speed.sh 5a08861 4 1024,2048
#
# Exports OLD_REV and the working tree's HEAD into a temporary folder, builds a compiled copy of
# each (tools/compile_sim.py of that revision), then runs one simulation per build and agent count
# ROUNDS times in alternation (old compiled, new compiled, old pure, new pure), all timed by this
# tree's tools/sim_speed_driver.py (wall and CPU time inside Simulator.run), and prints every time
# and the best and median ratios new / old. The two builds must give the same JCT (checked).
# Nothing else should load the machine while it runs.
set -euo pipefail
OLD=${1:?usage: tools/ab_sim_speed.sh OLD_REV [ROUNDS] [AGENTS]}
ROUNDS=${2:-4}
AGENTS=${3:-1024,2048}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
WORK=$(mktemp -d -t dualpath-ab-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
for side in old new; do
  rev=$([ $side = old ] && echo "$OLD" || echo HEAD)
  mkdir -p "$WORK/$side"
  git -C "$REPO" archive "$rev" src tools | tar -x -C "$WORK/$side"
  cp -r "$WORK/$side/src" "$WORK/${side}_c"
  "$PY" "$WORK/$side/tools/compile_sim.py" --src "$WORK/${side}_c" > "$WORK/${side}_c.log" 2>&1
done
for round in $(seq 1 "$ROUNDS"); do
  for t in old_c new_c old new; do
    src=$([ -d "$WORK/$t/src" ] && echo "$WORK/$t/src" || echo "$WORK/$t")
    for n in ${AGENTS//,/ }; do
      PYTHONPATH=$src "$PY" "$REPO/tools/sim_speed_driver.py" "$n" >> "$WORK/r_${t}.jsonl"
    done
  done
done
"$PY" - "$WORK" <<'EOF'
import glob, json, statistics, sys
work = sys.argv[1]
runs, jct = {}, {}
for f in sorted(glob.glob(f"{work}/r_*.jsonl")):
    build = f.rsplit("/", 1)[1][2:-len(".jsonl")]
    for line in open(f):
        row = json.loads(line)
        runs.setdefault((build, row["agents"]), []).append(row)
        jct.setdefault(row["agents"], set()).add(row["jct_s"])
assert all(len(v) == 1 for v in jct.values()), f"builds disagree on JCT: {jct}"
print("| build | agents | time | old s | new s | best new / best old | median new / median old |")
print("|---|---|---|---|---|---|---|")
for kind, old, new in (("compiled", "old_c", "new_c"), ("pure", "old", "new")):
    for n in sorted({a for _, a in runs}):
        for key in ("wall_s", "cpu_s"):
            o = [r[key] for r in runs[(old, n)]]
            w = [r[key] for r in runs[(new, n)]]
            print(f"| {kind} | {n} | {key[:-2]} | {' '.join(f'{x:.2f}' for x in o)} | {' '.join(f'{x:.2f}' for x in w)} "
                  f"| {min(w) / min(o):.3f} | {statistics.median(w) / statistics.median(o):.3f} |")
EOF
