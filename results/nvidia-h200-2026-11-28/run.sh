#!/bin/bash
# Every GPU measurement of this folder, from the repository's root, in two calls on the GPU machine:
#   OUT=<dir> BUDGET=<seconds> PART=1 bash results/nvidia-h200-2026-11-28/run.sh   (the trainer, Breakout, GPU tests)
#   OUT=<dir> BUDGET=<seconds> PART=2 bash results/nvidia-h200-2026-11-28/run.sh   (the whole-suite failures, the smoke)
# The wheels torch's image lacks (gymnasium, farama-notifications, ale-py, holistictraceanalysis, plotly, pydot,
# pytest-timeout) are in .whl/. Steps run in order of what they are for, each with a time cap; a step that no
# longer fits is skipped. A cap ends a step as Ctrl-C does, so pytest and rlperf still print what they have.
set -u
T0=$(date +%s); DL=$((T0 + ${BUDGET:-560}))
W=$(cd "$OUT" && pwd)/w; mkdir -p "$W"
trap 'tar -czf "$OUT/gpu.tgz" -C "$OUT" w' EXIT
step() {  # step NAME CAP_SECONDS COMMAND...: runs it for at most CAP, or what is left; logs to w/NAME.log
  local name=$1 cap=$2 left; shift 2
  left=$((DL - $(date +%s))); [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 12 ]; then echo "$name skipped: ${left} s left" | tee -a "$W/steps.txt"; return; fi
  local started; started=$(date +%s.%N)
  timeout -s INT -k 8 "$cap" "$@" > "$W/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $started}") s (cap $cap)" | tee -a "$W/steps.txt"
}
R=(python3 -m command.cli)
BASE=(--env synthetic --device cuda --num-envs 4096 --horizon 64 --minibatch-size 16384 --update-epochs 1
      --total-steps 3145728 --warmup-epochs 2)
BREAKOUT=(--env gym:ale_py:ALE/Breakout-v5 --encoder cnn --num-envs 256 --horizon 32 --minibatch-size 2048
          --hidden-size 256 --device cuda --total-steps 2621440 --steady-seconds 6 --warmup-epochs 2)
FAST=(--env-groups 2 --pinned --non-blocking --cuda-graphs)
ENVRATE=(python3 -m benches.envrate --env gym:ale_py:ALE/Breakout-v5 --num-envs 256 --env-groups 2 --repeats 2)

{ nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE,POWER; nvidia-smi -q | grep -iE -A2 "persistence|applications clocks|compute mode";
  nproc; python3 -VV; python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())';
  git log -1 --format='%H %s'; } > "$W/machine.txt" 2>&1
step wheels 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
step install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
if [ "${PART:-1}" = 1 ]; then
step eager_fp32_128 45 "${R[@]}" train "${BASE[@]}" --hidden-size 128 --json "$W/eager_fp32_128.json"
step eager_fp32_512 45 "${R[@]}" train "${BASE[@]}" --hidden-size 512 --json "$W/eager_fp32_512.json"
step eager_bf16_512 45 "${R[@]}" train "${BASE[@]}" --hidden-size 512 --dtype bf16 --json "$W/eager_bf16_512.json"
step breakout_fast 60 "${R[@]}" train "${BREAKOUT[@]}" "${FAST[@]}" --json "$W/breakout_fast.json"
step breakout_envrate 45 "${ENVRATE[@]}"
step breakout_fast_w8 60 "${R[@]}" train "${BREAKOUT[@]}" "${FAST[@]}" --env-workers 8 --json "$W/breakout_fast_w8.json"
step breakout_envrate_w8 45 "${ENVRATE[@]}" --env-workers 8
step gpu_tests 400 python3 -m pytest -m gpu -v -rs -p no:cacheprovider --durations=45 tests
else
step whole_suite_failures 120 python3 -m pytest -v -rs -p no:cacheprovider \
  tests/test_roofline.py::test_rlperf_probe_prints_and_stores_the_roofs_and_refuses_bad_input \
  tests/test_report_render.py::test_compare_two_machines_with_prices \
  tests/test_selfcheck.py::test_every_delay_lands_in_its_phase_alone_and_all_at_once
step smoke 200 "${R[@]}" bench --suite gpu-smoke --device auto --out "$W/smoke"
fi
{ nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE; } > "$W/machine_end.txt" 2>&1
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$W/steps.txt"
