"""`rlperf profile [train options] --out DIR`: one traced trainer run, with utilization and py-spy around it.

The trainer runs in a child process (`rlperf train --trace-dir DIR --json ...`) and owns its
torch.profiler session; this process samples NVML and the host meanwhile, then merges the samples and
the phase timeline into the trace as tracks on the trace's clock, and summarises the trace.
SPS is not reported: the profiler slows the run it observes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from reference_trainer.cli import config_from_args
from reference_trainer.cli import configure as configure_train
from reference_trainer.config import TrainConfig
from rlperf.errors import BadInput

TRACE_NAME = "trace.json.gz"  # the file name the trainer gives its trace


def configure(parser: argparse.ArgumentParser) -> None:
    configure_train(parser)
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="directory for the trace, its summary, utilization samples and py-spy output")
    parser.add_argument("--sample-hz", type=float, default=20.0,
                        help="NVML / CPU sampling rate (default 20; NVML's own utilization window is 1/6 to 1 s)")
    parser.add_argument("--pyspy", action="store_true",
                        help="run the trainer under py-spy: speedscope JSON and a flame graph SVG in DIR")
    parser.add_argument("--pyspy-rate", type=int, default=100, help="py-spy samples per second (default 100)")


def _checked_config(args: argparse.Namespace) -> TrainConfig:
    if args.trace_dir:
        raise BadInput("trace_dir: set by rlperf profile itself; choose the output with --out")
    if not args.timers:
        raise BadInput("timers: rlperf profile needs the phase timers (they name the trace's ranges); drop --no-timers")
    if not args.sample_hz > 0:
        raise BadInput(f"sample_hz: must be a positive number of samples per second (got {args.sample_hz})")
    if args.pyspy_rate <= 0:
        raise BadInput(f"pyspy_rate: must be a positive number of samples per second (got {args.pyspy_rate})")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"out: {out} exists and is not a directory")
    if (out / TRACE_NAME).exists():
        raise BadInput(f"out: {out} already holds a profile; choose an empty or new directory")
    return dataclasses.replace(config_from_args(args), trace_dir=str(out))


def run(args: argparse.Namespace) -> int:
    from profilers.profile_run import profile_run

    cfg = _checked_config(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if not args.quiet:
        sys.stderr.write(f"rlperf profile: tracing {cfg.trace_epochs} steady epoch(s) of a {cfg.num_epochs}-epoch run...\n")
    result = profile_run(cfg, Path(args.out), sample_hz=args.sample_hz,
                         pyspy_rate=args.pyspy_rate if args.pyspy else None)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result.profile, indent=1))
    if not args.quiet:
        from profilers.render import print_profile

        print_profile(result.profile)
    for message in result.messages:
        sys.stderr.write(f"rlperf profile: {message}\n")
    return result.returncode

