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

from profilers.profile_run import DEFAULT_SAMPLE_HZ, TRACE_NAME
from reference_trainer.config import TrainConfig
from reference_trainer.flags import add_train_flags, config_from_args
from rlperf.arguments import MAX_SAMPLE_HZ, number_in, positive_int
from rlperf.errors import BadInput, output_dir, output_file, written_whole


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


def _checked_config(args: argparse.Namespace) -> TrainConfig:
    if not args.timers:
        raise BadInput("timers: rlperf profile needs the phase timers (they name the trace's ranges); drop --no-timers")
    cfg = dataclasses.replace(config_from_args(args), trace_dir=str(args.out))
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"out: {out} exists and is not a directory; name a directory")
    if (out / TRACE_NAME).exists():
        raise BadInput(f"out: {out} already holds a profile; choose an empty or new directory")
    if args.json:
        output_file(args.json, "json")
    output_dir(out, "out")
    return cfg


def run(args: argparse.Namespace) -> int:
    from profilers.profile_run import profile_run

    created = not Path(args.out).exists()
    cfg = _checked_config(args)
    if not args.quiet:
        sys.stderr.write(f"rlperf profile: tracing {cfg.trace_epochs} steady epoch(s) of a {cfg.num_epochs}-epoch run...\n")
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

