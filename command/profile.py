"""`rlperf profile [train options] --out DIR`: one traced trainer run, with utilization and py-spy around it;
`rlperf profile --out DIR -- COMMAND ...`: the same of another trainer's command, attached.

The trainer runs in a child process (`rlperf train --trace-dir DIR --json ...`; a command in `rlperf attach`'s
environment, its phases timed and traced through rlperf.phases) and owns its torch.profiler session; this
process samples NVML and the host meanwhile, then merges the samples and the phase timeline into the trace as
tracks on the trace's clock, and summarises the trace. SPS is not reported: the profiler slows the run it observes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from decisions.trace_diff import DEFAULT_ALPHA
from profilers.profile_run import DEFAULT_SAMPLE_HZ, TRACE_NAME
from reference_trainer.config import TrainConfig
from reference_trainer.flags import add_train_flags, config_from_args
from rlperf.arguments import MAX_SAMPLE_HZ, add_alpha, number_in, positive_int
from rlperf.errors import BadInput, output_dir, output_file, written_whole

# traced processes a side: at 2 a side a process's luck on a shared machine hides even a 2.4-fold change
# (docs/profiling.md, "Traced diffs")
DEFAULT_PROCESSES = 4


def configure(parser: argparse.ArgumentParser) -> None:
    add_train_flags(parser, omit=("trace_dir",))  # the trace goes to --out
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="directory for the trace, its summary, utilization samples and py-spy output "
                             "(required; new or empty)")
    parser.add_argument("--sample-hz", type=number_in(0, MAX_SAMPLE_HZ, low_included=False), default=DEFAULT_SAMPLE_HZ,
                        help=f"NVML / CPU samples per second, above 0 and at most {MAX_SAMPLE_HZ:g} (default "
                             f"{DEFAULT_SAMPLE_HZ:g}; NVML's own utilization window is 1/6 to 1 s)")
    parser.add_argument("--pyspy", action="store_true",
                        help="run the trainer under py-spy: speedscope JSON and a flame graph SVG in DIR "
                             "(default off)")
    parser.add_argument("--pyspy-rate", type=positive_int, default=100,
                        help="py-spy samples per second (default 100)")
    parser.add_argument("--no-attach", action="store_true",
                        help="with a command: hooks off, the command marks its own phases through rlperf.phases "
                             "(default: attached)")
    parser.add_argument("--timeout", type=number_in(0, 86_400, low_included=False), default=None, metavar="S",
                        help="with a command: end it after this many seconds (default: none)")
    parser.add_argument("--against", metavar="REF", default=None,
                        help="trace the working tree and commit REF in one job, each from a checkout beside it, "
                             "--processes a side in turn, and write their diff into DIR (default: the working tree "
                             "alone)")
    parser.add_argument("--at", metavar="COMMIT", default=None,
                        help="with --against: trace commit COMMIT, checked out beside the working tree, in place of "
                             "the working tree (default: the working tree)")
    parser.add_argument("--processes", type=positive_int, default=DEFAULT_PROCESSES, metavar="N",
                        help=f"with --against: traced processes a side, at least 2 (default {DEFAULT_PROCESSES}): a "
                             "change is claimed only beyond the spread of each side's own")
    add_alpha(parser, "with --against: the chance that a diff claims some phase changed when none did", DEFAULT_ALPHA)
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="another trainer's command to profile (default: the reference trainer, from the "
                             "options above)")


# the trainer options a command's profile takes: the rest are the reference trainer's
COMMAND_OPTIONS = ("device", "warmup_epochs", "trace_epochs")

def profile_attached(args: argparse.Namespace, command: list[str]):
    """The command's profile: its first --trace-epochs steady epochs after --warmup-epochs, traced."""
    from profilers.profile_run import profile_command

    profile_attached_checks(args)
    if not args.quiet:
        sys.stderr.write(f"rlperf profile: tracing {args.trace_epochs} steady epoch(s) of the command after "
                         f"{args.warmup_epochs} warm-up epoch(s)...\n")
    config = {"command": command, "attach": not args.no_attach, "warmup_epochs": args.warmup_epochs,
              "device": args.device}
    return profile_command(config, Path(args.out), sample_hz=args.sample_hz,
                           pyspy_rate=args.pyspy_rate if args.pyspy else None, trace_epochs=args.trace_epochs,
                           timeout_s=args.timeout)


def profile_attached_checks(args: argparse.Namespace) -> None:
    """A command's warm-up, traced epochs, device and --out, checked before anything runs."""
    if args.warmup_epochs < 0:
        raise BadInput("warmup-epochs: must be 0 or more")
    if args.trace_epochs < 1:
        raise BadInput("trace-epochs: must be 1 or more")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise BadInput(f"device: must be cpu, cuda or cuda:N (got {args.device!r})")
    _checked_out(args)


def _checked_config(args: argparse.Namespace) -> TrainConfig:
    if not args.timers:
        raise BadInput("timers: rlperf profile needs the phase timers (they name the trace's ranges); drop --no-timers")
    cfg = dataclasses.replace(config_from_args(args), trace_dir=str(args.out))
    _checked_out(args)
    return cfg


def _checked_out(args: argparse.Namespace) -> None:
    """--out new or empty of a profile, --json writable: before anything runs."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"out: {out} exists and is not a directory; name a directory")
    if (out / TRACE_NAME).exists():
        raise BadInput(f"out: {out} already holds a profile; choose an empty or new directory")
    if args.json:
        output_file(args.json, "json")
    output_dir(out, "out")


def command_of(args: argparse.Namespace, parser_defaults: dict) -> list[str]:
    """The command after `--` (none: the reference trainer); a reference trainer's option given beside one, or a
    command's option without one, is refused in one line."""
    if args.argv[:1] not in ([], ["--"]):  # a mistyped option, not a command: a command follows `--`
        raise BadInput(f"unrecognized arguments: {' '.join(args.argv)} (a command to profile follows --)")
    command = args.argv[1:]
    if command:
        for field in dataclasses.fields(TrainConfig):
            if field.name not in COMMAND_OPTIONS and getattr(args, field.name) != parser_defaults[field.name]:
                raise BadInput(f"{field.name.replace('_', '-')}: a command's profile takes no trainer options (allowed "
                               f"with a command: {', '.join('--' + name.replace('_', '-') for name in COMMAND_OPTIONS)})")
    elif args.no_attach or args.timeout is not None:
        raise BadInput(f"{'no-attach' if args.no_attach else 'timeout'}: belongs to a command's profile (name one "
                       "after --)")
    return command


def run(args: argparse.Namespace) -> int:
    from profilers.profile_run import profile_run

    defaults = {field.name: getattr(TrainConfig(), field.name) for field in dataclasses.fields(TrainConfig)}
    command = command_of(args, {**defaults, "inject_delay": []})
    if args.against is not None:
        return run_against(args, command)
    if args.processes != DEFAULT_PROCESSES or args.at is not None:
        raise BadInput(f"{'at' if args.at is not None else 'processes'}: belongs to --against REF")
    created = not Path(args.out).exists()
    if command:
        result = profile_attached(args, command)
    else:
        cfg = _checked_config(args)
        if not args.quiet:
            sys.stderr.write(f"rlperf profile: tracing {cfg.trace_epochs} steady epoch(s) of a {cfg.num_epochs}-epoch "
                             "run...\n")
        result = profile_run(cfg, Path(args.out), sample_hz=args.sample_hz,
                             pyspy_rate=args.pyspy_rate if args.pyspy else None)
    for message in result.messages:
        sys.stderr.write(f"rlperf profile: {message}\n")
    if result.returncode != 0:  # no profile: the trainer's own line, and the message above, say why
        if created:
            try:
                Path(args.out).rmdir()  # only if the trainer left nothing in it
            except OSError:
                pass
        return result.returncode
    if args.json:
        with written_whole(args.json) as partial:
            partial.write_text(json.dumps(result.profile, indent=1))
    if not args.quiet:
        from profilers.profile_tables import print_profile

        print_profile(result.profile)
    return result.returncode


def run_against(args: argparse.Namespace, command: list[str]) -> int:
    """`--against REF`: both sides traced in turn, each process a profile of its own, then their diff."""
    from rich.console import Console

    from benches.traced_against import checked_sides, traced_against
    from profilers.profile_run import profile_command, profile_run
    from rlperf.terminal import default_console

    checked_sides(args.against, args.at, args.processes)  # before --out is made
    pyspy_rate = args.pyspy_rate if args.pyspy else None
    if command:
        profile_attached_checks(args)
        config = {"command": command, "attach": not args.no_attach, "warmup_epochs": args.warmup_epochs,
                  "device": args.device}

        def trace_one(tree: Path, directory: Path):
            directory.mkdir(parents=True, exist_ok=True)
            return profile_command(config, directory, sample_hz=args.sample_hz, pyspy_rate=pyspy_rate,
                                   trace_epochs=args.trace_epochs, timeout_s=args.timeout, cwd=tree,
                                   log=directory / "command.log")
    else:
        cfg = _checked_config(args)

        def trace_one(tree: Path, directory: Path):
            return profile_run(cfg, directory, sample_hz=args.sample_hz, pyspy_rate=pyspy_rate, cwd=tree)
    code, found = traced_against(args.against, args.processes, Path(args.out), trace_one,
                                 Console(quiet=True) if args.quiet else default_console(), args.alpha, args.at)
    if found is not None and args.json:
        with written_whole(args.json) as partial:
            partial.write_text(json.dumps(found, indent=1))
    return code
