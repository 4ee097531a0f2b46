#!/bin/bash
# Simulator speed of two revisions side by side, in one run on one machine (so a
# change to the hot path shows its cost; docs/results/sim_speed.json is the reference run):
#
#   tools/ab_sim_speed.sh OLD_REV [ROUNDS] [AGENTS] [PAIRED]   e.g. tools/ab_sim_speed.sh 5a08861 4 1024,2048
#
# PAIRED=paired runs the old and the new build at the same time, one per CPU (taskset), swapping
# CPUs every round, and reports the median of the rounds' ratios new / old: whatever else slows
# the machine during a round slows both alike, so the paired ratio is steadier than ratios of
# separate runs (it needs 2 idle CPUs).
#
# PAIRED=callgrind counts instructions instead (valgrind --tool=callgrind, PYTHONHASHSEED=0): per
# build and agent count, the instructions of a run less those of building the simulator
# (sim_speed_driver.py --setup-only). Other load on the machine does not change a count, so one
# round suffices and the ratio is exact for those instructions (not for cache misses or branch
# prediction, which a count does not see). About 130x slower than a run: use small AGENTS (256).
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
PAIRED=${4:-}
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
src_of() { [ -d "$WORK/$1/src" ] && echo "$WORK/$1/src" || echo "$WORK/$1"; }
if [ "$PAIRED" = callgrind ]; then
  ir() {  # instructions of one driver invocation
    PYTHONHASHSEED=0 PYTHONPATH=$(src_of $1) valgrind --tool=callgrind --callgrind-out-file=/dev/null \
      "$PY" "$REPO/tools/sim_speed_driver.py" "${@:2}" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
  }
  echo "| build | agents | old instructions (run) | new instructions (run) | new / old |"
  echo "|---|---|---|---|---|"
  for pair in "old_c new_c" "old new"; do
    set -- $pair
    for n in ${AGENTS//,/ }; do
      o=$(( $(ir $1 "$n") - $(ir $1 "$n" --setup-only) ))
      w=$(( $(ir $2 "$n") - $(ir $2 "$n" --setup-only) ))
      kind=$([ $1 = old_c ] && echo compiled || echo pure)
      echo "| $kind | $n | $o | $w | $(python3 -c "print(f'{$w / $o:.4f}')") |"
    done
  done
  exit 0
fi
for round in $(seq 1 "$ROUNDS"); do
  for pair in "old_c new_c" "old new"; do
    for n in ${AGENTS//,/ }; do
      if [ "$PAIRED" = paired ]; then
        set -- $pair
        cpu_old=$((round % 2)); cpu_new=$((1 - round % 2))
        PYTHONPATH=$(src_of $1) taskset -c $cpu_old "$PY" "$REPO/tools/sim_speed_driver.py" "$n" > "$WORK/p_$1" &
        PYTHONPATH=$(src_of $2) taskset -c $cpu_new "$PY" "$REPO/tools/sim_speed_driver.py" "$n" > "$WORK/p_$2" &
        wait
        cat "$WORK/p_$1" >> "$WORK/r_$1.jsonl"
        cat "$WORK/p_$2" >> "$WORK/r_$2.jsonl"
      else
        for t in $pair; do
          PYTHONPATH=$(src_of $t) "$PY" "$REPO/tools/sim_speed_driver.py" "$n" >> "$WORK/r_${t}.jsonl"
        done
      fi
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
print("| build | agents | time | old s | new s | best new / best old | median new / median old | median of round ratios |")
print("|---|---|---|---|---|---|---|---|")
for kind, old, new in (("compiled", "old_c", "new_c"), ("pure", "old", "new")):
    for n in sorted({a for _, a in runs}):
        for key in ("wall_s", "cpu_s"):
            o = [r[key] for r in runs[(old, n)]]
            w = [r[key] for r in runs[(new, n)]]
            print(f"| {kind} | {n} | {key[:-2]} | {' '.join(f'{x:.2f}' for x in o)} | {' '.join(f'{x:.2f}' for x in w)} "
                  f"| {min(w) / min(o):.3f} | {statistics.median(w) / statistics.median(o):.3f} "
                  f"| {statistics.median(x / y for x, y in zip(w, o)):.3f} |")
EOF
