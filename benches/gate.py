"""`rlperf gate --suite SUITE --baseline REF`: did any point of the suite get slower than at commit REF?

Both commits are measured tonight, in pairs of processes with the `--against` machinery (REF in a temporary
git worktree, the working tree beside it), in two stages whose rules are decisions/screening.py's: a screen of every
point in a few pairs, then a sequential confirmation of the few suspects in fresh pairs, each at
alpha / suspects. Every process is stored as it lands, in four runs at most: the screen's two (the working
tree's is the night's measurement of the suite, for the history) and the confirmation's two, each naming the
gate's plan and the runs it belongs with, so `rlperf report` shows the same verdicts later.

Exit codes: 0 when no point regressed and every point was measured, 1 when a point regressed (or the machine
refused a write), 3 when a point could not be measured (a process failed, too few quiet pairs), 2 for bad
input; the last line says why.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from benches import suite as suites
from benches.against import Pairing, frames, pair_contention, resolve_commit, worktree
from benches.peaks import fill_missing
from benches.cli import add_process_options, sigterm_interrupts, utf8_text
from benches.runner import PointRunner, UtilizationProbe, trainer_command
from decisions import screening as rules
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from decisions.verdicts import PointVerdict, is_contended
from rlperf.arguments import DEFAULT_MAX_REPEATS, MAX_TIMEOUT_S, number_in, positive_int
from rlperf.errors import BadInput, output_dir
from rlperf.layout import DEFAULT_OUT, STORE_FILE
from rlperf.lock import MeasurementLock
from rlperf.machine import Machine, collect, machine_key, probe
from rlperf.store import PointRecord, Store, utc_now

SCREEN_PAIRS = 3
MAX_SUSPECTS = 4
MIN_QUIET = 2
# Seconds for the whole confirmation stage, shared among the suspects still to confirm.
BUDGET_S = 1800.0
SIDES = ("ref", "new")


@dataclass
class GateOptions:
    suite: str
    baseline: str
    out_dir: Path = Path(DEFAULT_OUT)
    device: str | None = None
    timeout_s: float | None = None
    sample_hz: float | None = None
    label: str | None = None
    screen_pairs: int = SCREEN_PAIRS
    max_suspects: int = MAX_SUSPECTS
    max_repeats: int = DEFAULT_MAX_REPEATS
    budget_s: float = BUDGET_S
    threshold: float = DEFAULT_THRESHOLD
    alpha: float = DEFAULT_ALPHA
    wait: bool = True
    summary: Path | None = None  # where the gate's outcome goes as JSON, for the steps of a workflow

    def plan(self) -> rules.GatePlan:
        return rules.GatePlan(threshold=self.threshold, alpha=self.alpha, screen_pairs=self.screen_pairs,
                              screen_at=self.threshold, max_suspects=self.max_suspects,
                              max_pairs=self.max_repeats, min_quiet=min(MIN_QUIET, self.screen_pairs))


Runners = Callable[[str], dict[str, PointRunner]]  # stage -> the two sides' runners
Record = Callable[[str, str, PointRecord], None]  # stage, side, a finished point


class Night:
    """The gate's two stages over a suite's points, with whatever runs the processes (`runners`, one pair of
    runners per stage) and keeps them (`record`): trainer processes and the store for `rlperf gate`, drawn ones
    for the simulations of studies/gate_power.py."""

    def __init__(self, plan: rules.GatePlan, say: Callable[[str], None], rng: random.Random | None = None):
        self.plan = plan
        self.say = say
        self.rng = rng or random.Random()

    def run(self, points: list[suites.Point], runners: Runners, record: Record,
            skip_reason: Callable[[suites.Point], str | None], gpu_uuids: Callable[[suites.Point], list[str]],
            budget_s: float, start_confirmation: Callable[[], None] = lambda: None) -> list[rules.GateVerdict]:
        screen_records = self.screen(points, runners("screen"), record, skip_reason, gpu_uuids)
        screened = rules.screen(*frames([r["new"] for r in screen_records]),
                                *frames([r["ref"] for r in screen_records]), self.plan)
        chosen = rules.suspects(screened, self.plan)
        confirmed: dict[str, PointVerdict] = {}
        if chosen:
            start_confirmation()
            confirmed = self.confirm(chosen, points, runners("confirm"), record, gpu_uuids, budget_s)
        return rules.verdicts(screened, confirmed, self.plan)

    def screen(self, points: list[suites.Point], sides: dict[str, PointRunner], record: Record,
               skip_reason: Callable[[suites.Point], str | None],
               gpu_uuids: Callable[[suites.Point], list[str]]) -> list[dict[str, PointRecord]]:
        pairing = Pairing(sides, None, self.say, rng=self.rng)
        found = []
        for index, point in enumerate(points):
            records = {side: PointRecord(point.key, point.config, "ok", utc_now(), 0.0) for side in SIDES}
            reason = skip_reason(point)
            if reason is not None:
                for side in SIDES:
                    records[side].status, records[side].reason = "skipped", reason
                self.say(f"skipped {point.label}: {reason}")
            else:
                directories = pairing.directories(index, point)
                pair = quiet = 0
                # a pair with a contended process is left out, so the screen makes up for it, within limits
                while quiet < self.plan.screen_pairs and pair < 2 * self.plan.screen_pairs:
                    if pairing.run_pair(pair, point, records, directories, gpu_uuids(point)) is not None:
                        break
                    quiet += not any(is_contended(records[side].samples[-1][1]) for side in SIDES)
                    pair += 1
                self.say_screen(point, records)
            for side in SIDES:
                record("screen", side, records[side])
            found.append(records)
        return found

    def say_screen(self, point: suites.Point, records: dict[str, PointRecord]) -> None:
        if records["new"].status != "ok" or records["ref"].status != "ok":
            return
        ratios = [new[1]["sps"] / ref[1]["sps"] for ref, new in zip(records["ref"].samples, records["new"].samples)]
        busy = [f"pair {pair + 1} {note}" for pair in range(len(ratios))
                if (note := pair_contention(records, pair, {"ref": "baseline", "new": "new"}))]
        self.say(f"screen {point.label}: new / baseline SPS per pair " + ", ".join(f"{r:.3f}" for r in ratios)
                 + (f"; left out: {', '.join(busy)}" if busy else ""))

    def confirm(self, chosen: list[rules.Screened], points: list[suites.Point], sides: dict[str, PointRunner],
                record: Record, gpu_uuids: Callable[[suites.Point], list[str]],
                budget_s: float) -> dict[str, PointVerdict]:
        design = self.plan.confirmation(len(chosen))
        self.say(f"confirming {len(chosen)} suspects, each at alpha {design.alpha:.3g} (looks at "
                 f"{', '.join(map(str, design.looks))} quiet pairs): " + ", ".join(s.label for s in chosen))
        pairing = Pairing(sides, design, self.say, rng=self.rng)
        started = time.monotonic()
        by_key = {point.key: (index, point) for index, point in enumerate(points)}
        confirmed = {}
        for done, suspect in enumerate(chosen):
            index, point = by_key[suspect.point_key]
            # each suspect may use an equal share of what is left
            deadline = time.monotonic() + (started + budget_s - time.monotonic()) / (len(chosen) - done)
            records = {side: PointRecord(point.key, point.config, "ok", utc_now(), 0.0) for side in SIDES}
            confirmed[suspect.key] = pairing.measure(index, point, records, gpu_uuids(point), deadline)
            for side in SIDES:
                record("confirm", side, records[side])
        return confirmed


class Gate:
    """`rlperf gate`: a Night of trainer processes, stored, then the verdicts and the report."""

    def __init__(self, options: GateOptions, console: Console, machine: Machine | None = None):
        self.options = options
        self.console = console
        self.machine = machine
        self.runs: dict[tuple[str, str], str] = {}  # (stage, side) -> run id

    def say(self, text: str) -> None:
        self.console.print(text, markup=False, soft_wrap=True, highlight=False)

    def run(self) -> int:
        opts = self.options
        if opts.screen_pairs < 2:
            raise BadInput(f"screen-pairs: at least 2 pairs a point (got {opts.screen_pairs})")
        if opts.summary is not None:
            if opts.summary.is_dir():
                raise BadInput(f"summary: {opts.summary} is a directory; name a file")
            output_dir(opts.summary.parent, "summary")
        suite = suites.load(opts.suite)
        commit = resolve_commit(opts.baseline, "baseline")
        machine = self.machine or probe()
        overrides = {"device": machine.resolve_device(opts.device)} if opts.device else {}
        if overrides:
            suite = suites.load(opts.suite, overrides)
        current = collect(machine, suite.suite_hash, overrides)
        fingerprints = {"ref": {**current, "git": {"commit": commit, "dirty": False, "ref": opts.baseline}},
                        "new": current}
        output_dir(opts.out_dir, "out")
        store_path = opts.out_dir / STORE_FILE
        plan = opts.plan()
        utilization = UtilizationProbe(suite.sample_hz if opts.sample_hz is None else opts.sample_hz)
        timeout = opts.timeout_s or suite.timeout_s
        with MeasurementLock() as lock, worktree(commit) as tree:
            lock.acquire(opts.wait, self.say, suite=suite.name, store=str(store_path.resolve()))
            with Store.open(store_path) as store:
                def create(stage: str) -> None:
                    for side in SIDES:
                        entry = {"stage": stage, "side": side, "baseline": opts.baseline, "plan": plan.to_dict(),
                                 "runs": {f"{s}_{d}": r for (s, d), r in self.runs.items()}}
                        label = f"{opts.label or 'gate'} {stage}: " + \
                            (f"{opts.baseline} ({commit[:10]})" if side == "ref" else "working tree")
                        self.runs[(stage, side)] = store.create_run(
                            suite.name, suite.suite_hash, {**fingerprints[side], rules.GATE: entry},
                            machine_key(current), label)
                    lock.update(run_id=self.runs[(stage, "new")])

                def runners(stage: str) -> dict[str, PointRunner]:
                    return {side: PointRunner(opts.out_dir / self.runs[(stage, side)], plan.max_pairs, timeout,
                                              utilization, trainer_command, cwd=tree if side == "ref" else None)
                            for side in SIDES}

                def record(stage: str, side: str, point_record: PointRecord) -> None:
                    store.record_point(self.runs[(stage, side)], point_record)

                create("screen")
                self.say(f"gate: suite {suite.name}, {len(suite.points)} points, against {opts.baseline} "
                         f"({commit[:10]}); runs {self.runs[('screen', 'ref')]} and {self.runs[('screen', 'new')]}, "
                         f"store {store.path}")
                night = Night(plan, self.say)
                try:
                    night.run(list(suite.points), runners, record, lambda p: machine.skip_reason(p.config),
                              lambda p: machine.gpu_uuids(p.config), opts.budget_s,
                              start_confirmation=lambda: create("confirm"))
                    fill_missing(store, machine_key(current), self.runs[("screen", "new")], self.say)
                except KeyboardInterrupt:
                    for run_id in self.runs.values():
                        store.finish_run(run_id, "interrupted")
                    raise
                for run_id in self.runs.values():
                    store.finish_run(run_id, "complete")
        return self.conclude(plan, store_path)

    def conclude(self, plan: rules.GatePlan, store_path: Path) -> int:
        """The verdicts rebuilt from the store, as every later report will show them, and the exit code."""
        from reports.cli import print_gate
        from reports.render import render
        from decisions.rundata import load_run

        new_run, ref_run = self.runs[("screen", "new")], self.runs[("screen", "ref")]
        report_dir = self.options.out_dir / new_run / "report"
        with Store.open(store_path, readonly=True) as store:
            candidate, baseline = load_run(store, new_run), load_run(store, ref_run, "baseline")
        found = rules.stored_verdicts(candidate, baseline, plan)
        _, _, paths = render(candidate, str(report_dir), baseline, plan.threshold, plan.alpha)
        print_gate(self.console, found, plan)
        self.say(f"report: {paths[0]}; `rlperf report {store_path}::{new_run} --baseline {store_path}::{ref_run}` "
                 f"shows it again")
        code = rules.exit_code(found)
        if self.options.summary is not None:
            write_summary(self.options.summary, {
                "store": str(store_path), "runs": {f"{stage}_{side}": run for (stage, side), run in self.runs.items()},
                "baseline": self.options.baseline, "report": str(report_dir), "exit_code": code,
                "conclusion": rules.conclusion(found), "points": [rules.summary_row(v) for v in found]})
        self.say(rules.conclusion(found))
        return code


def write_summary(path: Path, content: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n")
    partial.replace(path)


# ---- command line -----------------------------------------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (f"{parser.description}. Exit code 0 when no point regressed, 1 when one did, 3 when a "
                          f"point could not be measured, 2 for bad input.")
    parser.add_argument("--suite", required=True, help="a suite in benches/suites or a path to a .toml file")
    parser.add_argument("--baseline", required=True, metavar="REF",
                        help="the commit (any git ref) the working tree is judged against, measured tonight in a "
                             "temporary worktree")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"where the store ({STORE_FILE}), logs and the report go (default {DEFAULT_OUT}/)")
    add_process_options(parser, "every point")
    parser.add_argument("--budget-s", type=number_in(0, MAX_TIMEOUT_S, low_included=False), default=BUDGET_S,
                        metavar="S", help=f"seconds for the confirmation of the suspects, shared among them "
                                          f"(default {BUDGET_S:g})")
    parser.add_argument("--screen-pairs", type=positive_int, default=SCREEN_PAIRS, metavar="N",
                        help=f"pairs of processes every point gets in the screen, at least 2 (default {SCREEN_PAIRS})")
    parser.add_argument("--max-suspects", type=positive_int, default=MAX_SUSPECTS, metavar="N",
                        help=f"the slowest suspects confirmed, each at alpha / their number (default {MAX_SUSPECTS})")
    parser.add_argument("--max-repeats", type=positive_int, default=DEFAULT_MAX_REPEATS, metavar="N",
                        help=f"at most N pairs in one suspect's confirmation (default {DEFAULT_MAX_REPEATS})")
    parser.add_argument("--threshold", type=number_in(0, 1, low_included=False), default=DEFAULT_THRESHOLD,
                        help=f"the smallest slowdown of SPS that counts, as a fraction; a point is a suspect when "
                             f"its screen is slower than this (default {DEFAULT_THRESHOLD})")
    parser.add_argument("--alpha", type=number_in(0, 0.5, low_included=False), default=DEFAULT_ALPHA,
                        help=f"the chance of flagging any point on a night where nothing got slower "
                             f"(default {DEFAULT_ALPHA})")
    parser.add_argument("--label", type=utf8_text, help="a note stored with the runs (default: gate)")
    parser.add_argument("--summary", type=Path, metavar="PATH",
                        help="also write the outcome as JSON: the runs, each point's verdict, the conclusion and the "
                             "exit code (default: none)")


def run(args: argparse.Namespace) -> int:
    from rlperf.terminal import default_console

    options = GateOptions(suite=args.suite, baseline=args.baseline, out_dir=Path(args.out), device=args.device,
                          timeout_s=args.timeout, sample_hz=args.sample_hz, label=args.label,
                          screen_pairs=args.screen_pairs, max_suspects=args.max_suspects,
                          max_repeats=args.max_repeats, budget_s=args.budget_s, threshold=args.threshold,
                          alpha=args.alpha, wait=args.wait, summary=args.summary)
    with sigterm_interrupts():
        return Gate(options, default_console()).run()
