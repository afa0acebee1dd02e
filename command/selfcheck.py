"""`rlperf selfcheck`: proves the phase breakdown puts time where it was spent. Runs of the reference trainer, or
with `-- COMMAND ...` of another trainer (profilers/command_check.py), inject a known delay into a phase in every
other epoch; decisions/attribution.py judges each phase's share of it against a band, from an interval, and adds
runs until the interval is inside the band (ok) or outside it (FAIL), or the budget ends (undecided).

Each run is bracketed by the interference monitor: a share that fails or stays undecided while another process used
the CPU or the run's GPU says `contended`, with the reason. Exit 0 when every share is ok, 1 when one FAILs, 3 when
none fails and one is undecided.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from command.attach import add_env_step_arguments, env_step_names
from decisions import attribution
from profilers import command_check
from profilers.command_check import ATTACHED_PHASES
from profilers.interference import InterferenceMonitor
from reference_trainer.attribution import selfcheck_config
from reference_trainer.config import GRAPH_SCOPES, MAX_INJECT_DELAY_MS, PHASES
from rlperf.arguments import number_in, positive_int
from rlperf.errors import BadInput

UNDECIDED_EXIT = 3


def at_least_6_epochs(text: str) -> int:
    if not text.isdigit() or int(text) < 6:
        raise argparse.ArgumentTypeError(f"must be a whole number of 6 or more: two warm-up epochs and two pairs of a "
                                         f"delayed and an undelayed epoch (got {text!r})")
    return int(text)


def step_scope_only(text: str) -> str:
    if text not in GRAPH_SCOPES:
        raise argparse.ArgumentTypeError(f"unknown scope {text!r} (allowed: step)")
    if text != "step":
        raise argparse.ArgumentTypeError(f"{text} makes a whole rollout or update one call, with no phase inside it "
                                         f"to delay or attribute (allowed: step)")
    return text


def delay_ms(text: str) -> float | None:
    """`auto` (None) or a number of milliseconds above 0."""
    if text == "auto":
        return None
    try:
        return number_in(0, MAX_INJECT_DELAY_MS, low_included=False)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or auto") from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--delay-ms", type=delay_ms, default=None,
                        help="delay injected in every other epoch; auto sizes it from a run without delays, 40 "
                             "times the largest spread of a checked phase between adjacent epochs, 40 to 3000 ms "
                             "(default auto)")
    parser.add_argument("--epochs", type=at_least_6_epochs, default=12,
                        help="epochs per run of the reference trainer (default 12)")
    parser.add_argument("--max-runs", type=positive_int, default=6,
                        help="runs a phase may take before its share is undecided (default 6)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--graph-scope", type=step_scope_only, default="step",
                        help="the trainer's graph_scope: step only, as a whole call has no phases inside to check "
                             "(default step)")
    parser.add_argument("--phases", type=phase_list, default=None,
                        help="with a command: the phases to delay, comma-separated (default: those attach opens, "
                             f"{','.join(ATTACHED_PHASES)}; with --no-attach, every phase the command's own run shows)")
    parser.add_argument("--no-attach", action="store_true",
                        help="with a command: it marks its own phases through rlperf.phases; attach nothing "
                             "(default: attach)")
    parser.add_argument("--timeout", type=number_in(0, 86_400, low_included=False), default=600.0,
                        help="with a command: seconds each of its runs may take (default 600)")
    add_env_step_arguments(parser)
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="check the phases of this command (rlperf attach's, or its own) instead of the "
                             "reference trainer's")


def phase_list(text: str) -> tuple[str, ...]:
    from rlperf.summary import PHASES as NAMES

    names = tuple(filter(None, text.split(",")))
    unknown = [name for name in names if name not in NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown phase {unknown[0] if unknown else text!r} "
                                         f"(allowed: {', '.join(NAMES)})")
    return names


def gpu_uuids(device: str) -> list[str]:
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return []  # a CPU run, or one the trainer refuses
    from rlperf.machine import cuda_uuid

    return [cuda_uuid(torch.device(device).index or 0)]


def trainer_run(args: argparse.Namespace) -> Callable[[dict[str, float], int], list[dict]]:
    """One run of what is checked, by its delays and delay period: its epochs."""
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if command:
        env_steps = env_step_names(args)

        def run_command(delays: dict[str, float], every: int) -> list[dict]:
            return command_check.command_summary(command, delays, not args.no_attach, args.timeout,
                                                 env_steps=env_steps, delay_every=every).epochs

        return run_command
    if args.env_step or args.agents_per_step:
        raise BadInput("--env-step: names an env step of a command; give the command after --")
    from reference_trainer.train import train

    def run_reference(delays: dict[str, float], every: int) -> list[dict]:
        return train(selfcheck_config(delays, args.epochs, args.device, every))["epochs"]

    return run_reference


def checked_phases(args: argparse.Namespace, baseline: list[dict]) -> tuple[str, ...]:
    if not args.argv:
        return PHASES
    if args.phases:
        return args.phases
    if not args.no_attach:
        return ATTACHED_PHASES
    return tuple(name for name in PHASES if any(epoch["phases"].get(name, 0.0) > 0 for epoch in baseline))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    uuids = gpu_uuids(args.device)
    accounts: dict[str, dict] = {}
    one_run = trainer_run(args)
    console = Console()

    def monitored(name: str, delays: dict[str, float], every: int = attribution.DELAY_EVERY) -> list[dict]:
        monitor = InterferenceMonitor(uuids, in_process=not args.argv)
        monitor.start()
        try:
            return one_run(delays, every)
        finally:
            accounts[name] = monitor.stop()
            console.print(f"run {len(accounts)}: {name}{' (contended)' if accounts[name]['contended'] else ''}",
                          highlight=False)

    delay = args.delay_ms
    baseline: list[dict] = []
    if delay is None or (args.argv and args.no_attach and not args.phases):
        baseline = monitored(attribution.BASELINE, {}, 1)
    phases = checked_phases(args, baseline)
    if delay is None:
        delay = attribution.automatic_delay_ms(baseline, phases)
    rows = attribution.check(phases, delay, monitored, args.max_runs)
    show(console, rows, delay, args.max_runs, accounts)
    verdicts = {row.verdict for row in rows.values()}
    return 1 if "FAIL" in verdicts else UNDECIDED_EXIT if "undecided" in verdicts else 0


def show(console, rows: dict[str, attribution.RowVerdict], delay: float, max_runs: int,
         accounts: dict[str, dict]) -> None:
    from rich.table import Table

    low, high = attribution.BAND
    table = Table(title=f"{delay:g} ms injected in every other epoch; share attributed to the phase (band "
                        f"{100 * low:g}-{100 * high:g}%, {100 * attribution.CONFIDENCE:g}% interval)")
    for column, justify in (("phase", "left"), ("share", "right"), ("interval", "right"), ("pairs", "right"),
                            ("runs", "right"), ("verdict", "left")):
        table.add_column(column, justify=justify)
    contended_runs: list[str] = []
    for row in rows.values():
        verdict = {"ok": "[green]ok[/green]", "FAIL": "[red]FAIL[/red]", "undecided": "[yellow]undecided[/yellow]"}[
            row.verdict]
        busy = [name for name in row.runs if accounts[name]["contended"]]
        if row.verdict != "ok" and busy:
            verdict += " [yellow]contended[/yellow]"
            contended_runs += [name for name in busy if name not in contended_runs]
        interval = f"{100 * row.low:.1f}-{100 * row.high:.1f}%" if row.low is not None else "-"
        share = f"{100 * row.estimate:.1f}%" if row.estimate is not None else "-"
        table.add_row(row.row, share, interval, str(len(row.shares)), str(len(row.runs)), verdict)
    console.print(table)
    for name in contended_runs:
        console.print(f"contended: the {name} run: {accounts[name]['why']}", soft_wrap=True)
    if contended_runs:
        console.print("a contended share proves nothing either way: run selfcheck again on a quiet machine",
                      soft_wrap=True)
    undecided = [row.row for row in rows.values() if row.verdict == "undecided"]
    if undecided:
        console.print(f"undecided after {max_runs} runs each: {', '.join(undecided)}: their intervals still cross "
                      f"the band's edge; a larger --delay-ms or --max-runs decides them", soft_wrap=True)
    unwatched = {account["gpu_watch_unavailable"] for account in accounts.values() if account["gpu_watch_unavailable"]}
    for reason in sorted(unwatched):
        console.print(f"note: {reason}", soft_wrap=True)
