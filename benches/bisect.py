"""The search of `rlperf bisect`: the first commit between GOOD and BAD at which one point runs slower than at GOOD.

A binary search over BAD's first-parent chain, each probed commit measured against GOOD in pairs by a one-sided
sequential design; BAD first, its slowdown setting the threshold for the rest (docs/gate.md, `rlperf bisect`).
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from benches import suite as suites
from benches.pairing import Pairing
from benches.options import ProcessOptions
from benches.runner import Launcher, PointRunner, UtilizationProbe, trainer_command
from benches.traced_against import follow_up
from benches.worktrees import git, resolve_commit, worktree
from decisions.criteria import DEFAULT_THRESHOLD
from decisions.sequential import Design, pairing_entry
from decisions.verdicts import PointVerdict
from rlperf.errors import BadInput, output_dir, output_file, written_whole
from rlperf.layout import STORE_FILE
from rlperf.lock import MeasurementLock
from rlperf.machine import Machine, collect, commit_state, machine_key, measured_repository, probe
from rlperf.store import PointRecord, Store, canonical_json, utc_now
from rlperf.terminal import say_on

SHORT = 7  # characters of a commit hash shown
GOOD, BAD, SKIP = "good", "bad", "skip"
GOOD_FAILS = "good fails"  # GOOD's own processes failed: no commit can be judged against it


# ---- the search, apart from any measuring -------------------------------------------------------------------

class Search:
    """Binary search for the first bad commit among `count` commits, oldest first, the last being BAD; GOOD
    lies before the first. BAD is probed first. Each probe is marked good, bad or skip."""

    def __init__(self, count: int):
        if count < 1:
            raise ValueError("a search needs at least one commit after GOOD")
        self.marks: list[str | None] = [None] * count

    @property
    def last_good(self) -> int:
        """Index of the newest commit known good; -1 is GOOD itself."""
        return max((i for i, mark in enumerate(self.marks) if mark == GOOD), default=-1)

    @property
    def first_bad(self) -> int | None:
        """Index of the oldest commit known bad; None while BAD is not shown bad."""
        return min((i for i, mark in enumerate(self.marks) if mark == BAD), default=None)

    def untried(self) -> list[int]:
        """The commits still worth probing: untried ones between the newest good and the oldest bad."""
        if self.first_bad is None:
            return []
        return [i for i in range(self.last_good + 1, self.first_bad) if self.marks[i] is None]

    def next_probe(self) -> int | None:
        """The commit to measure next, or None when the search is over."""
        if self.marks[-1] is None:
            return len(self.marks) - 1
        candidates = self.untried()
        if not candidates:
            return None
        middle = (self.last_good + self.first_bad) / 2
        return min(candidates, key=lambda i: (abs(i - middle), i))

    def mark(self, index: int, outcome: str) -> None:
        if outcome not in (GOOD, BAD, SKIP):
            raise ValueError(f"outcome must be good, bad or skip, not {outcome!r}")
        self.marks[index] = outcome

    def steps_left(self) -> int:
        """About how many more probes the search needs, if none is skipped."""
        return math.ceil(math.log2(len(self.untried()) + 1))

    def suspects(self) -> list[int]:
        """Once the search is over: the commits that may be the first bad one. One when it is named; the
        skipped commits before the oldest bad one, and that one, when skips hide it; none when BAD is not bad."""
        if self.first_bad is None:
            return []
        between = range(self.last_good + 1, self.first_bad)
        return [i for i in between if self.marks[i] == SKIP] + [self.first_bad]


# ---- commits ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:SHORT]

    def __str__(self) -> str:
        return f"{self.short} {json.dumps(self.subject, ensure_ascii=False)}"


def commit_info(sha: str) -> Commit:
    return Commit(sha, git("show", "-s", "--format=%s", sha))


def commits_between(good: str, bad: str) -> list[Commit]:
    """The commits after GOOD up to BAD on BAD's first-parent chain, oldest first, kept to GOOD's descendants."""
    descendants = set(git("rev-list", "--ancestry-path", f"{good}..{bad}").split())
    chain = []
    for line in git("log", "--first-parent", "--format=%H%x1f%s", f"{good}..{bad}").splitlines():
        sha, _, subject = line.partition("\x1f")
        if sha not in descendants:
            break  # the chain has left GOOD's descendants: nothing older descends from GOOD either
        chain.append(Commit(sha, subject))
    return chain[::-1]


def is_ancestor(older: str, newer: str) -> bool:
    return subprocess.run(["git", "merge-base", "--is-ancestor", older, newer], cwd=measured_repository(),
                          capture_output=True).returncode == 0


def tracked_changes() -> list[str]:
    return git("status", "--porcelain", "--untracked-files=no").splitlines()


def choose_point(suite: suites.Suite, wanted: str | None) -> suites.Point:
    """The suite's only point, or the one `wanted` names: its key as stored (JSON of its swept values, in any
    key order or spacing) or its label, as the bench prints it."""
    keys = ", ".join(point.key for point in suite.points)
    if wanted is None:
        if len(suite.points) == 1:
            return suite.points[0]
        raise BadInput(f"point: suite {suite.name} has {len(suite.points)} points; name one with --point "
                       f"(its key as stored: {keys})")
    try:
        key = canonical_json(json.loads(wanted))
    except ValueError:
        key = None
    for point in suite.points:
        if point.key == key or point.label == wanted:
            return point
    raise BadInput(f"point: {wanted!r} is not a point of suite {suite.name} (allowed: {keys})")


# ---- measuring ----------------------------------------------------------------------------------------------

@dataclass
class Step:
    """One measured commit, as the progress lines and the --json file tell it."""

    step: int
    commit: str
    subject: str
    role: str  # "bad end" (BAD, measured first) or "probe"
    verdict: str = "inconclusive"  # regressed, improved, unchanged, inconclusive or failed
    outcome: str = SKIP
    estimate: float | None = None  # relative change of steady SPS against GOOD
    interval: list[float | None] | None = None  # [low, high]; None for a bound no number of pairs reached
    threshold: float | None = None
    pairs: int = 0
    seconds: float = 0.0
    reason: str = ""
    good_run: str = ""
    run: str = ""


def change_text(step: Step) -> str:
    """`-12.6% [-22.8%, -1.2%]`: the change against GOOD and its interval, as verdicts print them."""
    if step.estimate is None:
        return ""
    low, high = step.interval or (None, None)
    low_text = "−∞" if low is None else f"{low:+.1%}"
    high_text = "+∞" if high is None else f"{high:+.1%}"
    return f"{step.estimate:+.1%} [{low_text}, {high_text}]"


def outcome_of(verdict: PointVerdict) -> str:
    """Bad, good or skip, from a commit's verdict against GOOD by a one-sided design: regressed is bad; not
    slower (or unchanged) is good, the commit shown not slower than GOOD by the threshold, which is all a search
    asks; anything else is skipped."""
    if verdict.status == "regressed":
        return BAD
    if verdict.status in ("not slower", "unchanged"):
        return GOOD
    return SKIP


def step_design(max_repeats: int, alpha: float, threshold: float) -> Design:
    """One commit's pairs against GOOD: one-sided (is it slower?), alpha over every look of that commit."""
    return Design.plan(max_repeats, alpha, sides=1, threshold=threshold)


def midpoint_threshold(estimate: float) -> float:
    """The threshold halfway, on a log scale, between no change and a change of `estimate` (negative)."""
    return max(DEFAULT_THRESHOLD, 1 - math.sqrt(1 + estimate))


class Bisect:
    """The search between commits `good` and `bad` (any git refs) for one point of `options.suite` (the one
    `point` names, by key or label); with `json_path`, the whole search also written there after every step.
    `options.threshold` None: DEFAULT_THRESHOLD for BAD, then the midpoint of BAD's slowdown."""

    def __init__(self, options: ProcessOptions, good: str, bad: str, console: Console, point: str | None = None,
                 json_path: Path | None = None, machine: Machine | None = None):
        self.options = options
        self.good_ref = good
        self.bad_ref = bad
        self.wanted_point = point
        self.json_path = json_path
        self.console = console
        self.say = say_on(self.console)
        self.machine = machine
        self.steps: list[Step] = []
        self.record: dict[str, Any] = {}

    def check(self) -> tuple[suites.Suite, suites.Point, Commit, Commit, list[Commit]]:
        """Every input check, before anything is measured: each failure is one line, exit 2."""
        opts = self.options
        suite = suites.load(opts.suite)
        suite.refuse_against("bisect, which compares commits")
        point = choose_point(suite, self.wanted_point)
        good = commit_info(resolve_commit(self.good_ref, "good"))
        bad = commit_info(resolve_commit(self.bad_ref, "bad"))
        if good.sha == bad.sha:
            raise BadInput(f"bad: {self.bad_ref!r} is the same commit as good ({good.short}); nothing lies "
                           "between them")
        if not is_ancestor(good.sha, bad.sha):
            raise BadInput(f"good: {self.good_ref!r} ({good.short}) is not an ancestor of bad {self.bad_ref!r} "
                           f"({bad.short}); give a GOOD older than BAD on its history")
        changed = tracked_changes()
        if changed:
            raise BadInput(f"working tree: {measured_repository()} has uncommitted changes to {len(changed)} tracked files "
                           f"({changed[0].strip()}, ...); commit or set them aside first: the suite and the "
                           "harness are read from it, and the search must be repeatable")
        if self.json_path is not None:
            output_file(self.json_path, "json")
        return suite, point, good, bad, commits_between(good.sha, bad.sha)

    def run(self) -> int:
        opts = self.options
        suite, point, good, bad, commits = self.check()
        self.point = point
        output_dir(opts.out_dir, "out")
        store_path = opts.out_dir / STORE_FILE
        # from the probe on, under the machine's lock: the probe is work on the machine too
        with MeasurementLock() as lock:
            lock.acquire(opts.wait, self.say, suite=suite.name, store=str(store_path.resolve()))
            machine = self.machine or probe()
            suite, overrides = opts.suite_on(machine)
            point = next(p for p in suite.points if p.key == point.key)
            reason = machine.skip_reason(point.config)
            if reason is not None:
                raise BadInput(f"point: this machine cannot run {point.label}: {reason}")
            current = collect(machine, suite.suite_hash, overrides)
            self.record = {"good": {"ref": self.good_ref, "commit": good.sha, "subject": good.subject},
                           "bad": {"ref": self.bad_ref, "commit": bad.sha, "subject": bad.subject},
                           "order": "first-parent", "commits": [asdict(c) for c in commits],
                           "suite": suite.name, "point": point.key, "alpha": opts.alpha,
                           "max_repeats": opts.max_repeats, "budget_s": opts.budget_s, "store": str(store_path),
                           "steps": [], "first_bad": None, "status": "running", "conclusion": ""}
            search = Search(len(commits))
            threshold = opts.threshold or DEFAULT_THRESHOLD
            with worktree(good.sha, self.say) as good_tree, Store.open(store_path) as store:
                self.say(f"bisect: {len(commits)} commits after {good} (good) up to {bad.short} (bad), BAD's "
                         f"first-parent chain; point {point.label} of suite {suite.name}; store {store.path}")
                measure = Measure(self, store, suite, point, machine, current, good, bad, good_tree)
                try:
                    while (probe_index := search.next_probe()) is not None:
                        commit = commits[probe_index]
                        role = "probe" if self.steps else "bad end"
                        plan = ("bad end, measured first: is it slower than GOOD?" if role == "bad end" else
                                f"{len(search.untried())} commits left, about {search.steps_left()} steps")
                        self.say(f"step {len(self.steps) + 1}: {commit} ({plan})")
                        step = measure.step(len(self.steps) + 1, commit, role, threshold)
                        self.steps.append(step)
                        if step.outcome == GOOD_FAILS:
                            return self.conclude("good fails", 1, f"no first bad commit: GOOD {good.short} fails "
                                                                  f"to run: {step.reason}")
                        search.mark(probe_index, step.outcome)
                        self.say_step(step)
                        if role == "bad end" and step.outcome == BAD and opts.threshold is None:
                            threshold = midpoint_threshold(step.estimate)
                            self.say(f"threshold for the other commits: {threshold:.1%}, halfway (as a ratio) "
                                     f"from GOOD to BAD's {step.estimate:+.1%}")
                        self.write_json()
                except KeyboardInterrupt:
                    self.record["status"] = "interrupted"
                    self.write_json()
                    raise
        return self.conclude_search(search, commits, bad)

    def say_step(self, step: Step) -> None:
        change = change_text(step)
        text = f"step {step.step}: {step.commit[:SHORT]} {step.verdict}"
        text += f" {change}" if change else ""
        text += f" after {step.pairs} pairs, {step.seconds:.0f} s: "
        if step.outcome == GOOD and step.verdict == "inconclusive":
            text += f"good (not slower by {step.threshold:.1%}: the interval lies above -{step.threshold:.1%})"
        else:
            text += {GOOD: "good", BAD: "bad"}.get(step.outcome, f"skipped ({step.reason})")
        self.say(text)

    def conclude_search(self, search: Search, commits: list[Commit], bad: Commit) -> int:
        suspects = search.suspects()
        if not suspects:
            bad_end = self.steps[0]
            if bad_end.outcome == GOOD:
                why = f"is not slower than GOOD ({bad_end.verdict} {change_text(bad_end)})"
            else:
                why = f"could not be shown slower than GOOD ({bad_end.verdict}: {bad_end.reason})"
            return self.conclude("bad not slower", 1, f"no first bad commit: BAD {bad.short} {why}")
        if len(suspects) > 1:
            skipped = ", ".join(commits[i].short for i in suspects[:-1])
            return self.conclude("undecided", 1, f"no first bad commit named: it is one of {skipped} (skipped) or "
                                                 f"{commits[suspects[-1]].short} (bad), in {len(self.steps)} steps")
        first = commits[suspects[0]]
        step = next(s for s in self.steps if s.commit == first.sha)
        self.record["first_bad"] = {"commit": first.sha, "subject": first.subject, "estimate": step.estimate,
                                    "interval": step.interval, "step": step.step}
        code = self.conclude("found", 0, f"first bad commit: {first} {change_text(step)}")
        follow_up(self.say, self.point.config, f"{first.short}~1", first.short,
                  str(self.options.out_dir / f"traced-diff-{first.short}"), self.options.diff, None)
        return code

    def conclude(self, status: str, code: int, line: str) -> int:
        self.record["status"], self.record["conclusion"] = status, line
        self.write_json()
        self.say(line)
        return code

    def write_json(self) -> None:
        """The whole search so far, replaced atomically after every step."""
        path = self.json_path
        if path is None:
            return
        self.record["steps"] = [asdict(step) for step in self.steps]
        with written_whole(path) as partial:
            partial.write_text(json.dumps(self.record, indent=1, ensure_ascii=False) + "\n")


class Measure:
    """One commit measured against GOOD: two runs in the store, and the verdict of the first decided look."""

    def __init__(self, bisect: Bisect, store: Store, suite: suites.Suite, point: suites.Point, machine: Machine,
                 fingerprint: dict[str, Any], good: Commit, bad: Commit, good_tree: Path):
        self.bisect = bisect
        self.store = store
        self.suite = suite
        self.point = point
        self.index = suite.points.index(point)  # numbers the point's log directory, as in a sweep
        self.machine = machine
        self.fingerprint = fingerprint
        self.machine_key = machine_key(fingerprint)
        self.good = good
        self.bad = bad
        self.good_tree = good_tree

    def step(self, number: int, commit: Commit, role: str, threshold: float) -> Step:
        started = time.monotonic()
        result = Step(number, commit.sha, commit.subject, role, threshold=threshold)
        records = {side: PointRecord(self.point.key, self.point.config, "ok", utc_now(), 0.0)
                   for side in ("ref", "new")}
        with worktree(commit.sha, self.bisect.say) as tree:
            result.good_run, result.run = self.start_runs(number, commit, threshold)
            try:
                verdict = self.pairs(commit, tree, result, records, threshold)
            except KeyboardInterrupt:
                for run_id in (result.good_run, result.run):
                    self.store.finish_run(run_id, "interrupted")
                raise
        for side, run_id in (("ref", result.good_run), ("new", result.run)):
            self.store.record_point(run_id, records[side])
            self.store.finish_run(run_id, "complete")
        result.pairs = len(records["new"].samples)
        result.seconds = time.monotonic() - started
        result.verdict, result.reason = verdict.status, verdict.reason
        if verdict.sps is not None:
            sps = verdict.sps
            result.estimate = sps.relative
            result.interval = [None if sps.low <= -1 else sps.low, None if math.isinf(sps.high) else sps.high]
        if records["ref"].status != "ok":
            result.outcome = GOOD_FAILS
        else:
            result.outcome = outcome_of(verdict)
        return result

    def start_runs(self, number: int, commit: Commit, threshold: float) -> tuple[str, str]:
        """GOOD's run and the commit's, for this step; the commit's fingerprint names GOOD's run and the
        design that judged the step."""
        search = {"good": self.good.sha, "bad": self.bad.sha, "step": number}
        design = step_design(self.bisect.options.max_repeats, self.bisect.options.alpha, threshold)
        label = f"bisect {self.good.short}..{self.bad.short} step {number}"
        good_run = self.store.create_run(
            self.suite.name, self.suite.suite_hash,
            {**self.fingerprint, "git": commit_state(self.good.sha, self.bisect.good_ref),
             "bisect": {**search, "side": "good"}, **pairing_entry("ref", None, design)}, self.machine_key,
            f"{label}: good {self.good.short}")
        run = self.store.create_run(
            self.suite.name, self.suite.suite_hash,
            {**self.fingerprint, "git": commit_state(commit.sha),
             "bisect": {**search, "side": "probe", "good_run": good_run}, **pairing_entry("new", good_run, design)},
            self.machine_key, f"{label}: {commit}")
        return good_run, run

    def pairs(self, commit: Commit, tree: Path, result: Step, records: dict[str, PointRecord],
              threshold: float) -> PointVerdict:
        opts = self.bisect.options
        utilization = UtilizationProbe(opts.sample_hz_for(self.suite))
        timeout = opts.timeout_for(self.suite)
        with Launcher(opts.launch, self.good_tree) as good, good.beside(tree) as probed:
            runners = {"ref": PointRunner(opts.out_dir / result.good_run, opts.max_repeats, timeout, utilization,
                                          trainer_command, good),
                       "new": PointRunner(opts.out_dir / result.run, opts.max_repeats, timeout, utilization,
                                          trainer_command, probed)}
            pairing = Pairing(runners, step_design(opts.max_repeats, opts.alpha, threshold), self.bisect.say,
                              names={"ref": "good", "new": commit.short})
            return pairing.measure(self.index, self.point, records, self.machine.gpu_uuids(self.point.config),
                                   time.monotonic() + opts.budget_s)
