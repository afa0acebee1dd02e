"""`rlperf collectives`: time all_reduce, all_gather, reduce_scatter and broadcast over a sweep of message sizes.

Under torchrun (or any launcher that sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT) this process is one rank,
and rank 0 prints and stores the results; otherwise it starts `--world-size` rank processes on this machine and
watches them (benches/collectives.py says how each is measured).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from benches.collectives import (BACKENDS, DEFAULT_ITERS, DEFAULT_MIN_BYTES, DEFAULT_RANK_TIMEOUT, DEFAULT_WARMUP,
                                 ELEMENT_BYTES, Settings, run_external_rank, run_launched_rank, run_launcher)
from rlperf.arguments import add_label, non_negative_int, positive_float, positive_int
from rlperf.errors import BadInput
from rlperf.layout import DEFAULT_OUT, STORE_FILE
from rlperf.processes import RANK_DIR_ENV, STARTUP_GRACE_SECONDS

BYTE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def byte_count(text: str) -> int:
    """`1024`, `64K`, `16MiB`, `1G` (binary units) as a number of bytes."""
    found = re.fullmatch(r"\s*(\d+)\s*(?:([kmg])i?)?b?\s*", text, flags=re.IGNORECASE)
    nbytes = int(found[1]) * BYTE_UNITS[(found[2] or "").lower()] if found else 0
    if nbytes < ELEMENT_BYTES:
        raise argparse.ArgumentTypeError(
            f"must be a byte count of at least {ELEMENT_BYTES} (one float32), like 1024, 64K, 16M or 1G (got {text!r})")
    return nbytes


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=positive_int, metavar="N",
                        help="ranks (default: every visible GPU with nccl, 2 with gloo; under torchrun its WORLD_SIZE)")
    parser.add_argument("--backend", choices=BACKENDS,
                        help="nccl on CUDA tensors or gloo on CPU tensors (default: nccl when a GPU is visible)")
    parser.add_argument("--min-bytes", type=byte_count, default=DEFAULT_MIN_BYTES, metavar="B",
                        help=f"smallest message, e.g. 8, 64K, 1M (default {DEFAULT_MIN_BYTES}); sizes double from here")
    parser.add_argument("--max-bytes", type=byte_count, metavar="B",
                        help="largest message (default 1G with nccl, 64M with gloo); capped by free memory")
    parser.add_argument("--iters", type=positive_int, default=DEFAULT_ITERS, metavar="K",
                        help=f"timed iterations per op and size (default {DEFAULT_ITERS})")
    parser.add_argument("--warmup", type=non_negative_int, default=DEFAULT_WARMUP, metavar="W",
                        help=f"untimed iterations before them (default {DEFAULT_WARMUP})")
    parser.add_argument("--rank-timeout", type=positive_float, default=DEFAULT_RANK_TIMEOUT, metavar="S",
                        help="fail when a rank enters no new collective for this long (default "
                             f"{DEFAULT_RANK_TIMEOUT:g}; at least {STARTUP_GRACE_SECONDS:g} while it starts); it "
                             "must exceed the slowest single collective")
    parser.add_argument("--store", type=Path, default=Path(DEFAULT_OUT) / STORE_FILE, metavar="PATH",
                        help=f"results store to add the run to (default {DEFAULT_OUT}/{STORE_FILE})")
    add_label(parser, "none")


def run(args: argparse.Namespace) -> int:
    if args.max_bytes is not None and args.max_bytes < args.min_bytes:
        raise BadInput(f"max_bytes: must be at least --min-bytes ({args.min_bytes}), got {args.max_bytes}")
    asked = Settings(args.world_size, args.backend, args.min_bytes, args.max_bytes, args.iters, args.warmup,
                     args.rank_timeout)
    if RANK_DIR_ENV in os.environ:
        return run_launched_rank(asked)
    if "RANK" in os.environ:
        return run_external_rank(asked, args.store, args.label)
    return run_launcher(asked, args.store, args.label)
