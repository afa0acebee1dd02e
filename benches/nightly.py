"""The nightly workflow's steps (.github/workflows/nightly-bench.yml), one subcommand each, so the workflow
only calls them and each can be tested without a runner (docs/gate.md#nightly-workflow-on-a-self-hosted-gpu-runner).

Exit codes: 0 when the step's check passed, 1 when it did not (with one `::error::` line saying why), 2
for bad arguments. Only `check-torch` and the store commands import torch or pandas, when they run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from rlperf.errors import written_whole
from rlperf.layout import STORE_FILE

SUITE = "nightly"
BASELINE_FILE = "baseline"  # this machine's last good commit
# Run ids are made by the store (time, suite, random suffix); anything else is refused before it is
# joined into a path, so an empty or odd id can never name the whole data directory.
RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}-[A-Za-z0-9_.-]+")


class StepFailed(Exception):
    """The step's check did not pass; the message says why."""


def data_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get("RLPERF_DATA") or Path.home() / "rlperf-nightly")


def read_baseline(data: Path) -> str | None:
    """The machine's baseline commit. A file written before baselines were commits names a run: its commit."""
    path = data / BASELINE_FILE
    text = path.read_text().strip() if path.is_file() else ""
    if RUN_ID.fullmatch(text) and (data / STORE_FILE).is_file():
        from rlperf.store import Store

        with Store.open(data / STORE_FILE, readonly=True) as store:
            runs = store.runs().set_index("run_id")
        text = str(runs["git_commit"].get(text) or "")
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
        lines.append(f"BASELINE={baseline}")
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


def read_summary(path: Path) -> dict:
    import json

    try:
        summary = json.loads(path.read_text())
        valid_run_id(summary["runs"]["screen_new"])
        return summary
    except (OSError, ValueError, KeyError, TypeError, argparse.ArgumentTypeError) as exc:
        raise StepFailed(f"the gate left no readable summary at {path} ({exc})") from None


def publish(args: argparse.Namespace) -> int:
    """Records the gate's exit code at once, before anything else can fail; then the job summary (the gate's
    report.md) and the history page beside the report."""
    summary = read_summary(args.summary)
    append("GITHUB_OUTPUT", f"status={summary['exit_code']}\nrun_id={summary['runs']['screen_new']}\n")
    report_md = Path(summary["report"]) / "report.md"
    text = f"{summary['conclusion']}\n\n" + (report_md.read_text() if report_md.is_file() else "")
    append("GITHUB_STEP_SUMMARY", text)
    shutil.copytree(summary["report"], args.out, dirs_exist_ok=True)
    store = data_dir(args.data) / STORE_FILE
    history = subprocess.run([sys.executable, "-m", "rlperf", "report", "--history", str(store),
                              "--out", str(args.out / "history")]).returncode
    if history not in (0, 1):
        raise StepFailed(f"the history page could not be rendered (exit {history})")
    return 0


def promote(args: argparse.Namespace) -> int:
    """Makes a commit this machine's baseline. With --first-night, only when the machine has none yet; with
    --summary, only when that gate's night passed: a night that regressed, or could not measure or decide a
    point, is never a baseline."""
    from benches.worktrees import resolve_commit

    if args.summary is not None:
        summary = read_summary(args.summary)
        if summary.get("exit_code") != 0:
            raise StepFailed(f"not promoted: the night did not pass (exit {summary.get('exit_code')}): "
                             f"{summary.get('conclusion', '')}")
    data = data_dir(args.data)
    old = read_baseline(data)
    if args.first_night and old:
        print(f"this machine's baseline stays {old}")
        return 0
    commit = resolve_commit(args.commit, "commit")
    data.mkdir(parents=True, exist_ok=True)
    with written_whole(data / BASELINE_FILE) as partial:
        partial.write_text(commit + "\n")
    line = f"Baseline of this machine: {old or 'none'} -> {commit}\n"
    print(line, end="")
    append("GITHUB_STEP_SUMMARY", line)
    return 0


def keep_logs(args: argparse.Namespace) -> int:
    """Copies the gate's runs' directories (their points' logs) next to the report, for the artifact."""
    summary = read_summary(args.summary)
    for name, run_id in summary["runs"].items():
        if not RUN_ID.fullmatch(str(run_id)):
            raise StepFailed(f"the gate's summary names {run_id!r} as its {name} run, which is no run id")
        source = data_dir(args.data) / run_id
        if not source.is_dir():
            raise StepFailed(f"no directory for run {run_id} in {source.parent}")
        shutil.copytree(source, args.into / name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("report"))
        print(f"kept {source} in {args.into / name}")
    return 0


STEP_ERRORS = {
    "torch": "the bench environment's torch does not see CUDA",
    "publish": "the gate left no outcome to publish",
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
    elif args.status == "3":
        errors.append("the gate could not measure or decide every point (a process failed, too few quiet pairs, "
                      "or the night ended before a suspect was decided): see the job summary")
    elif args.status != "0":
        errors.append(f"the gate did not finish (status {args.status or 'not written'})")
    for error in errors:
        print(f"::error::{error}")
    if not errors:
        print("measured every point; no regression")
    return 1 if errors else 0


# ---- command line --------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m benches.nightly", description=__doc__.splitlines()[0])
    steps = top.add_subparsers(dest="step", required=True)
    sub = steps.add_parser("locate", help="DATA and BASELINE lines for $GITHUB_ENV")
    sub.add_argument("--data", help="default $RLPERF_DATA, else ~/rlperf-nightly")
    sub.set_defaults(func=locate)
    steps.add_parser("check-torch", help="fail unless this interpreter's torch sees CUDA").set_defaults(func=check_torch)
    sub = steps.add_parser("check-run", help="fail unless the run is complete with every point measured")
    sub.add_argument("--store", type=Path, required=True)
    sub.add_argument("--run", type=valid_run_id, required=True)
    sub.add_argument("--suite", help="suite name or file (default: the run's suite)")
    sub.set_defaults(func=check_run)
    sub = steps.add_parser("publish", help="the gate's status to $GITHUB_OUTPUT at once, then job summary, history")
    sub.add_argument("--data")
    sub.add_argument("--summary", type=Path, required=True, help="the gate's --summary file")
    sub.add_argument("--out", type=Path, default=Path("report"))
    sub.set_defaults(func=publish)
    sub = steps.add_parser("promote", help="make a commit this machine's baseline")
    sub.add_argument("--data")
    sub.add_argument("--commit", required=True, help="a commit (any git ref) of this repository")
    sub.add_argument("--first-night", action="store_true", help="only when the machine has no baseline yet")
    sub.add_argument("--summary", type=Path, help="the gate's --summary file: promote only when its night passed")
    sub.set_defaults(func=promote)
    sub = steps.add_parser("keep-logs", help="copy the gate's runs' logs next to the report")
    sub.add_argument("--data")
    sub.add_argument("--summary", type=Path, required=True, help="the gate's --summary file")
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

    args = build_parser().parse_args(argv)
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
