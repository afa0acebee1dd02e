"""`rlperf selfcheck -- COMMAND ...`: another trainer's phases checked as the reference trainer's are. Each delay is
injected from the environment (RLPERF_INJECT_DELAY) into runs of the command, whose phases are `rlperf attach`'s or,
without the attach, those its loop marks through rlperf.phases."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from profilers.attach_command import run_attached
from reference_trainer import attribution
from rlperf.errors import MachineFault
from rlperf.summary import RunSummary

ATTACHED_PHASES = ("env", "eval_forward", "train_forward", "learn")


def command_runs(command: list[str], delay_ms: float, chosen: tuple[str, ...] | None, attach: bool,
                 timeout_s: float, monitored) -> dict[str, float]:
    """The command's check: a baseline run, one run per phase delayed and one with all delayed, each run through
    `monitored(name, delays)`, which returns its summary; the shares as `attribution.attributed_shares` gives them."""
    baseline = monitored(attribution.BASELINE, {})
    phases = chosen or (ATTACHED_PHASES if attach else
                        tuple(name for name, seconds in baseline.phases.items() if seconds > 0 and name != "other"))
    summaries = {attribution.BASELINE: baseline}
    for name in phases:
        summaries[name] = monitored(name, {name: delay_ms})
    summaries[attribution.ALL_AT_ONCE] = monitored(attribution.ALL_AT_ONCE, dict.fromkeys(phases, delay_ms))
    shares = {}
    for name in phases:
        shares.update(shares_of(baseline, summaries[name], (name,), delay_ms))
    together = shares_of(baseline, summaries[attribution.ALL_AT_ONCE], phases, delay_ms)
    return {**shares, **{f"{name} {attribution.ALL_AT_ONCE}": share for name, share in together.items()}}


def shares_of(baseline, delayed, phases: tuple[str, ...], delay_ms: float) -> dict[str, float]:
    """Per phase, the share of its delay that the delayed run's summary attributed to it: the difference of the
    two runs' median steady-epoch seconds in the phase, over the delay."""
    return {name: (attribution.median_phase_seconds(delayed.to_dict(), name)
                   - attribution.median_phase_seconds(baseline.to_dict(), name)) / (delay_ms / 1000.0)
            for name in phases}


def command_summary(command: list[str], delays: dict[str, float], attach: bool, timeout_s: float,
                    warmup_epochs: int = 1) -> RunSummary:
    """One run of the command with `delays`, its summary read; a run that fails or writes none is one line."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "summary.json"
        done = run_attached(command, path, delays, warmup_epochs, timeout_s, attach=attach)
        if done.returncode != 0:
            raise MachineFault(f"command: a run with delays {delays or 'none'} exited with code {done.returncode}")
        if not path.is_file():
            raise MachineFault(f"command: a run with delays {delays or 'none'} wrote no summary")
        return RunSummary.check(json.loads(path.read_text()))
