"""`rlperf` console script: one subcommand per tool, each in command/<name>.py.

Subcommand modules are imported only when chosen, so `rlperf report` never pays for importing torch.
Each provides `configure(parser)` and `run(args) -> int`, and calls the work of the folders below. `python -m rlperf`
runs this too (rlperf/__main__.py): trainer processes, torchrun and older checkouts start `-m rlperf`.
"""

from __future__ import annotations

import argparse
import importlib
import sqlite3
import sys
from collections.abc import Iterable

from rlperf.errors import BadInput, MachineFault, fault, is_machine_fault

SUBCOMMANDS = {
    "train": ("command.train", "train PPO+LSTM and print a per-phase time breakdown"),
    "selfcheck": ("command.selfcheck", "check that injected delays land in the right phase"),
    "bench": ("command.bench", "run a sweep suite in isolated processes and store every sample"),
    "bisect": ("command.bisect", "find the first commit between GOOD and BAD at which a point got slower"),
    "gate": ("command.gate", "did any point of a suite get slower than at a baseline commit? both measured now"),
    "confirm": ("command.confirm", "measure the commits either side of each change point again, in pairs"),
    "collectives": ("command.collectives", "measure all_reduce / all_gather / reduce_scatter / broadcast"),
    "report": ("command.report", "render a report and regression verdicts from stored results"),
    "compare": ("command.compare", "compare two machines' results side by side"),
    "runs": ("command.runs", "list a store's runs, or print the newest run id of a suite"),
    "attach": ("command.attach", "time an unedited training command by phase: env, acting, training, learn, other"),
    "profile": ("command.profile", "run the trainer under torch.profiler, NVML sampling and py-spy"),
    "diff": ("command.diff", "the traced diff of two profile directories: phases, then operators and kernels, "
                             "beyond each side's process spread"),
    "probe": ("command.probe", "measure this machine's peaks: matrix products, memory and copy bandwidth, one op's cost"),
    "doctor": ("command.doctor", "is this GPU machine ready to be a benchmark runner? its GPU tests, smoke, a trace "
                                 "and a small night"),
}


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments print one line and exit 2, without the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def build_parser(configured: Iterable[str] = ()) -> OneLineParser:
    """Every subcommand is listed; only those in `configured` import their module and take their flags."""
    parser = OneLineParser(prog="rlperf", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name in configured:
            importlib.import_module(module_name).configure(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[:1] if argv and argv[0] in SUBCOMMANDS else ())
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except BadInput as exc:
        sys.stderr.write(f"rlperf {args.command}: error: {exc}\n")
        return 2
    except MachineFault as exc:
        sys.stderr.write(f"rlperf {args.command}: error: {exc}\n")
        return 1
    except (OSError, sqlite3.OperationalError) as exc:
        # A write the machine refused where no command mapped it itself: still one line, not a traceback.
        if not is_machine_fault(exc):
            raise
        sys.stderr.write(f"rlperf {args.command}: error: {fault(None, exc)}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"rlperf {args.command}: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
