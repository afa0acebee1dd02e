"""`rlperf selfcheck -- COMMAND ...`: one run of another trainer with delays injected from the environment
(RLPERF_INJECT_DELAY, in every other epoch), its phases `rlperf attach`'s or, without the attach, those its loop
marks through rlperf.phases."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from profilers.attach_command import EnvStepNames, run_attached
from rlperf.errors import MachineFault
from rlperf.summary import RunSummary

# the phases attach opens where a delay can be injected (train_misc is known only once training has begun)
ATTACHED_PHASES = ("env", "eval_forward", "eval_misc", "train_forward", "learn")


def command_summary(command: list[str], delays: dict[str, float], attach: bool, timeout_s: float,
                    warmup_epochs: int = 1, env_steps: EnvStepNames = EnvStepNames(),
                    delay_every: int = 1) -> RunSummary:
    """One run of the command with `delays` in every `delay_every`th epoch, its summary read; a run that fails or
    writes none is one line, with the command's own last line where it said why."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "summary.json"
        done = run_attached(command, path, delays, warmup_epochs, timeout_s, attach=attach, env_steps=env_steps,
                            delay_every=delay_every, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        said = (done.stderr or "").strip().splitlines()[-1:] if done.stderr is not None else []
        why = f": {said[0]}" if said else ""
        if done.returncode != 0:
            raise MachineFault(f"command: a run with delays {delays or 'none'} exited with code {done.returncode}"
                               f"{why}")
        if not path.is_file():
            raise MachineFault(f"command: a run with delays {delays or 'none'} wrote no summary{why}")
        return RunSummary.check(json.loads(path.read_text()), sps_required=False)
