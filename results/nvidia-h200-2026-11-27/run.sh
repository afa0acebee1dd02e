#!/bin/bash
# Every GPU measurement of this folder, in one call on the GPU machine, from the repository's root:
#   OUT=<dir> BUDGET=<seconds> PART=1|2 bash results/nvidia-h200-2026-11-27/run.sh  (part 2: what did not fit in part 1)
# The wheels torch's image lacks (gymnasium, farama-notifications, ale-py, holistictraceanalysis, plotly,
# pydot) are in .whl/; d36e2ed, the code the H100 measured, is unpacked in .old/ (git archive d36e2ed).
# Steps run in order of what they are for, each with a time cap; a step that no longer fits is skipped.
set -u
HERE=$(dirname "$0")
T0=$(date +%s); DL=$((T0 + ${BUDGET:-545}))
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
BASE=(--env synthetic --device cuda --num-envs 4096 --horizon 64 --minibatch-size 16384 --update-epochs 1
      --hidden-size 128 --total-steps 3145728 --warmup-epochs 2)
BREAKOUT=(--env gym:ale_py:ALE/Breakout-v5 --encoder cnn --num-envs 256 --horizon 32 --minibatch-size 2048
          --hidden-size 256 --device cuda --total-steps 2621440 --steady-seconds 6)
FAST=(--env-groups 2 --pinned --non-blocking --cuda-graphs)

{ nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE,POWER; nproc; python3 -VV;
  python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())';
  git log -1 --format='%H %s'; } > "$W/machine.txt" 2>&1
step wheels 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
OLD=(env -C .old PYTHONPATH=/tmp/site:. python3 -c 'import sys; from rlperf.cli import main; sys.exit(main(sys.argv[1:]))')
if [ "${PART:-1}" = 1 ]; then
step old_eager 60 "${OLD[@]}" train "${BASE[@]}" --json "$W/old_eager.json"
step old_graphs 45 "${OLD[@]}" train "${BASE[@]}" --cuda-graphs --json "$W/old_graphs.json"
step install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
step new_eager 50 python3 -m command.cli train "${BASE[@]}" --json "$W/new_eager.json"
step new_graphs 40 python3 -m command.cli train "${BASE[@]}" --cuda-graphs --json "$W/new_graphs.json"
step sweep 125 python3 "$HERE/sweep.py" $(( $(date +%s) + 120 )) "$W/sweep.jsonl"
step profile_graphs 45 python3 -m command.cli profile --env synthetic-device --device cuda --num-envs 4096 --horizon 64 \
  --minibatch-size 16384 --update-epochs 1 --hidden-size 128 --total-steps 1048576 --warmup-epochs 2 --cuda-graphs \
  --out "$W/profile_graphs"
step breakout_fast 50 python3 -m command.cli train "${BREAKOUT[@]}" "${FAST[@]}" --json "$W/breakout_fast.json"
step breakout_envrate 40 python3 -m benches.envrate --env gym:ale_py:ALE/Breakout-v5 --num-envs 256 --repeats 3
step gpu_tests 400 python3 -m pytest -m gpu -v -rs -p no:cacheprovider --durations=30 tests/test_lstm_pieces.py \
  tests/test_profile_trace.py tests/test_env_overlap.py tests/test_noise_gpu.py tests/test_interference.py \
  tests/test_profile_sampler.py tests/test_gpu_knobs.py tests/test_gpu_micro.py tests/test_collectives.py tests/test_distributed.py
else
step install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
step breakout_default 50 python3 -m command.cli train "${BREAKOUT[@]}" --json "$W/breakout_default.json"
step breakout_frames 40 python3 -m command.cli train "${BREAKOUT[@]/gym:ale_py:ALE\/Breakout-v5/synthetic}" --obs-shape 4,84,84 \
  --obs-dtype uint8 "${FAST[@]}" --json "$W/breakout_frames.json"
step profile_eager 45 python3 -m command.cli profile "${BASE[@]/3145728/1048576}" --out "$W/profile_eager"
step suite_on_gpu_box 120 python3 -m pytest -v -rs -p no:cacheprovider tests/test_roofline.py::test_rlperf_probe_prints_and_stores_the_roofs_and_refuses_bad_input \
  tests/test_report_render.py::test_compare_two_machines_with_prices tests/test_selfcheck.py::test_every_delay_lands_in_its_phase_alone_and_all_at_once
step smoke 200 python3 -m command.cli bench --suite gpu-smoke --device auto --out "$W/smoke"
fi
{ nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE; } > "$W/machine_end.txt" 2>&1
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$W/steps.txt"
