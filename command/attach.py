"""`rlperf attach -- COMMAND ...`: a command's time by phase without a line of it changed: env steps, the
policy's forward without grad (acting) and with grad (training), backward with the optimizer's step, and what
none of them claims (`other`). docs/any-trainer.md says how it reaches the command and what it attributes."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rlperf.errors import BadInput, MachineFault, output_file


def inject_delay(text: str) -> tuple[str, float]:
    from rlperf.summary import PHASES

    phase, _, ms = text.partition("=")
    if phase not in PHASES:
        raise argparse.ArgumentTypeError(f"unknown phase {phase!r} (allowed: {', '.join(PHASES)})")
    try:
        value = float(ms)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not PHASE=MILLISECONDS") from None
    if not 0 <= value <= 60_000:
        raise argparse.ArgumentTypeError(f"{phase}: milliseconds must be from 0 to 60000")
    return phase, value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, default=None,
                        help="write the run's summary here (docs/results-format.md); by default it is only shown")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="epochs left out as warm-up (default 1)")
    parser.add_argument("--inject-delay", type=inject_delay, action="append", default=[], metavar="PHASE=MS",
                        help="sleep MS milliseconds inside PHASE once an epoch, to check the attribution "
                             "(default: none)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="end the command after this many seconds (default: no limit)")
    parser.add_argument("--no-attach", action="store_true",
                        help="hooks off: the command marks its own phases through rlperf.phases (default: hooks on)")
    add_env_step_arguments(parser)
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the command to run")


def add_env_step_arguments(parser: argparse.ArgumentParser) -> None:
    """--env-step and --agents-per-step, as attach, selfcheck and profile take them."""
    from profilers.attach_command import agents_per_step, env_step_name

    parser.add_argument("--env-step", type=argparse_type(env_step_name), action="append", default=[],
                        metavar="MODULE:CLASS.METHOD",
                        help="a method that steps a batch of envs, for an env no library attach knows defines "
                             "(repeatable; __main__:CLASS.METHOD for a class of the script itself; default: none)")
    parser.add_argument("--agents-per-step", type=argparse_type(agents_per_step), default=None, metavar="N|ATTRIBUTE",
                        help="agents each named step counts: a number, or the env's attribute that holds it "
                             "(default: the env's num_envs, num_agents, env_num or batch_size, else the length of "
                             "the step's first argument)")


def argparse_type(check):
    def checked(text: str) -> str:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    checked.__name__ = check.__name__
    return checked


def env_step_names(args: argparse.Namespace):
    from profilers.attach_command import EnvStepNames

    if args.agents_per_step and not args.env_step:
        raise BadInput("--agents-per-step: counts the steps --env-step names; name one")
    return EnvStepNames(tuple(args.env_step), args.agents_per_step or "")


def run(args: argparse.Namespace) -> int:
    from profilers.attach_command import run_attached
    from rlperf.summary import RunSummary

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if args.warmup_epochs < 0:
        raise BadInput("--warmup-epochs: must be 0 or more")
    if args.json is not None:
        output_file(args.json, "json")
    env_steps = env_step_names(args)
    with tempfile.TemporaryDirectory() as scratch:
        path = args.json if args.json is not None else Path(scratch) / "summary.json"
        path.unlink(missing_ok=True)
        done = run_attached(command, path, dict(args.inject_delay), args.warmup_epochs, args.timeout,
                            attach=not args.no_attach, env_steps=env_steps)
        if done.returncode == 124 and args.timeout is not None:
            raise MachineFault(f"command: still running after --timeout {args.timeout:g} s; ended")
        if done.returncode != 0:
            sys.stderr.write(f"rlperf attach: the command exited with code {done.returncode}\n")
            return done.returncode if 0 < done.returncode < 256 else 1
        if not path.is_file():
            raise MachineFault("command: exited 0 but wrote no summary (the line above, from rlperf, says why)")
        summary = RunSummary.check(json.loads(path.read_text()), sps_required=False)
    show(summary)
    return 0


def show(summary) -> None:
    from rich.console import Console
    from rich.table import Table

    steady = summary.steady_seconds
    table = Table(title=f"phases over {len(summary.steady_epochs)} steady epochs ({summary.writer})")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("% of time", justify="right")
    for name, seconds in summary.phases.items():
        if seconds or name == "other":
            table.add_row(name, f"{seconds:.3f}", f"{100 * seconds / steady:.1f}")
    console = Console(file=sys.stdout)
    console.print(table)
    attached = summary.attached or {}
    coverage = (f"named phases {100 * (summary.phase_coverage or 0):.1f}% of the steady time, other "
                f"{100 * summary.phases.get('other', 0.0) / steady:.1f}%")
    if summary.sps is None:
        console.print(f"no SPS: {coverage}", soft_wrap=True)
        sys.stderr.write(f"rlperf attach: {attached.get('missing', 'no agent steps were counted')}\n")
    else:
        console.print(f"SPS {summary.sps:,.0f} steady over {summary.steady_steps:,} agent steps ({summary.steps:,} "
                      f"in all); {coverage}", soft_wrap=True)
    if attached.get("env_classes") is not None:
        console.print(f"attached: {', '.join(attached.get('hooks', []))}; envs stepped: "
                      f"{', '.join(attached['env_classes']) or 'none'}", soft_wrap=True)
