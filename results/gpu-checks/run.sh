#!/bin/bash
# The GPU checks prepared on a CPU machine, for the next session with a GPU, from the repository's root, in the
# order they matter; each part fits one call of at most 10 minutes (`run` keeps the machine warm between calls):
#   OUT=<dir> BUDGET=240 PART=1 bash results/gpu-checks/run.sh   the probe's GPU test and the GPU smoke with its
#                                                                roofline (about 3.5 min on an H200)
#   OUT=<dir> BUDGET=580 PART=2 bash results/gpu-checks/run.sh   `rlperf doctor` (about 8 min on an H200, 10 on
#                                                                an H100: docs/gpu-runner.md), then `pytest -m "not
#                                                                gpu"` in what is left
#   OUT=<dir> BUDGET=580 PART=3 bash results/gpu-checks/run.sh   the event measurements (about 6 min: pairs of
#                                                                fresh processes, results/gpu-checks/pairs.py), then
#                                                                `pytest -m "not gpu"` in what is left
# Everything lands in $OUT/w/ and is tarred into $OUT/gpu.tgz (files over 8 MB left out, listed in left_out.txt).
# The wheels torch's image lacks (gymnasium, farama-notifications, ale-py, holistictraceanalysis, plotly, pydot,
# pytest-timeout) go in .whl/ (carry it). Steps run in order, each with a time cap; a step that no longer fits
# is skipped. A cap ends a step as Ctrl-C does, so pytest and rlperf still print what they have.
set -u
T0=$(date +%s); DL=$((T0 + ${BUDGET:-560}))
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
PAIRS=(python3 results/gpu-checks/pairs.py)
EAGER=(--env synthetic --device cuda --num-envs 4096 --horizon 64 --minibatch-size 16384 --update-epochs 1
       --hidden-size 128 --total-steps 3145728 --warmup-epochs 2)
BREAKOUT=(--env gym:ale_py:ALE/Breakout-v5 --encoder cnn --num-envs 256 --horizon 32 --minibatch-size 2048
          --hidden-size 256 --device cuda --total-steps 2621440 --steady-seconds 6 --warmup-epochs 2 --env-workers 8)
# where each env group's worker waits on its actions' CUDA event: pinned non_blocking copies, two groups
FAST=(--env-groups 2 --pinned --non-blocking --cuda-graphs)
ROOFLINE='import sys; from pathlib import Path; from benches.readiness import smoke_roofline_problem
w = Path(sys.argv[1]); problem = smoke_roofline_problem(w / "smoke" / "results.sqlite", w / "smoke.log")
print(problem or "the smoke roofline is whole: every peak measured, every point placed"); sys.exit(1 if problem else 0)'

{ nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE,POWER; nproc; python3 -VV;
  python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())';
  git log -1 --format='%H %s'; git status --short | head -20; } > "$W/machine.txt" 2>&1
step wheels 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
step install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
case "${PART:-1}" in
1)
  # the probe's graphs over 42 kernels at once, then what a GPU user sees first
  step probe_test 100 python3 -m pytest -v -rs -p no:cacheprovider \
    tests/test_gpu_knobs.py::test_the_probe_measures_every_kind_of_peak_a_gpu_run_needs
  step smoke 200 "${R[@]}" bench --suite gpu-smoke --device cuda --out "$W/smoke"
  step smoke_roofline 30 python3 -c "$ROOFLINE" "$W"
  ;;
2)
  step doctor 590 "${R[@]}" doctor --out "$W/doctor"
  step not_gpu 600 python3 -m pytest -m "not gpu" -rs -p no:cacheprovider --durations=30 tests
  ;;
3)
  # with and without the reuse of the phase timer's events, eager (its launches pace the step): 4 pairs
  step events_eager_4096 150 "${PAIRS[@]}" --variants events-made events-reused --pairs 4 --out "$W/events_4096" \
    -- "${EAGER[@]}"
  # a worker spinning on its event against one sleeping until the GPU signals: the synthetic env (a near-free env,
  # where the wake-up's latency shows) and Breakout (16 cores of emulators, where the spinning cores are theirs)
  step wait_synthetic_4096 150 "${PAIRS[@]}" --variants spin blocking --pairs 4 --out "$W/wait_synthetic" \
    -- "${EAGER[@]}" "${FAST[@]}"
  step wait_breakout_256 210 "${PAIRS[@]}" --variants spin blocking --pairs 3 --out "$W/wait_breakout" \
    -- "${BREAKOUT[@]}" "${FAST[@]}"
  step not_gpu 600 python3 -m pytest -m "not gpu" -rs -p no:cacheprovider --durations=30 tests
  ;;
esac
{ nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE; } > "$W/machine_end.txt" 2>&1
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$W/steps.txt"
