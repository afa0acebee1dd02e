"""The trainer's flags: one per TrainConfig field, so every knob has one definition, and where a run's outputs go.
`rlperf train` and `rlperf profile` take them; profilers/sampler_cost.py reads them."""

from __future__ import annotations

import argparse
import dataclasses

from reference_trainer.config import FIELD_TYPES, TrainConfig, field_help, from_dict, parse_delay


def add_train_flags(parser: argparse.ArgumentParser, omit: tuple[str, ...] = ()) -> None:
    """One flag per TrainConfig field; fields in `omit` get no flag and keep their default."""
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        help_text = field_help(f.name)
        if f.name in omit:
            parser.set_defaults(**{f.name: [] if f.name == "inject_delay" else default})
        elif f.name == "inject_delay":
            parser.add_argument(flag, action="append", default=[], metavar="PHASE=MS", help=help_text)
        elif isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=f"{help_text} (default {'on' if default else 'off'})")
        elif f.name == "trace_dir":
            parser.add_argument(flag, default=default, metavar="DIR", help=help_text)
        else:  # an optional setting's help says what leaving it unset means
            parser.add_argument(flag, type=FIELD_TYPES[f.name], default=default,
                                help=help_text if default is None else f"{help_text} (default {default})")
    parser.add_argument("--json", metavar="PATH",
                        help="write the run's summary here (docs/results-format.md; default: none)")
    parser.add_argument("--save-policy", metavar="PATH", default="",
                        help="save the trained policy's state_dict here (default: not saved)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or table (default: shown)")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}
    values["inject_delay"] = dict(parse_delay(text) for text in args.inject_delay)
    return from_dict(values)
