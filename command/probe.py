"""`rlperf probe`: this machine's peaks, measured here rather than looked up (benches/peak_probe.py says how)."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

from benches.peak_probe import TIMINGS, ProbeFailed, busy_note, measure, run_needs, watched
from rlperf import peaks
from rlperf.arguments import device_choice, positive_int
from rlperf.errors import BadInput


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", type=device_choice,
                        help="cpu, cuda, cuda:N, or auto (the first GPU when there is one) (default auto)")
    parser.add_argument("--threads", type=positive_int, metavar="N",
                        help="CPU threads to measure with (default: the trainer's, one per usable core)")
    parser.add_argument("--store", type=Path, metavar="PATH",
                        help="also store the peaks under this machine's key, with the kernels its runs there "
                             "computed (default: print only)")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write the measured rows as JSON (default: none)")


def run(args: argparse.Namespace) -> int:
    from rlperf.errors import output_file, written_whole
    from rlperf.machine import collect, machine_key, probe
    from rlperf.store import Store
    from rlperf.terminal import default_console

    machine = probe()
    device = machine.resolve_device(args.device)
    refusal = machine.skip_reason({"device": device, "world_size": 1, "dtype": "fp32"})
    if refusal:
        raise BadInput(f"device: {refusal}")
    if device != "cpu" and args.threads:
        raise BadInput("threads: applies to device=cpu only (a GPU's peaks do not depend on host threads)")
    if args.json:
        output_file(args.json, "json")
    index = int(device.partition(":")[2] or 0)
    device_name = "cpu" if device == "cpu" else machine.gpus[index]["name"]
    threads = args.threads or (default_threads() if device == "cpu" else 0)
    dtypes = ["float32"] + (["bfloat16"] if device == "cpu" or machine.gpus[index]["bf16"] else []) \
        + ([] if device == "cpu" else ["float16"])
    needs = peaks.roof_needs(device, device_name, threads, dtypes)
    key = machine_key(collect(machine, ""))
    console = default_console()
    # a bad store is refused before anything is measured
    with Store.open(args.store) if args.store else contextlib.nullcontext() as store:
        if store is not None:
            runs = store.runs()
            mine = runs.loc[runs["machine_key"] == key, "run_id"]
            needs = peaks.unique(needs + run_needs(store, mine))
        with console.status(f"measuring {len(needs)} peaks on {device_name}"):
            try:
                rows, account = watched(lambda: measure(needs))
            except ProbeFailed as failure:
                if store is not None and failure.rows:
                    store.add_peaks(key, failure.rows)
                raise
        if store is not None:
            store.add_peaks(key, rows)
    if args.json:
        with written_whole(args.json) as partial:
            partial.write_text(json.dumps(rows, indent=1))
    show(console, rows, device_name, threads, key, args.store)
    if account["contended"]:
        console.print("warning" + busy_note(account, args.store), markup=False, soft_wrap=True)
    return 0


def default_threads() -> int:
    """The trainer's default: torch's (one per physical core), capped by the cores this process may use."""
    import torch

    from rlperf.cpus import usable_cores

    return min(torch.get_num_threads(), usable_cores())


def show(console, rows: list[dict[str, Any]], device_name: str, threads: int, key: str, store: Path | None) -> None:
    from rich.table import Table

    from reports.formatting import fmt_method, fmt_peak, fmt_rate, fmt_rate_range

    where = f"{threads} threads" if device_name == "cpu" else device_name
    table = Table(title=f"peaks of {where}, machine key {key}: fastest of {TIMINGS} timings")
    for column in ("what", "dtype", "rate", "timings (min – max)", "how"):
        table.add_column(column)
    for row in rows:
        table.add_row(fmt_peak(row), row["dtype"] or "–", fmt_rate(row["value"], row["unit"]),
                      fmt_rate_range(row["samples"], row["unit"]),
                      fmt_method(row["method"]))
    console.print(table)
    console.print("The matrix-product peak is the fastest of these products; memory counts a large copy's reads "
                  "and writes; a tiny op is one add of one element (its fixed cost). "
                  + (f"Stored in {store}." if store else "Not stored (--store PATH keeps them)."), soft_wrap=True)
