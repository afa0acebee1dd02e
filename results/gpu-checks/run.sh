#!/bin/bash
# The GPU checks prepared on a CPU machine, in one call that fits 8 minutes of a 15-minute loan, from the repository's
# root, in the order they matter (README.md beside this file says why each part is there and what it reads):
#   mkdir -p .old && git archive f271f73 | tar -x -C .old    # the code before graph_scope, beside this one
#   OUT=<dir> bash results/gpu-checks/run.sh                  # carry .old and .whl; BUDGET=480 by default
# Planned seconds (H100), 480 in all; each part has a cap, and a part that no longer fits is skipped:
#   setup   40  the wheels torch's image lacks, from .whl/, and this checkout installed
#   1      130  pytest -m gpu: the graph tests, the probe's, the phase timing's, the attach test, device memory
#   2      120  the GPU smoke (`rlperf bench --suite gpu-smoke`) and its roofline rows (every peak measured)
#   3      110  the frontier at 8192 envs: eager and --graph-scope step|rollout|update|both, this code against the
#               old in the same run (sweep.py), each configuration's traced epoch: GPU busy share, kernels per step
#   4       80  `rlperf doctor`'s mini-night, its own command (3 nightly points, working tree against HEAD):
#               the screen's first pairs on the device copy; its whole 180 s night is rest.sh PART=1
# What does not fit runs in results/gpu-checks/rest.sh, in the same form. Each part writes under $OUT/w/ as it
# finishes, and the end tars it into $OUT/gpu.tgz (files over 8 MB left out, listed in left_out.txt). A cap ends a
# part as Ctrl-C does, so pytest and rlperf still print what they have.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
T0=$(date +%s); DL=$((T0 + ${BUDGET:-480}))
W=$(cd "$OUT" && pwd)/w; mkdir -p "$W"
trap 'find "$W" -type f -size +8M -printf "%P %s\n" > "$W/left_out.txt"; find "$W" -type f -size +8M -delete;
      tar -czf "$OUT/gpu.tgz" -C "$OUT" w' EXIT
step() {  # step NAME CAP_SECONDS COMMAND...: runs it for at most CAP, or what is left; logs to w/NAME.log
  local name=$1 cap=$2 left; shift 2
  left=$((DL - $(date +%s))); [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 12 ]; then echo "$name skipped: ${left} s left" | tee -a "$W/steps.txt"; return; fi
  local started; started=$(date +%s.%N)
  timeout -s INT -k 25 "$cap" "$@" > "$W/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $started}") s (cap $cap)" | tee -a "$W/steps.txt"
}
R=(python3 -m command.cli)
OLD=(env -C .old PYTHONPATH=/tmp/site:. python3)
SWEEP=$HERE/../gpu-checks-frontier/sweep.py
ROOFLINE='import sys; from pathlib import Path; from benches.readiness import smoke_roofline_problem
w = Path(sys.argv[1]); problem = smoke_roofline_problem(w / "smoke" / "results.sqlite", w / "smoke.log")
print(problem or "the smoke roofline is whole: every peak measured, every point placed"); sys.exit(1 if problem else 0)'

{ nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE,POWER; nproc; python3 -VV;
  python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())';
  ls .old > /dev/null 2>&1 && echo "old code in .old" || echo "no .old: the old side is skipped"; } > "$W/machine.txt" 2>&1
step wheels 25 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
step install 25 python3 -m pip install -q --no-deps --no-build-isolation -e .
# 1. the GPU tests of what this change touched: whole graphs against eager cuDNN, launches as traced, the probe
step gpu_tests 130 python3 -m pytest -m gpu -v -rs -p no:cacheprovider --durations=15 tests/test_gpu_graphs.py \
  tests/test_lstm_pieces.py tests/test_phases.py tests/test_attach.py tests/test_gpu_memory.py \
  tests/test_gpu_knobs.py::test_the_probe_measures_every_kind_of_peak_a_gpu_run_needs
# 2. what a GPU user sees first, and whether its roofline is whole
step smoke 110 "${R[@]}" bench --suite gpu-smoke --device cuda --out "$W/smoke"
step smoke_roofline 10 python3 -c "$ROOFLINE" "$W"
# 3. the frontier, the old side first (its process ends before this one starts)
[ -d .old ] && step sweep_old 40 "${OLD[@]}" "$SWEEP" old $(( $(date +%s) + 36 )) "$W/sweep.jsonl" "$W/traces"
step sweep_new 70 python3 "$SWEEP" new $(( $(date +%s) + 66 )) "$W/sweep.jsonl" "$W/traces"
# 4. the doctor's night needs HEAD; a device copy has no .git, so its working tree is committed as HEAD first
[ -d .git ] || { git init -q && git add -A -- . ":!.old" && git -c user.name=gpu -c user.email=gpu@localhost commit -qm copy; } \
  > "$W/git.log" 2>&1
step night 80 "${R[@]}" gate --suite doctor-night --baseline HEAD --screen-pairs 2 --refine-points 0 --night-s 180 \
  --out "$W/night" --summary "$W/night/gate.json"
{ nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE; } > "$W/machine_end.txt" 2>&1
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$W/steps.txt"
