"""`rlperf bench --against REF`: the suite measured at REF and at the working tree in pairs of processes,
point by point, so that drift and neighbours land on both sides alike (as asv's `continuous` does).

REF is checked out in a temporary git worktree and its trainer runs from there with the same Python, so only
the code differs. Inside each pair the order is drawn at random and stored with the samples: under "the change
does nothing to this point" each pair's log ratio is then as likely to lean either way whatever the machine
does, and the paired signed-rank test of decisions/sequential.py is exact. A pair whose processes either one was
contended is left out whole. Both sides go into the store as runs of their own, REF's first, the working tree's
naming REF's, with the design that judges them (`pairing`), so `rlperf report` judges them again the same way.

With `until_decided`, pairs are added to each point until its verdict is decided (regressed, improved,
unchanged or not slower) or a limit is reached (`max_repeats` pairs, or `budget_s` seconds for the point): the
design looks at the pairs at fixed counts and spends alpha over its looks, each point getting alpha / points.
Without it, each point gets the suite's repeats in pairs and one look at the end.
"""

from __future__ import annotations

import contextlib
import math
import random
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
from benches.peaks import fill_missing
from benches.runner import PointRunner, UtilizationProbe, trainer_command
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from decisions.sequential import Design, pairing_entry, pairs_to_decide
from decisions.verdicts import PointVerdict, fmt_interval, is_contended, judge_pair_point
from rlperf.arguments import DEFAULT_BUDGET_S, DEFAULT_MAX_REPEATS
from rlperf.errors import BadInput, output_dir
from rlperf.layout import STORE_FILE
from rlperf.lock import MeasurementLock
from rlperf.machine import REPO_ROOT, Machine, collect, machine_key, probe
from rlperf.store import PointRecord, Store, point_label, utc_now


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


def frames(records: list[PointRecord]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Points and samples frames, shaped like the store's, of one side's records."""
    points = pd.DataFrame([{"point_key": r.point_key, "config": r.config, "status": r.status, "reason": r.reason}
                           for r in records], columns=["point_key", "config", "status", "reason"])
    samples = [frame(r) for r in records]
    return points, pd.concat(samples, ignore_index=True) if samples else frame(PointRecord("", {}, "ok", "", 0.0))


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
        runnable = [point for point in suite.points if machine.skip_reason(point.config) is None]
        design = self.design(len(runnable), suite.repeats)
        with MeasurementLock() as lock, worktree(commit) as tree:
            lock.acquire(opts.wait, lambda text: self.console.print(text, markup=False, soft_wrap=True),
                         suite=suite.name, store=str(store_path.resolve()))
            with Store.open(store_path) as store:
                label = opts.label or f"against {opts.ref}"
                ref_run = store.create_run(suite.name, suite.suite_hash,
                                           {**reference, "against": {"side": "ref", "ref": opts.ref},
                                            **pairing_entry("ref", None, design)}, key,
                                           f"{label}: {opts.ref} ({commit[:10]})")
                new_run = store.create_run(suite.name, suite.suite_hash,
                                           {**current, "against": {"side": "working tree", "ref": opts.ref,
                                                                   "ref_run": ref_run},
                                            **pairing_entry("new", ref_run, design)}, key,
                                           f"{label}: working tree")
                lock.update(run_id=new_run)
                self.console.print(f"runs {ref_run} ({opts.ref} at {commit[:10]}) and {new_run} (working tree): "
                                   f"suite {suite.name}, {len(suite.points)} points, store {store.path}")
                try:
                    verdicts = self.measure(store, suite, machine, tree, ref_run, new_run, design)
                    fill_missing(store, key, new_run, lambda text: self.console.print(text, markup=False,
                                                                                      soft_wrap=True))
                except KeyboardInterrupt:
                    for run_id in (ref_run, new_run):
                        store.finish_run(run_id, "interrupted")
                    raise
                for run_id in (ref_run, new_run):
                    store.finish_run(run_id, "complete")
        from reports.cli import print_verdicts
        from reports.render import render
        from decisions.rundata import load_run

        # the verdicts shown are the report's, judged from the store by the design stored there
        report_dir = opts.out_dir / new_run / "report"
        with Store.open(store_path, readonly=True) as store:
            candidate, baseline = load_run(store, new_run), load_run(store, ref_run, "baseline")
        code, judged, _ = render(candidate, str(report_dir), baseline, opts.threshold, opts.alpha,
                                 fail_on_inconclusive=opts.fail_on_inconclusive)
        print_verdicts(self.console, judged)
        self.console.print(f"report: {report_dir} (the working tree against {opts.ref}); "
                           f"`rlperf report {store_path}::{new_run} --baseline {store_path}::{ref_run}` judges again")
        return 1 if any(v.status == "failed" for v in verdicts) else code

    def design(self, points: int, suite_repeats: int) -> Design:
        """How each point's pairs are judged: alpha / points each (so the chance of any false claim in the
        run stays within alpha), looks up to `max_repeats` pairs with until_decided, else one look after the
        suite's repeats (or --repeats) in pairs."""
        opts = self.options
        alpha = opts.alpha / max(1, points)
        if opts.until_decided:
            return Design.plan(opts.max_repeats, alpha, sides=2, threshold=opts.threshold)
        pairs = opts.repeats or suite_repeats
        return Design((pairs,), alpha, sides=2, threshold=opts.threshold, futility_from=pairs)

    def measure(self, store: Store, suite: suites.Suite, machine: Machine, tree: Path, ref_run: str,
                new_run: str, design: Design) -> list[PointVerdict]:
        opts = self.options
        utilization = UtilizationProbe(suite.sample_hz if opts.sample_hz is None else opts.sample_hz)
        timeout = opts.timeout_s or suite.timeout_s
        sides = {"ref": PointRunner(opts.out_dir / ref_run, design.max_pairs, timeout, utilization,
                                    trainer_command, cwd=tree),
                 "new": PointRunner(opts.out_dir / new_run, design.max_pairs, timeout, utilization,
                                    trainer_command)}
        pairing = Pairing(sides, design, lambda text: self.console.print(text, markup=False, soft_wrap=True))
        if math.isinf(pairing.fewest_decisive()):
            self.console.print(f"note: {design.max_pairs} pairs a point cannot reach alpha {design.alpha:.2g} "
                               f"(alpha / points) with the exact paired test: no claim is possible; "
                               f"--until-decided or more --repeats make one possible")
        verdicts = []
        budget = opts.budget_s if opts.until_decided else math.inf
        for index, point in enumerate(suite.points):
            reason = machine.skip_reason(point.config)
            if reason is not None:
                for run_id in (ref_run, new_run):
                    store.record_point(run_id, PointRecord(point.key, point.config, "skipped", utc_now(), 0.0,
                                                           reason=reason))
                self.console.print(f"skipped {point.label}: {reason}")
                continue
            records = {side: PointRecord(point.key, point.config, "ok", utc_now(), 0.0) for side in sides}
            verdict = pairing.measure(index, point, records, machine.gpu_uuids(point.config),
                                      time.monotonic() + budget)
            for side, run_id in (("ref", ref_run), ("new", new_run)):
                store.record_point(run_id, records[side])
            verdicts.append(verdict)
        return verdicts


class Pairing:
    """One point measured on two sides, "ref" and "new" (two checkouts), in pairs of processes whose order is
    drawn at random. After each pair the point is judged by `design` (new against ref); a decision ends it, and
    so do the design's most pairs, the deadline (then the pairs there are make a final look), or a repeat
    that fails."""

    def __init__(self, sides: dict[str, PointRunner], design: Design | None, say: Callable[[str], None],
                 names: dict[str, str] | None = None, rng: random.Random | None = None):
        self.sides = sides
        self.design = design
        self.say = say
        self.names = names or {side: side for side in sides}  # how the progress lines call each side
        self.rng = rng or random.Random()

    def fewest_decisive(self) -> float:
        """The fewest pairs at which the design could claim anything: inf when its last look cannot."""
        counts = [count for count in self.design.looks if 0.5 ** count <= self.design.side_alpha]
        return counts[0] if counts else math.inf

    def directories(self, index: int, point: suites.Point) -> dict[str, Path]:
        found = {side: runner.point_dir(index, point) for side, runner in self.sides.items()}
        for directory in found.values():
            directory.mkdir(parents=True, exist_ok=True)
        return found

    def run_pair(self, pair: int, point: suites.Point, records: dict[str, PointRecord],
                 directories: dict[str, Path], gpu_uuids: list[str]) -> PointVerdict | None:
        """One process of each side, in an order drawn at random and stored with both samples; a `failed`
        verdict naming the side when a process fails, else None."""
        order = ("ref", "new") if self.rng.random() < 0.5 else ("new", "ref")
        for side in order:
            record = records[side]
            t0 = time.monotonic()
            status, reason, summary = self.sides[side].run_repeat(point, pair, directories[side], gpu_uuids, record)
            record.seconds += time.monotonic() - t0
            if status != "ok":
                record.status, record.reason = status, f"repeat {pair + 1}: {reason}"
                failed = PointVerdict("", point.label, "failed",
                                      f"{self.names[side]}: {status}: {reason}".splitlines()[0])
                self.say(f"{point.label}: {failed.reason}")
                return failed
            summary["pair"] = {"index": pair, "first": order[0]}
            record.samples.append((pair, summary))
        return None

    def measure(self, index: int, point: suites.Point, records: dict[str, PointRecord], gpu_uuids: list[str],
                deadline: float) -> PointVerdict:
        directories = self.directories(index, point)
        pair_seconds: list[float] = []
        warned = False
        for pair in range(self.design.max_pairs):
            if pair_seconds and time.monotonic() + sum(pair_seconds) / len(pair_seconds) > deadline:
                verdict = self.judge(point, records, ended=True)
                verdict.reason = f"stopped at the time budget after {pair} pairs; " + verdict.reason
                return verdict
            pair_start = time.monotonic()
            failed = self.run_pair(pair, point, records, directories, gpu_uuids)
            if failed is not None:
                return failed
            pair_seconds.append(time.monotonic() - pair_start)
            verdict = self.judge(point, records, ended=False)
            self.say_pair(point, pair, records, verdict)
            if verdict.decision.stopped:
                return verdict
            if not warned and verdict.decision.pairs >= self.design.looks[0]:
                warned = self.warn_budget(point, verdict, deadline, sum(pair_seconds) / len(pair_seconds))
        return self.judge(point, records, ended=True)

    def judge(self, point: suites.Point, records: dict[str, PointRecord], ended: bool) -> PointVerdict:
        verdict = judge_pair_point(frame(records["new"]), frame(records["ref"]), self.design, ended=ended)
        verdict.point = point_label(point.key)
        return verdict

    def warn_budget(self, point: suites.Point, verdict: PointVerdict, deadline: float, pair_s: float) -> bool:
        """Says once, at the first look, when the budget is unlikely to reach a decision at the noise measured."""
        decision = verdict.decision
        needed = pairs_to_decide(decision.spread, math.log1p(decision.naive), self.design)
        affordable = decision.pairs + max(0, int((deadline - time.monotonic()) / pair_s))
        if needed is None or needed <= min(affordable, self.design.max_pairs):
            return False
        self.say(f"{point.label}: at the pair spread measured ({decision.spread:.1%}) and a change of "
                 f"{decision.naive:+.1%}, deciding likely needs about {needed} quiet pairs (~{needed * pair_s:.0f} s "
                 f"at {pair_s:.0f} s a pair); the budget and --max-repeats allow {min(affordable, self.design.max_pairs)}: "
                 f"it will likely end inconclusive (raise --budget-s or --max-repeats, or the threshold)")
        return True

    def say_pair(self, point: suites.Point, pair: int, records: dict[str, PointRecord],
                 verdict: PointVerdict) -> None:
        ref_sps, new_sps = (records[side].samples[-1][1]["sps"] for side in ("ref", "new"))
        first = records["new"].samples[-1][1]["pair"]["first"]
        text = (f"{point.label} pair {pair + 1}: {self.names['ref']} {ref_sps:,.0f} SPS, "
                f"{self.names['new']} {new_sps:,.0f} SPS ({self.names[first]} first)")
        contended = pair_contention(records, -1, self.names)
        if contended:
            text += f"; {contended}, left out"
        decision = verdict.decision
        if decision.pairs in self.design.looks or decision.stopped:
            text += f"; look at {decision.pairs} quiet pairs: {verdict.status}"
            if verdict.sps is not None and decision.stopped:
                text += f", change {verdict.sps.relative:+.1%} {fmt_interval(verdict.sps)}"
        self.say(text)


def pair_contention(records: dict[str, PointRecord], pair: int, names: dict[str, str]) -> str:
    """`contended (NAME: why; ...)` for a pair (an index into both sides' samples) whose machine was busy, or ''."""
    whys = [f"{names[side]}: {summary['interference']['why']}"
            for side, (_, summary) in ((side, records[side].samples[pair]) for side in ("ref", "new"))
            if is_contended(summary)]
    return f"contended ({'; '.join(whys)})" if whys else ""

