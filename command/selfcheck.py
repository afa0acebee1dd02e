"""`rlperf selfcheck`: proves the phase breakdown puts time where it was spent (reference_trainer/attribution.py),
each training bracketed by the interference monitor, as a sweep's repeats are. With `-- COMMAND ...`, the same
check of another trainer's phases (profilers/command_check.py).

A share short of its delay on a quiet machine is a FAIL: the timer charged the delay elsewhere. A share short of
it while another process used the CPU or the run's GPU is `contended`, with the reason, and proves nothing
either way; run it again on a quiet machine. Exit 0 when every phase is ok, 1 otherwise.
"""

from __future__ import annotations

import argparse

from profilers import command_check
from profilers.command_check import ATTACHED_PHASES
from profilers.interference import InterferenceMonitor
from reference_trainer import attribution
from reference_trainer.config import GRAPH_SCOPES, MAX_INJECT_DELAY_MS, TrainConfig
from rlperf.arguments import number_in


def at_least_4_epochs(text: str) -> int:
    if not text.isdigit() or int(text) < 4:
        raise argparse.ArgumentTypeError(f"must be a whole number of 4 or more: two warm-up epochs and a median "
                                         f"of steady ones (got {text!r})")
    return int(text)


def step_scope_only(text: str) -> str:
    if text not in GRAPH_SCOPES:
        raise argparse.ArgumentTypeError(f"unknown scope {text!r} (allowed: step)")
    if text != "step":
        raise argparse.ArgumentTypeError(f"{text} makes a whole rollout or update one call, with no phase inside it "
                                         f"to delay or attribute (allowed: step)")
    return text


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--delay-ms", type=number_in(0, MAX_INJECT_DELAY_MS, low_included=False), default=40.0,
                        help="delay injected per epoch (default 40)")
    parser.add_argument("--epochs", type=at_least_4_epochs, default=12, help="epochs per run (default 12)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--graph-scope", type=step_scope_only, default="step",
                        help="the trainer's graph_scope: step only, as a whole call has no phases inside to check "
                             "(default step)")
    parser.add_argument("--phases", type=phase_list, default=None,
                        help="with a command: the phases to delay, comma-separated (default: those attach finds, "
                             f"{','.join(ATTACHED_PHASES)}; with --no-attach, every phase the command's own run shows)")
    parser.add_argument("--no-attach", action="store_true",
                        help="with a command: it marks its own phases through rlperf.phases; attach nothing "
                             "(default: attach)")
    parser.add_argument("--timeout", type=number_in(0, 86_400, low_included=False), default=600.0,
                        help="with a command: seconds each of its runs may take (default 600)")
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="check the phases of this command (rlperf attach's, or its own) instead of the "
                             "reference trainer's")


def phase_list(text: str) -> tuple[str, ...]:
    from rlperf.summary import PHASES

    names = tuple(filter(None, text.split(",")))
    unknown = [name for name in names if name not in PHASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown phase {unknown[0] if unknown else text!r} "
                                         f"(allowed: {', '.join(PHASES)})")
    return names


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
            return command_check.command_summary(command, delays, not args.no_attach, args.timeout)
        finally:
            accounts[name] = monitor.stop()

    if command:
        shares = command_check.command_runs(command, args.delay_ms, args.phases, not args.no_attach, args.timeout,
                              monitored_command)
    else:
        shares = attribution.attributed_shares(args.delay_ms, args.epochs, args.device, monitored)
    table = Table(title=f"{args.delay_ms:g} ms injected per epoch; share attributed to the phase")
    table.add_column("phase")
    table.add_column("attributed", justify="right")
    table.add_column("verdict")
    contended_runs = []
    for row, share in shares.items():
        if share >= attribution.REQUIRED_SHARE:
            verdict = "[green]ok[/green]"
        else:
            busy = [name for name in (attribution.BASELINE, attribution.delayed_run(row)) if accounts[name]["contended"]]
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
    return 0 if all(share >= attribution.REQUIRED_SHARE for share in shares.values()) else 1
