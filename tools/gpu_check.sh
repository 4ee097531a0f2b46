#!/usr/bin/env bash
# The runtime on a GPU: one prepared run for a lent GPU machine (CI has none; the last
# run's result is docs/results/runtime/cuda_check.json). Results go to $OUT (or out/gpu_check): gpu_check.log,
# cuda_check.json, demo_cuda.json, demo_cuda.png, demo_cpu.json, model_speed_cuda.json, model_speed_cuda.png.
#
# Prepare here (the GPU machine cannot download; its image lacks pyzmq):
#     make gpu-wheels            # .gpu_wheels/: pyzmq for the GPU image's Python 3.12 (git-ignored)
# Run there, through the device tool, with carry [".gpu_wheels"]:
#     bash tools/gpu_check.sh
# Dry run of the script itself on a machine without a GPU: GPU_CHECK_DEVICE=cpu bash tools/gpu_check.sh
#
# Steps (the script goes on after a failure and exits 1 if any failed):
#   1. tools/cuda_check.py: the model on CUDA vs the CPU, layerwise prefill from pinned host bytes;
#   2. the runtime cluster with its engines on the device (DUALPATH_TEST_DEVICE): the same tokens
#      on the PE read path, the DE read path, basic and oracle as a CPU full recompute, over a
#      multi-turn conversation (tests/runtime/cluster/test_kv_paths.py), plus the device tests;
#   3. `dualpath demo --model tiny` on the device and on the CPU: bytes per read path, JCTs;
#   4. `dualpath bench model-speed --model tiny` on the device: our prefill and decode (workspace and
#      gather) against transformers on the same weights, where the image has transformers.
set -uo pipefail
cd "$(dirname "$0")/.."
DEV=${GPU_CHECK_DEVICE:-cuda}
OUT=${OUT:-out/gpu_check}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: >"$LOG"
export PYTHONUNBUFFERED=1
site=$(mktemp -d)
if compgen -G ".gpu_wheels/*.whl" >/dev/null; then
  python3 -m pip install --quiet --no-index --no-deps --target "$site" .gpu_wheels/*.whl >>"$LOG" 2>&1 \
    || echo "could not install .gpu_wheels (built for the GPU image's Python 3.12)" | tee -a "$LOG"
fi
export PYTHONPATH="src:$site"
fail=0
step() {  # step NAME CMD...: run, append to the log, record the exit code
  local name=$1; shift
  echo "== $name: $*" | tee -a "$LOG"
  "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc" | tee -a "$LOG"
  [ "$rc" -eq 0 ] || fail=1
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee -a "$LOG"
step cuda_check python3 tools/cuda_check.py --device "$DEV" --json "$OUT/cuda_check.json"
step runtime_paths env DUALPATH_TEST_DEVICE="$DEV" python3 -m pytest -q -p no:cacheprovider -o addopts="" \
  tests/runtime/cluster/test_kv_paths.py tests/runtime/test_device.py
step demo_device python3 -m dualpath.cli demo --model tiny --device "$DEV" --json "$OUT/demo_$DEV.json" --plot "$OUT/demo_$DEV.png"
[ "$DEV" = cpu ] || step demo_cpu python3 -m dualpath.cli demo --model tiny --device cpu --json "$OUT/demo_cpu.json" \
  --plot "$site/demo_cpu.png"
step model_speed python3 -m dualpath.cli bench model-speed --model tiny --device "$DEV" --repeats 3 \
  --json "$OUT/model_speed_$DEV.json" --plot "$OUT/model_speed_$DEV.png"
echo "gpu_check on $DEV: $([ $fail -eq 0 ] && echo all steps passed || echo SOME STEP FAILED)" | tee -a "$LOG"
exit $fail
