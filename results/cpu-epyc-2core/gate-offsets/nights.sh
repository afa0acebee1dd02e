#!/usr/bin/env bash
# Real gate nights of six.toml on this machine, from a clean checkout of the commit to measure:
#   nights.sh aa N OUT        N A/A nights: the working tree against HEAD, nothing changed
#   nights.sh slowed N OUT    N nights with num_envs=32 slowed by 10%: a spin of SPIN_S seconds planted in each of
#                             its learn steps (four an epoch of about 25 ms here) in a copy of the checkout
# Each night's log, summary and store go under OUT. Run nothing else on the machine meanwhile.
set -eu
kind=$1; nights=$2; out=$(realpath -m "$3")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
python=${PYTHON:-python3}
spin=${SPIN_S:-0.00057}
mkdir -p "$out"
tree=$repo
if [ "$kind" = slowed ]; then
  tree=$out/checkout
  [ -d "$tree" ] || git -C "$repo" worktree add --detach "$tree" HEAD -q
  git -C "$tree" checkout -q -- .
  "$python" - "$tree/reference_trainer/epoch_calls.py" "$spin" <<'PY'
import re, sys
from pathlib import Path
update, spin = Path(sys.argv[1]), sys.argv[2]
learn = re.compile(r'^([ \t]*)enter\("learn"\)[ \t]*$', re.MULTILINE)
def plant(match: re.Match) -> str:
    pad = match.group(1)
    return (f"{match.group(0)}\n{pad}if cfg.num_envs == 32:  # planted: only this point spins\n"
            f"{pad}    _until = __import__('time').perf_counter() + {spin}\n"
            f"{pad}    while __import__('time').perf_counter() < _until: pass")
source = update.read_text()
assert len(learn.findall(source)) == 1, "the learn phase's mark moved"
update.write_text(learn.sub(plant, source, count=1))
PY
fi
cd "$tree"
for n in $(seq 1 "$nights"); do
  start=$(date +%s)
  code=0
  "$python" -m rlperf gate --suite "$here/six.toml" --baseline HEAD --out "$out/store" --label "$kind $n" \
    --summary "$out/night-$n.json" > "$out/night-$n.log" 2>&1 || code=$?
  echo "$kind night $n exit $code $(( $(date +%s) - start )) s: $(tail -1 "$out/night-$n.log")"
done
