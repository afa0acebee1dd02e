#!/bin/bash
# What results/gpu-checks/run.sh leaves out, for a later loan, in the same form; each part one call of at most
# 10 minutes, from the repository's root (carry .old and .whl; README.md beside this file):
#   OUT=<dir> BUDGET=580 PART=1 bash results/gpu-checks/rest.sh
#     planned 40 setup + 530: `rlperf doctor` whole (its four checks at full size; about 8 min on an H200, 10 on an
#     H100, so on an H100 its last check may be cut: docs/gpu-runner.md)
#   OUT=<dir> BUDGET=580 PART=2 bash results/gpu-checks/rest.sh
#     planned 40 setup + 200 the rest of `pytest -m gpu` (step graphs, host syncs, noise, micro, env overlap)
#     + 140 a second frontier round, old then new (an offset one process had shows as a change between rounds)
#     + 60 the old code's step graphs traced alone + 140 the event and wait pairs (results/gpu-checks/pairs.py)
#   OUT=<dir> BUDGET=400 PART=3 bash results/gpu-checks/rest.sh
#     planned 40 setup + 300 a traced diff on CUDA, 4 processes a side, the plant of results/cpu-epyc-2core/
#     traced-diff against HEAD: kernel rows, launches and syncs per step, and each phase's device memory
# Everything lands in $OUT/w/ and is tarred into $OUT/gpu.tgz (files over 8 MB left out, listed in left_out.txt).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
T0=$(date +%s); DL=$((T0 + ${BUDGET:-580}))
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
PAIRS=(python3 "$HERE/pairs.py")
TRACED=(--env synthetic-device --device cuda --num-envs 8192 --horizon 64 --minibatch-size 32768 --update-epochs 1
        --hidden-size 128 --total-steps 2097152 --warmup-epochs 2 --cuda-graphs)
EAGER=(--env synthetic --device cuda --num-envs 4096 --horizon 64 --minibatch-size 16384 --update-epochs 1
       --hidden-size 128 --total-steps 3145728 --warmup-epochs 2)

{ nvidia-smi; nproc; python3 -VV; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; } \
  > "$W/machine.txt" 2>&1
step wheels 25 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
step install 25 python3 -m pip install -q --no-deps --no-build-isolation -e .
case "${PART:-1}" in
1)
  [ -d .git ] || { git init -q && git add -A -- . ":!.old" && git -c user.name=gpu -c user.email=gpu@localhost commit -qm copy; } \
    > "$W/git.log" 2>&1
  step doctor 530 "${R[@]}" doctor --out "$W/doctor"
  ;;
2)
  step gpu_tests 200 python3 -m pytest -m gpu -v -rs -p no:cacheprovider --durations=15 tests/test_gpu_knobs.py \
    tests/test_noise_gpu.py tests/test_gpu_micro.py tests/test_env_overlap.py tests/test_profile_trace.py \
    --deselect tests/test_gpu_knobs.py::test_the_probe_measures_every_kind_of_peak_a_gpu_run_needs
  [ -d .old ] && step sweep_old_2 60 "${OLD[@]}" "$SWEEP" old $(( $(date +%s) + 55 )) "$W/sweep.jsonl"
  step sweep_new_2 80 python3 "$SWEEP" new $(( $(date +%s) + 75 )) "$W/sweep.jsonl"
  [ -d .old ] && step profile_old_steps 60 "${OLD[@]}" -m command.cli profile "${TRACED[@]}" --out "$W/profile_old_steps"
  step events_eager_4096 140 "${PAIRS[@]}" --variants events-made events-reused --pairs 3 --out "$W/events_4096" \
    -- "${EAGER[@]}"
  ;;
3)
  [ -d .git ] || { git init -q && git add -A -- . ":!.old" && git -c user.name=gpu -c user.email=gpu@localhost commit -qm copy; } \
    > "$W/git.log" 2>&1
  git apply "$HERE/../cpu-epyc-2core/traced-diff/plant.patch" > "$W/plant.log" 2>&1
  step traced_diff 300 "${R[@]}" profile --device cuda --env synthetic --num-envs 1024 --horizon 16 \
    --minibatch-size 4096 --total-steps 131072 --warmup-epochs 2 --trace-epochs 3 --against HEAD --processes 4 \
    --out "$W/traced_diff"
  git checkout -- . >> "$W/plant.log" 2>&1
  ;;
esac
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$W/steps.txt"
