"""`rlperf bench --against REF`: the suite measured at REF and at the working tree in alternating processes,
point by point, so that drift and neighbours land on both sides alike (as asv's `continuous` does).

REF is checked out in a temporary git worktree and its trainer runs from there with the same Python, so only
the code differs. Within a pair the order flips (A B, then B A), so neither side always runs second. Both
sides go into the store as runs of their own, REF's first, each naming the other, so `rlperf report` can
judge them again later.

With `until_decided`, pairs are added to each point until its verdict is decided (regressed, improved or
unchanged) or a limit is reached (`max_repeats` pairs, or the point's share of `budget_s`). Looking at the
data more than once needs care: every look is a chance for noise to pass for a change. So looks come only at
a fixed schedule (LOOK_GROWTH times the previous look, from FIRST_LOOK pairs), and each spends part of alpha,
in proportion to the pairs added since the last look: alpha * added / max_repeats. The parts add up to at most
alpha, so by the union bound the chance of any false claim over all looks stays below alpha; the bound ignores
how much consecutive looks share their data, so the true rate is lower still. With several points, each point
gets alpha / points (Bonferroni).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console

from benches import suite as suites
from benches.runner import PointRunner, UtilizationProbe, trainer_command
from reports.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from reports.intervals import fewest_repeats
from reports.verdicts import OUTCOMES, PointVerdict, exit_code, fmt_interval, judge, judge_point
from rlperf.arguments import DEFAULT_BUDGET_S, DEFAULT_MAX_REPEATS
from rlperf.errors import BadInput, output_dir
from rlperf.layout import STORE_FILE
from rlperf.lock import MeasurementLock
from rlperf.machine import REPO_ROOT, Machine, collect, machine_key, probe
from rlperf.store import PointRecord, Store, point_label, utc_now

FIRST_LOOK = 8  # pairs: the fewest at which a completely separated point clears a look's share of alpha
LOOK_GROWTH = 1.4
DECIDED = tuple(outcome for outcome in OUTCOMES if outcome != "inconclusive")


@dataclass
class AgainstOptions:
    suite: str
    ref: str
    out_dir: Path
    repeats: int | None = None  # pairs per point without until_decided
    device: str | None = None
    timeout_s: float | None = None
    sample_hz: float | None = None
    label: str | None = None
    until_decided: bool = False
    max_repeats: int = DEFAULT_MAX_REPEATS
    budget_s: float = DEFAULT_BUDGET_S
    threshold: float = DEFAULT_THRESHOLD
    alpha: float = DEFAULT_ALPHA
    fail_on_inconclusive: bool = False
    wait: bool = True


def looks(max_repeats: int, first: int = FIRST_LOOK) -> list[int]:
    """Pair counts at which the data are judged: `first`, then each about LOOK_GROWTH times the last."""
    schedule = [min(first, max_repeats)]
    while schedule[-1] < max_repeats:
        schedule.append(min(max_repeats, max(schedule[-1] + 1, math.ceil(schedule[-1] * LOOK_GROWTH))))
    return schedule


def look_alphas(max_repeats: int, alpha: float, first: int = FIRST_LOOK) -> dict[int, float]:
    """The part of alpha each look spends: in proportion to the pairs added since the previous look."""
    schedule = looks(max_repeats, first)
    return {n: alpha * (n - previous) / max_repeats for previous, n in zip([0] + schedule, schedule)}


def earliest_look(max_repeats: int, alpha: float) -> int:
    """The fewest pairs at which a first look can decide anything: where completely separated sides clear the
    part of alpha that look spends (alpha * pairs / max_repeats)."""
    for pairs in range(1, max_repeats):
        if fewest_repeats(alpha * pairs / max_repeats) <= pairs:
            return pairs
    return max_repeats


def resolve_commit(ref: str, field: str = "against") -> str:
    """The commit REF names in this repository; bad input, named by `field`, when it names none."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except subprocess.CalledProcessError:
        raise BadInput(f"{field}: {ref!r} is not a commit of the repository at {REPO_ROOT}") from None
    except FileNotFoundError:
        raise BadInput(f"{field}: needs git, which is not installed") from None


def git(*args: str, cwd: Path = REPO_ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """A detached checkout of `commit` in a temporary directory, removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="rlperf-against-"))
    path = parent / "tree"
    try:
        git("worktree", "add", "--detach", str(path), commit)
        yield path
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            git("worktree", "remove", "--force", str(path))
        shutil.rmtree(parent, ignore_errors=True)


def frame(record: PointRecord) -> pd.DataFrame:
    """A point's samples shaped like `Store.samples()`, for judging before they are stored."""
    return pd.DataFrame([{"point_key": record.point_key, "repeat": repeat, "sps": summary["sps"],
                          "phases": summary["phases"], "summary": summary} for repeat, summary in record.samples],
                        columns=["point_key", "repeat", "sps", "phases", "summary"])


def points_and_samples(records: list[PointRecord]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Points and samples frames, shaped like the store's, of one side's records."""
    points = pd.DataFrame([{"point_key": r.point_key, "config": r.config, "status": r.status, "reason": r.reason}
                           for r in records], columns=["point_key", "config", "status", "reason"])
    return points, pd.concat([frame(r) for r in records], ignore_index=True) if records else frame(
        PointRecord("", {}, "ok", "", 0.0))


class Against:
    def __init__(self, options: AgainstOptions, console: Console, machine: Machine | None = None):
        self.options = options
        self.console = console
        self.machine = machine

    def run(self) -> int:
        opts = self.options
        suite = suites.load(opts.suite)
        commit = resolve_commit(opts.ref)
        machine = self.machine or probe()
        overrides = {"device": machine.resolve_device(opts.device)} if opts.device else {}
        if overrides:
            suite = suites.load(opts.suite, overrides)
        current = collect(machine, suite.suite_hash, overrides)
        reference = {**current, "git": {"commit": commit, "dirty": False, "ref": opts.ref}}
        key = machine_key(current)
        output_dir(opts.out_dir, "out")
        store_path = opts.out_dir / STORE_FILE
        with MeasurementLock() as lock, worktree(commit) as tree:
            lock.acquire(opts.wait, lambda text: self.console.print(text, markup=False, soft_wrap=True),
                         suite=suite.name, store=str(store_path.resolve()))
            with Store.open(store_path) as store:
                label = opts.label or f"against {opts.ref}"
                ref_run = store.create_run(suite.name, suite.suite_hash,
                                           {**reference, "against": {"side": "ref", "ref": opts.ref}}, key,
                                           f"{label}: {opts.ref} ({commit[:10]})")
                new_run = store.create_run(suite.name, suite.suite_hash,
                                           {**current, "against": {"side": "working tree", "ref": opts.ref,
                                                                   "ref_run": ref_run}}, key, f"{label}: working tree")
                lock.update(run_id=new_run)
                self.console.print(f"runs {ref_run} ({opts.ref} at {commit[:10]}) and {new_run} (working tree): "
                                   f"suite {suite.name}, {len(suite.points)} points, store {store.path}")
                try:
                    verdicts = self.measure(store, suite, machine, tree, ref_run, new_run)
                except KeyboardInterrupt:
                    for run_id in (ref_run, new_run):
                        store.finish_run(run_id, "interrupted")
                    raise
                for run_id in (ref_run, new_run):
                    store.finish_run(run_id, "complete")
        from reports.cli import print_verdicts
        from reports.render import render
        from reports.rundata import load_run

        print_verdicts(self.console, verdicts)
        report_dir = opts.out_dir / new_run / "report"
        with Store.open(store_path, readonly=True) as store:
            candidate, baseline = load_run(store, new_run), load_run(store, ref_run, "baseline")
        render(candidate, str(report_dir), baseline, opts.threshold, opts.alpha)
        self.console.print(f"report: {report_dir} (the working tree against {opts.ref}); "
                           f"`rlperf report {store_path}::{new_run} --baseline {store_path}::{ref_run}` judges again")
        failed = any(v.status == "failed" for v in verdicts)
        return 1 if failed else exit_code(verdicts, opts.fail_on_inconclusive)

    def measure(self, store: Store, suite: suites.Suite, machine: Machine, tree: Path, ref_run: str,
                new_run: str) -> list[PointVerdict]:
        opts = self.options
        utilization = UtilizationProbe(suite.sample_hz if opts.sample_hz is None else opts.sample_hz)
        timeout = opts.timeout_s or suite.timeout_s
        pairs = opts.max_repeats if opts.until_decided else (opts.repeats or suite.repeats)
        sides = {"ref": PointRunner(opts.out_dir / ref_run, pairs, timeout, utilization, trainer_command, cwd=tree),
                 "new": PointRunner(opts.out_dir / new_run, pairs, timeout, utilization, trainer_command)}
        runnable = [point for point in suite.points if machine.skip_reason(point.config) is None]
        point_alpha = opts.alpha / max(1, len(runnable))
        started = time.monotonic()
        verdicts, measured = [], []
        for index, point in enumerate(suite.points):
            reason = machine.skip_reason(point.config)
            if reason is not None:
                for run_id in (ref_run, new_run):
                    store.record_point(run_id, PointRecord(point.key, point.config, "skipped", utc_now(), 0.0,
                                                           reason=reason))
                self.console.print(f"skipped {point.label}: {reason}")
                continue
            # each point may use an equal share of what is left of the budget
            points_left = max(1, len(runnable) - len(measured))
            deadline = time.monotonic() + (started + opts.budget_s - time.monotonic()) / points_left
            records = {side: PointRecord(point.key, point.config, "ok", utc_now(), 0.0) for side in sides}
            verdict = self.measure_point(index, point, sides, records, machine.gpu_uuids(point.config), pairs,
                                         point_alpha, deadline)
            for side, run_id in (("ref", ref_run), ("new", new_run)):
                store.record_point(run_id, records[side])
            verdicts.append(verdict)
            measured.append(records)
        if opts.until_decided:
            return verdicts
        # a fixed number of pairs: judged together, as the report judges them
        return judge(*(points_and_samples([records[side] for records in measured]) for side in ("new", "ref")),
                     threshold=opts.threshold, alpha=opts.alpha)

    def measure_point(self, index: int, point: suites.Point, sides: dict[str, PointRunner],
                      records: dict[str, PointRecord], gpu_uuids: list[str], pairs: int, point_alpha: float,
                      deadline: float) -> PointVerdict:
        opts = self.options
        # without until_decided nothing is judged here: the points are judged together at the end
        spend = look_alphas(pairs, point_alpha) if opts.until_decided else {}
        pairing = Pairing(sides, opts.threshold, lambda text: self.console.print(text, markup=False, soft_wrap=True))
        return pairing.measure(index, point, records, gpu_uuids, pairs, spend, deadline)


class Pairing:
    """One point measured on two sides, "ref" and "new" (two checkouts), in alternating processes: A B, then
    B A. After each pair whose count has a part of alpha in `spend`, the point is judged (new against ref),
    and a verdict that `decided` accepts (by default regressed, improved or unchanged) ends it; so does the
    deadline, or a repeat that fails."""

    def __init__(self, sides: dict[str, PointRunner], threshold: float, say: Callable[[str], None],
                 names: dict[str, str] | None = None, decided: Callable[[PointVerdict], bool] | None = None):
        self.sides = sides
        self.threshold = threshold
        self.say = say
        self.names = names or {side: side for side in sides}  # how the progress lines call each side
        self.decided = decided or (lambda verdict: verdict.status in DECIDED)

    def measure(self, index: int, point: suites.Point, records: dict[str, PointRecord], gpu_uuids: list[str],
                pairs: int, spend: dict[int, float], deadline: float) -> PointVerdict:
        directories = {side: runner.point_dir(index, point) for side, runner in self.sides.items()}
        for directory in directories.values():
            directory.mkdir(parents=True, exist_ok=True)
        verdict = PointVerdict("", point.label, "inconclusive", "no pair was measured")
        pair_seconds: list[float] = []
        for pair in range(pairs):
            if pair_seconds and time.monotonic() + sum(pair_seconds) / len(pair_seconds) > deadline:
                verdict.reason += f"; stopped at the time budget after {pair} pairs"
                break
            pair_start = time.monotonic()
            for side in (("ref", "new") if pair % 2 == 0 else ("new", "ref")):
                record = records[side]
                t0 = time.monotonic()
                status, reason, summary = self.sides[side].run_repeat(point, pair, directories[side], gpu_uuids,
                                                                      record)
                record.seconds += time.monotonic() - t0
                if status != "ok":
                    record.status, record.reason = status, f"repeat {pair + 1}: {reason}"
                    failed = PointVerdict("", point.label, "failed",
                                          f"{self.names[side]}: {status}: {reason}".splitlines()[0])
                    self.say(f"{point.label}: {failed.reason}")
                    return failed
                record.samples.append((pair, summary))
            pair_seconds.append(time.monotonic() - pair_start)
            alpha = spend.get(pair + 1)
            if alpha is None:
                self.say_pair(point, pair, records)
                continue
            verdict = judge_point(frame(records["new"]), frame(records["ref"]), self.threshold, alpha)
            verdict.point = point_label(point.key)
            self.say_pair(point, pair, records, verdict, alpha)
            if self.decided(verdict):
                break
        return verdict

    def say_pair(self, point: suites.Point, pair: int, records: dict[str, PointRecord],
                 verdict: PointVerdict | None = None, alpha: float | None = None) -> None:
        ref_sps, new_sps = (records[side].samples[-1][1]["sps"] for side in ("ref", "new"))
        text = (f"{point.label} pair {pair + 1}: {self.names['ref']} {ref_sps:,.0f} SPS, "
                f"{self.names['new']} {new_sps:,.0f} SPS")
        if verdict is not None:
            text += f"; look at {1 - alpha:.2%}: {verdict.status}"
            if verdict.sps is not None:
                text += f", change {verdict.sps.relative:+.1%} {fmt_interval(verdict.sps)}"
            if verdict.status == "inconclusive":
                text += f" ({verdict.reason})"
        self.say(text)
