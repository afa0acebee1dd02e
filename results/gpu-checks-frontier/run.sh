#!/bin/bash
# The frontier's GPU checks, prepared on a CPU machine, in one call of at most 10 minutes, from the repository's root:
#   mkdir -p .old && git archive f271f73 | tar -x -C .old      # the code before graph_scope, beside this one
#   OUT=<dir> BUDGET=540 bash results/gpu-checks-frontier/run.sh     # carry .old and .whl
# In the order they matter, each step with a time cap, a step that no longer fits skipped:
#   1. the captured paths' GPU tests: whole rollout and whole update against eager, fresh actions at every replay,
#      no host sync inside a replay, no reset leaking, kernels split by graph; the step graphs' own tests;
#   2. the targets, new against old in turns, one configuration after another in one process (sweep.py): graphed
#      8192 envs device env, eager 4096 envs host env, and the whole calls at 8192;
#   3. one traced graphed epoch at 8192 envs, device env, graph_scope both: busy share, kernels and launches per
#      agent step, kernels by graph (profile.json); then a second round of 2 and, if time is left, the old code's
#      step graphs traced alike (today's kernels per agent step at 8192).
# Everything lands in $OUT/w/ and is tarred into $OUT/gpu.tgz (files over 8 MB left out, listed in left_out.txt).
# The wheels torch's image lacks (gymnasium, farama-notifications, ale-py, holistictraceanalysis, plotly, pydot,
# pytest-timeout) go in .whl/. A cap ends a step as Ctrl-C does, so pytest and rlperf still print what they have.
set -u
HERE=$(dirname "$0")
T0=$(date +%s); DL=$((T0 + ${BUDGET:-540}))
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
SWEEP=$(cd "$HERE" && pwd)/sweep.py
TRACED=(--env synthetic-device --device cuda --num-envs 8192 --horizon 64 --minibatch-size 32768 --update-epochs 1
        --hidden-size 128 --total-steps 2097152 --warmup-epochs 2 --cuda-graphs)

{ nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE,POWER; nproc; python3 -VV;
  python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())';
  ls .old > /dev/null 2>&1 && echo "old code in .old" || echo "no .old: the old side is skipped"; } > "$W/machine.txt" 2>&1
step wheels 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
step install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
step gpu_tests 200 python3 -m pytest -m gpu -v -rs -p no:cacheprovider --durations=15 tests/test_gpu_graphs.py \
  tests/test_lstm_pieces.py \
  "tests/test_gpu_knobs.py::test_cuda_graphs_train_like_eager_on_every_epoch" \
  "tests/test_gpu_knobs.py::test_the_trainers_step_graph_draws_fresh_noise_at_every_replay" \
  "tests/test_gpu_knobs.py::test_every_graph_is_replayed_before_the_steady_clock_starts" \
  "tests/test_gpu_knobs.py::test_capture_is_not_traced_and_traced_replays_keep_their_kernels" \
  "tests/test_gpu_knobs.py::test_no_host_sync_inside_rollout_and_update[graphs]" \
  "tests/test_gpu_knobs.py::test_no_host_sync_inside_rollout_and_update[eager]"
sweeps() {  # one round: the old code's process, then this code's
  [ -d .old ] && step "sweep_old_$1" 70 "${OLD[@]}" "$SWEEP" old $(( $(date +%s) + 65 )) "$W/sweep.jsonl"
  step "sweep_new_$1" 110 python3 "$SWEEP" new $(( $(date +%s) + 105 )) "$W/sweep.jsonl"
}
sweeps 1
step profile_both 60 "${R[@]}" profile "${TRACED[@]}" --graph-scope both --out "$W/profile_both"
sweeps 2  # the same processes again: an offset one side's process had shows as a change between rounds
[ -d .old ] && step profile_old_steps 60 "${OLD[@]}" -m command.cli profile "${TRACED[@]}" --out "$W/profile_old_steps"
{ nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE; } > "$W/machine_end.txt" 2>&1
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$W/steps.txt"
