"""`rlperf selfcheck`: proves the phase breakdown puts time where it was spent (reference_trainer/selfcheck.py),
each training bracketed by the interference monitor, as a sweep's repeats are. With `-- COMMAND ...`, the same
check of another trainer's phases: `rlperf attach`'s (or, with --no-attach, those its loop marks through
rlperf.phases), each delay injected from the environment (RLPERF_INJECT_DELAY) into runs of the command.

A share short of its delay on a quiet machine is a FAIL: the timer charged the delay elsewhere. A share short of
it while another process used the CPU or the run's GPU is `contended`, with the reason, and proves nothing
either way; run it again on a quiet machine. Exit 0 when every phase is ok, 1 otherwise.
"""

from __future__ import annotations

import argparse

from profilers.interference import InterferenceMonitor
from reference_trainer import selfcheck
from reference_trainer.config import MAX_INJECT_DELAY_MS, TrainConfig
from rlperf.arguments import number_in


def at_least_4_epochs(text: str) -> int:
    if not text.isdigit() or int(text) < 4:
        raise argparse.ArgumentTypeError(f"must be a whole number of 4 or more: two warm-up epochs and a median "
                                         f"of steady ones (got {text!r})")
    return int(text)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--delay-ms", type=number_in(0, MAX_INJECT_DELAY_MS, low_included=False), default=40.0,
                        help="delay injected per epoch (default 40)")
    parser.add_argument("--epochs", type=at_least_4_epochs, default=12, help="epochs per run (default 12)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--phases", type=phase_list, default=None,
                        help="with a command: the phases to delay, comma-separated (default: those attach finds, "
                             f"{','.join(ATTACHED_PHASES)}; with --no-attach, every phase the command's own run shows)")
    parser.add_argument("--no-attach", action="store_true",
                        help="with a command: it marks its own phases through rlperf.phases; attach nothing")
    parser.add_argument("--timeout", type=number_in(0, 86_400, low_included=False), default=600.0,
                        help="with a command: seconds each of its runs may take (default 600)")
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="check the phases of this command (rlperf attach's, or its own) instead of the "
                             "reference trainer's")


ATTACHED_PHASES = ("env", "eval_forward", "train_forward", "learn")


def phase_list(text: str) -> tuple[str, ...]:
    from rlperf.summary import PHASES

    names = tuple(filter(None, text.split(",")))
    unknown = [name for name in names if name not in PHASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown phase {unknown[0] if unknown else text!r} "
                                         f"(allowed: {', '.join(PHASES)})")
    return names


def command_runs(command: list[str], delay_ms: float, chosen: tuple[str, ...] | None, attach: bool,
                 timeout_s: float, monitored) -> dict[str, float]:
    """The command's check: a baseline run, one run per phase delayed and one with all delayed, each run through
    `monitored(name, delays)`, which returns its summary; the shares as `selfcheck.attributed_shares` gives them."""
    baseline = monitored(selfcheck.BASELINE, {})
    phases = chosen or (ATTACHED_PHASES if attach else
                        tuple(name for name, seconds in baseline.phases.items() if seconds > 0 and name != "other"))
    summaries = {selfcheck.BASELINE: baseline}
    for name in phases:
        summaries[name] = monitored(name, {name: delay_ms})
    summaries[selfcheck.ALL_AT_ONCE] = monitored(selfcheck.ALL_AT_ONCE, dict.fromkeys(phases, delay_ms))
    shares = {}
    for name in phases:
        shares.update(shares_of(baseline, summaries[name], (name,), delay_ms))
    together = shares_of(baseline, summaries[selfcheck.ALL_AT_ONCE], phases, delay_ms)
    return {**shares, **{f"{name} {selfcheck.ALL_AT_ONCE}": share for name, share in together.items()}}


def shares_of(baseline, delayed, phases: tuple[str, ...], delay_ms: float) -> dict[str, float]:
    """Per phase, the share of its delay that the delayed run's summary attributed to it: the difference of the
    two runs' median steady-epoch seconds in the phase, over the delay."""
    return {name: (selfcheck.median_phase_seconds(delayed.to_dict(), name)
                   - selfcheck.median_phase_seconds(baseline.to_dict(), name)) / (delay_ms / 1000.0)
            for name in phases}


def command_summary(command: list[str], delays: dict[str, float], attach: bool, timeout_s: float,
                    warmup_epochs: int = 1):
    """One run of the command with `delays`, its summary read; a run that fails or writes none is one line."""
    import json
    import tempfile
    from pathlib import Path

    from profilers.attach_command import run_attached
    from rlperf.errors import MachineFault
    from rlperf.summary import RunSummary

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "summary.json"
        done = run_attached(command, path, delays, warmup_epochs, timeout_s, attach=attach)
        if done.returncode != 0:
            raise MachineFault(f"command: a run with delays {delays or 'none'} exited with code {done.returncode}")
        if not path.is_file():
            raise MachineFault(f"command: a run with delays {delays or 'none'} wrote no summary")
        return RunSummary.check(json.loads(path.read_text()))


def gpu_uuids(device: str) -> list[str]:
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return []  # a CPU run, or one the trainer refuses
    from rlperf.machine import cuda_uuid

    return [cuda_uuid(torch.device(device).index or 0)]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from reference_trainer.train import train

    uuids = gpu_uuids(args.device)
    accounts: dict[str, dict] = {}
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv

    def monitored(name: str, config: TrainConfig) -> dict:
        monitor = InterferenceMonitor(uuids, in_process=True)
        monitor.start()
        try:
            return train(config)
        finally:
            accounts[name] = monitor.stop()

    def monitored_command(name: str, delays: dict[str, float]):
        monitor = InterferenceMonitor(uuids)
        monitor.start()
        try:
            return command_summary(command, delays, not args.no_attach, args.timeout)
        finally:
            accounts[name] = monitor.stop()

    if command:
        shares = command_runs(command, args.delay_ms, args.phases, not args.no_attach, args.timeout,
                              monitored_command)
    else:
        shares = selfcheck.attributed_shares(args.delay_ms, args.epochs, args.device, monitored)
    table = Table(title=f"{args.delay_ms:g} ms injected per epoch; share attributed to the phase")
    table.add_column("phase")
    table.add_column("attributed", justify="right")
    table.add_column("verdict")
    contended_runs = []
    for row, share in shares.items():
        if share >= selfcheck.REQUIRED_SHARE:
            verdict = "[green]ok[/green]"
        else:
            busy = [name for name in (selfcheck.BASELINE, selfcheck.delayed_run(row)) if accounts[name]["contended"]]
            verdict = "[yellow]contended[/yellow]" if busy else "[red]FAIL[/red]"
            contended_runs += [name for name in busy if name not in contended_runs]
        table.add_row(row, f"{100 * share:.1f}%", verdict)
    console = Console()
    console.print(table)
    for name in contended_runs:
        console.print(f"contended: the {name} run: {accounts[name]['why']}", soft_wrap=True)
    if contended_runs:
        console.print("a contended share proves nothing either way: run selfcheck again on a quiet machine",
                      soft_wrap=True)
    unwatched = {account["gpu_watch_unavailable"] for account in accounts.values() if account["gpu_watch_unavailable"]}
    for reason in sorted(unwatched):
        console.print(f"note: {reason}", soft_wrap=True)
    return 0 if all(share >= selfcheck.REQUIRED_SHARE for share in shares.values()) else 1
