"""The nightly workflow's steps (.github/workflows/nightly-bench.yml), one subcommand each, so the workflow
only calls them and each can be tested without a runner.

    python -m benches.nightly locate                 # DATA and BASELINE lines for $GITHUB_ENV
    python -m benches.nightly check-torch            # this interpreter's torch must see CUDA
    python -m benches.nightly now                    # a start mark in the store's time format
    rlperf runs STORE --latest nightly --since MARK  # (not a step here) the run this job made, never an older one
    python -m benches.nightly check-run --store S --run ID     # complete, every point measured
    python -m benches.nightly compare --data D --run ID --out report
    python -m benches.nightly promote --data D --run ID [--first-night]
    python -m benches.nightly keep-logs --data D --run ID --into report/logs
    python -m benches.nightly gate --status N --step bench=success ...

Exit codes: 0 when the step's check passed, 1 when it did not (with one `::error::` line saying why), 2
for bad arguments. Only `check-torch` and the store commands import torch or pandas, when they run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

from rlperf.layout import STORE_FILE

SUITE = "nightly"
BASELINE_FILE = "baseline"
# Run ids are made by the store (time, suite, random suffix); anything else is refused before it is
# joined into a path, so an empty or odd id can never name the whole data directory.
RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}-[A-Za-z0-9_.-]+")


class StepFailed(Exception):
    """The step's check did not pass; the message says why."""


def data_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get("RLPERF_DATA") or Path.home() / "rlperf-nightly")


def read_baseline(data: Path) -> str | None:
    path = data / BASELINE_FILE
    text = path.read_text().strip() if path.is_file() else ""
    return text or None


def append(path_variable: str, text: str) -> None:
    """Appends to the file a GitHub Actions variable names ($GITHUB_OUTPUT, $GITHUB_STEP_SUMMARY), or to
    stdout outside Actions."""
    path = os.environ.get(path_variable)
    if path:
        with open(path, "a") as file:
            file.write(text)
    else:
        sys.stdout.write(text)


def valid_run_id(text: str) -> str:
    if not RUN_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a run id: {text!r}")
    return text


# ---- steps ---------------------------------------------------------------------------------------------------

def locate(args: argparse.Namespace) -> int:
    data = data_dir(args.data)
    data.mkdir(parents=True, exist_ok=True)
    lines = [f"DATA={data}"]
    baseline = read_baseline(data)
    if baseline:
        lines.append(f"BASELINE={data / STORE_FILE}::{baseline}")
    print("\n".join(lines))
    return 0


def check_torch(args: argparse.Namespace) -> int:
    import torch

    available = torch.cuda.is_available()
    print(f"python {sys.executable}")
    print(f"torch {torch.__version__} from {torch.__file__}")
    print(f"torch.version.cuda {torch.version.cuda}; CUDA available: {available}; "
          f"devices: {torch.cuda.device_count() if available else 0}")
    if not available:
        raise StepFailed(
            "this environment's torch does not see CUDA (torch.version.cuda is "
            f"{torch.version.cuda}): every GPU test would skip and every point be skipped. RLPERF_TORCH=system "
            "makes nox use the system site-packages; a torch installed in another virtualenv is not among them, "
            "and pip then installs a CPU torch of its own")
    return 0


def now(args: argparse.Namespace) -> int:
    from rlperf.store import utc_now

    print(utc_now())
    return 0


def run_problems(store_path: Path, run_id: str, suite_path: str | None = None) -> list[str]:
    """Why a run does not count as a night's measurement: not complete, a point failed, timed out, was
    skipped for any reason but needing more GPUs than the machine has (a multi-GPU point), or is missing."""
    from benches import suite as suites
    from rlperf.store import Store

    with Store.open(store_path, readonly=True) as store:
        store.require_run(run_id)
        run = store.runs().set_index("run_id").loc[run_id]
        points = store.points(run_id)
    problems = []
    if run["status"] != "complete":
        problems.append(f"run {run_id} is {run['status']}, not complete")
    fingerprint = run["fingerprint"]
    # without NVML `gpus` is the reason it is unavailable, and the devices torch saw are the count
    gpus = fingerprint.get("gpus")
    gpus = gpus if isinstance(gpus, list) else fingerprint.get("cuda_devices") or []
    for point in points.itertuples(index=False):
        if point.status in ("failed", "timeout"):
            problems.append(f"{point.point_key}: {point.status}")
        elif point.status == "skipped" and int(point.config.get("world_size", 1)) <= max(1, len(gpus)):
            last = (point.reason or "").strip().splitlines()[-1:] or ["no reason"]
            problems.append(f"{point.point_key}: skipped ({last[0]})")
    suite = suites.load(suite_path or run["suite"])
    if suite.suite_hash != run["suite_hash"]:
        problems.append(f"the suite file changed since run {run_id} (hash {run['suite_hash']}, now {suite.suite_hash})")
    else:
        stored = set(points["point_key"]) if len(points) else set()
        missing = [point.key for point in suite.points if point.key not in stored]
        problems += [f"{key}: missing" for key in missing]
    return problems


def check_run(args: argparse.Namespace) -> int:
    problems = run_problems(args.store, args.run, args.suite)
    if problems:
        raise StepFailed(f"run {args.run} did not measure the whole suite: " + "; ".join(problems))
    print(f"run {args.run}: every point measured")
    return 0


def compare(args: argparse.Namespace) -> int:
    """Renders tonight's report against the machine's baseline and records the comparison's status at
    once, before anything else can fail; then the job summary and the history page."""
    from rlperf.cli import main as rlperf

    data = data_dir(args.data)
    store = data / STORE_FILE
    baseline = read_baseline(data)
    command = ["report", f"{store}::{args.run}", "--out", str(args.out)]
    if baseline:
        command += ["--baseline", f"{store}::{baseline}"]
    status = rlperf(command)
    append("GITHUB_OUTPUT", f"status={status}\n")
    summary = (f"Compared with baseline run {baseline}.\n\n" if baseline else
               "No baseline on this machine yet: this run reports without verdicts.\n\n")
    report_md = args.out / "report.md"
    if report_md.is_file():
        summary += report_md.read_text()
    append("GITHUB_STEP_SUMMARY", summary)
    history = rlperf(["report", "--history", str(store), "--out", str(args.out / "history")])
    if history not in (0, 1):
        raise StepFailed(f"the history page could not be rendered (exit {history})")
    return 0


def promote(args: argparse.Namespace) -> int:
    """Makes a run this machine's baseline: a complete run of the nightly suite that measured every point,
    on this machine as it is now (same GPUs, CPU, torch and CUDA). With --first-night, only when the
    machine has no baseline yet."""
    from rlperf.machine import collect, machine_key
    from rlperf.machine import probe
    from rlperf.store import Store

    data = data_dir(args.data)
    store_path = data / STORE_FILE
    old = read_baseline(data)
    if args.first_night and old:
        print(f"this machine's baseline stays {old}")
        return 0
    if not store_path.is_file():
        raise StepFailed(f"no store at {store_path}")
    with Store.open(store_path, readonly=True) as store:
        store.require_run(args.run)
        run = store.runs().set_index("run_id").loc[args.run]
    if run["suite"] != SUITE:
        raise StepFailed(f"run {args.run} is of suite {run['suite']!r}, not {SUITE!r}: it cannot be the baseline")
    here = machine_key(collect(probe(), ""))
    if run["machine_key"] != here:
        raise StepFailed(f"run {args.run} was measured on another machine or stack (machine key "
                         f"{run['machine_key']}, this machine {here}): it cannot be this machine's baseline")
    problems = run_problems(store_path, args.run, args.suite)
    if problems:
        raise StepFailed(f"run {args.run} cannot be the baseline: " + "; ".join(problems))
    partial = data / f"{BASELINE_FILE}.partial"
    partial.write_text(args.run + "\n")
    partial.replace(data / BASELINE_FILE)
    line = f"Baseline of this machine: {old or 'none'} -> {args.run}\n"
    print(line, end="")
    append("GITHUB_STEP_SUMMARY", line)
    return 0


def keep_logs(args: argparse.Namespace) -> int:
    """Copies the run's directory (its points' logs) next to the report, for the artifact."""
    source = data_dir(args.data) / args.run
    if not source.is_dir():
        raise StepFailed(f"no directory for run {args.run} in {source.parent}")
    shutil.copytree(source, args.into, dirs_exist_ok=True, ignore=shutil.ignore_patterns("report"))
    print(f"kept {source} in {args.into}")
    return 0


STEP_ERRORS = {
    "torch": "the bench environment's torch does not see CUDA",
    "bench": "the sweep itself failed",
    "tonight": "the sweep stored no run tonight",
    "check": "the run did not measure every point",
    "gpu_tests": "a GPU correctness test failed",
}


def gate(args: argparse.Namespace) -> int:
    """The job's verdict from the steps' outcomes and the comparison's status; every reason is named."""
    errors = []
    for item in args.step:
        name, _, outcome = item.partition("=")
        if outcome != "success":
            errors.append(f"{STEP_ERRORS.get(name, name)} ({name}: {outcome or 'did not run'})")
    if args.status == "1":
        errors.append(f"a point regressed against baseline {args.baseline or '?'}: see the job summary")
    elif args.status not in ("0", "1") and args.baseline:
        errors.append(f"the report could not compare the runs (status {args.status or 'not written'})")
    elif args.status not in ("0", "1"):
        errors.append(f"the report could not be rendered (status {args.status or 'not written'})")
    for error in errors:
        print(f"::error::{error}")
    if not errors:
        print("measured every point; no regression")
    return 1 if errors else 0


# ---- command line --------------------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m benches.nightly", description=__doc__.splitlines()[0])
    steps = top.add_subparsers(dest="step", required=True)
    sub = steps.add_parser("locate", help="DATA and BASELINE lines for $GITHUB_ENV")
    sub.add_argument("--data", help="default $RLPERF_DATA, else ~/rlperf-nightly")
    sub.set_defaults(func=locate)
    steps.add_parser("check-torch", help="fail unless this interpreter's torch sees CUDA").set_defaults(func=check_torch)
    steps.add_parser("now", help="the current time as the store writes it").set_defaults(func=now)
    sub = steps.add_parser("check-run", help="fail unless the run is complete with every point measured")
    sub.add_argument("--store", type=Path, required=True)
    sub.add_argument("--run", type=valid_run_id, required=True)
    sub.add_argument("--suite", help="suite name or file (default: the run's suite)")
    sub.set_defaults(func=check_run)
    sub = steps.add_parser("compare", help="report against the baseline; status to $GITHUB_OUTPUT at once")
    sub.add_argument("--data")
    sub.add_argument("--run", type=valid_run_id, required=True)
    sub.add_argument("--out", type=Path, default=Path("report"))
    sub.set_defaults(func=compare)
    sub = steps.add_parser("promote", help="make a run this machine's baseline")
    sub.add_argument("--data")
    sub.add_argument("--run", type=valid_run_id, required=True)
    sub.add_argument("--suite", help="suite name or file to check the run against (default: the run's suite)")
    sub.add_argument("--first-night", action="store_true", help="only when the machine has no baseline yet")
    sub.set_defaults(func=promote)
    sub = steps.add_parser("keep-logs", help="copy the run's logs next to the report")
    sub.add_argument("--data")
    sub.add_argument("--run", type=valid_run_id, required=True)
    sub.add_argument("--into", type=Path, required=True)
    sub.set_defaults(func=keep_logs)
    sub = steps.add_parser("gate", help="fail the job on any failed step, a regression or a refused comparison")
    sub.add_argument("--status", default="", help="the compare step's status output")
    sub.add_argument("--baseline", default="")
    sub.add_argument("--step", action="append", default=[], metavar="NAME=OUTCOME")
    sub.set_defaults(func=gate)
    return top


def main(argv: list[str] | None = None) -> int:
    from rlperf.errors import BadInput

    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except StepFailed as failure:
        print(f"::error::{failure}")
        return 1
    except BadInput as exc:
        print(f"::error::{exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
