#!/bin/bash
# Every GPU measurement of this folder, from the repository's root, in two calls on the GPU machine:
#   OUT=<dir> BUDGET=<seconds> PART=1 bash results/nvidia-h100-2026-11-27/run.sh   (the trainer, Breakout, GPU tests, smoke)
#   OUT=<dir> BUDGET=<seconds> PART=2 bash results/nvidia-h100-2026-11-27/run.sh   (process and pair noise)
# The wheels torch's image lacks (gymnasium, farama-notifications, ale-py, holistictraceanalysis, plotly, pydot)
# are in .whl/. Steps run in order of what they are for, each with a time cap; a step that no longer fits is skipped.
set -u
HERE=$(dirname "$0")
T0=$(date +%s); DL=$((T0 + ${BUDGET:-560}))
W=$(cd "$OUT" && pwd)/w; mkdir -p "$W"
trap 'tar -czf "$OUT/gpu.tgz" -C "$OUT" w' EXIT
step() {  # step NAME CAP_SECONDS COMMAND...: runs it for at most CAP, or what is left; logs to w/NAME.log
  local name=$1 cap=$2 left; shift 2
  left=$((DL - $(date +%s))); [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 12 ]; then echo "$name skipped: ${left} s left" | tee -a "$W/steps.txt"; return; fi
  local started; started=$(date +%s.%N)
  timeout -k 5 "$cap" "$@" > "$W/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $started}") s (cap $cap)" | tee -a "$W/steps.txt"
}
BREAKOUT=(--env gym:ale_py:ALE/Breakout-v5 --encoder cnn --num-envs 256 --horizon 32 --minibatch-size 2048
          --hidden-size 256 --device cuda --total-steps 2621440 --steady-seconds 6)
FAST=(--env-groups 2 --pinned --non-blocking --cuda-graphs --warmup-epochs 2)

{ nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE,POWER; nvidia-smi -q | grep -iE -A2 "persistence|applications clocks|compute mode";
  nproc; python3 -VV; python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())';
  git log -1 --format='%H %s'; } > "$W/machine.txt" 2>&1
step wheels 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
step install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
if [ "${PART:-1}" = 1 ]; then
step sweep 80 python3 "$HERE/sweep.py" $(( $(date +%s) + 75 )) "$W/sweep.jsonl"
step profile_graphs 40 python3 -m command.cli profile --env synthetic-device --device cuda --num-envs 4096 --horizon 64 \
  --minibatch-size 16384 --update-epochs 1 --hidden-size 128 --total-steps 1048576 --warmup-epochs 2 --cuda-graphs \
  --out "$W/profile_graphs"
step breakout_fast 60 python3 -m command.cli train "${BREAKOUT[@]}" "${FAST[@]}" --env-workers 8 --json "$W/breakout_fast.json"
step breakout_envrate 45 python3 -m benches.envrate --env gym:ale_py:ALE/Breakout-v5 --num-envs 256 --env-workers 8 --repeats 3
step gpu_tests 270 python3 -m pytest -m gpu -rs -p no:cacheprovider --durations=30
step smoke 180 python3 -m command.cli bench --suite gpu-smoke --device auto --out "$W/smoke"
else
step noise $((${BUDGET:-200} - 20)) python3 -m studies.noise --device cuda --rounds 12 --seconds $((${BUDGET:-200} - 45)) --out "$W/noise"
fi
{ nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE; } > "$W/machine_end.txt" 2>&1
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$W/steps.txt"
