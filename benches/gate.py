"""`rlperf gate --suite SUITE --baseline REF`: did any point of the suite get slower than at commit REF?

Both commits are measured tonight, in pairs of processes (benches/pairing.py; REF in a temporary git worktree,
the working tree beside it), in two stages (benches/night.py) whose rules are decisions/screening.py's: a
screen of every point in a few pairs, then a sequential confirmation of the few suspects in fresh pairs, each
at its share of alpha. Every process is stored as it lands, in four runs at most: the screen's two (the working
tree's is the night's measurement of the suite, for the history) and the confirmation's two, each naming the
gate's plan and the runs it belongs with, so `rlperf report` shows the same verdicts later.

Exit codes: 0 when no point regressed and every point was measured, 1 when a point regressed (or the machine
refused a write), 3 when a point could not be measured (a process failed, too few quiet pairs), 2 for bad
input; the last line says why.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from benches import forecast, suite as suites
from benches.night import LEAD_SHARE, MAX_SUSPECTS, NIGHT_S, REFINE_PAIRS, REFINE_POINTS, SCREEN_PAIRS, Night, gate_plan
from benches.options import ProcessOptions
from benches.pairing import SIDES
from benches.peak_probe import measure_run_peaks
from benches.runner import Launcher, PointRunner, UtilizationProbe, trainer_command
from benches.worktrees import resolve_commit, worktree
from decisions import screening as rules
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from rlperf.arguments import (MAX_TIMEOUT_S, add_alpha, add_label, add_max_repeats, add_process_options, add_threshold,
                              non_negative_int, positive_int, timeout_seconds)
from rlperf.errors import BadInput, output_dir, output_file, written_whole
from rlperf.layout import DEFAULT_OUT, STORE_FILE
from rlperf.lock import MeasurementLock
from rlperf.machine import Machine, collect, machine_key
from rlperf.processes import stop_signals_interrupt
from rlperf.store import PointRecord, Store
from rlperf.terminal import say_on


class Gate:
    """`rlperf gate`: a Night of trainer processes, the working tree's against commit `baseline`'s, stored,
    then the verdicts and the report; with `summary`, the outcome also written there as JSON, for the steps of
    a workflow."""

    def __init__(self, options: ProcessOptions, baseline: str, console: Console, screen_pairs: int = SCREEN_PAIRS,
                 max_suspects: int = MAX_SUSPECTS, summary: Path | None = None, machine: Machine | None = None,
                 refine_points: int = REFINE_POINTS, night_s: float = NIGHT_S):
        self.options = options
        self.night_s = night_s
        self.baseline = baseline
        self.screen_pairs = screen_pairs
        self.max_suspects = max_suspects
        self.refine_points = refine_points
        self.summary = summary
        self.console = console
        self.say = say_on(self.console)
        self.machine = machine
        self.runs: dict[tuple[str, str], str] = {}  # (stage, side) -> run id

    def run(self) -> int:
        opts = self.options
        if self.screen_pairs < 2:
            raise BadInput(f"screen-pairs: at least 2 pairs a point (got {self.screen_pairs})")
        if self.summary is not None:
            output_file(self.summary, "summary")
        suite = suites.load(opts.suite)  # a bad suite stops here, before git or the machine is asked
        commit = resolve_commit(self.baseline, "baseline")
        output_dir(opts.out_dir, "out")
        store_path = opts.out_dir / STORE_FILE
        with MeasurementLock() as lock, Launcher(opts.launch) as working:
            lock.acquire(opts.wait, self.say, suite=suite.name, store=str(store_path.resolve()))
            plan = self.measure_night(commit, working, lock, store_path)
        return self.conclude(plan, store_path)

    def measure_night(self, commit: str, working: Launcher, lock: MeasurementLock,
                      store_path: Path) -> rules.GatePlan:
        """Screens and confirms both commits under the machine's lock, from the probe on (the probe and the
        server's imports are work on the machine too), each pair stored as it ends; the plan they were judged by."""
        opts = self.options
        machine = self.machine or working.probe_machine()
        suite, overrides = opts.suite_on(machine)
        current = collect(machine, suite.suite_hash, overrides)
        fingerprints = {"ref": {**current, "git": {"commit": commit, "dirty": False, "ref": self.baseline}},
                        "new": current}
        plan = gate_plan(opts, self.screen_pairs, self.max_suspects, self.refine_points)
        utilization = UtilizationProbe(opts.sample_hz_for(suite))
        timeout = opts.timeout_for(suite)
        with worktree(commit, self.say) as tree, working.beside(tree) as baseline, \
                Store.open(store_path) as store:
            launchers = {"ref": baseline, "new": working}

            def create(stage: str) -> None:
                for side in SIDES:
                    entry = {"stage": stage, "side": side, "baseline": self.baseline, "plan": plan.to_dict(),
                             "screen_pairs": allocation,
                             "runs": {f"{s}_{d}": r for (s, d), r in self.runs.items()}}
                    label = f"{opts.label or 'gate'} {stage}: " + \
                        (f"{self.baseline} ({commit[:10]})" if side == "ref" else "working tree")
                    self.runs[(stage, side)] = store.create_run(
                        suite.name, suite.suite_hash, {**fingerprints[side], rules.GATE: entry},
                        machine_key(current), label)
                lock.update(run_id=self.runs[(stage, "new")])

            def runners(stage: str) -> dict[str, PointRunner]:
                return {side: PointRunner(opts.out_dir / self.runs[(stage, side)], plan.max_pairs, timeout,
                                          utilization, trainer_command, launchers[side])
                        for side in SIDES}

            runnable = [p for p in suite.points if machine.skip_reason(p.config) is None]
            history = forecast.screen_history(store, machine_key(current), runnable, plan)
            allocation = rules.screen_allocation(history, plan)
            plan = replace(plan, point_spreads=rules.relative_spreads(history))

            def forecast_night() -> forecast.Forecast | None:
                return forecast.predict(store, machine_key(current), runnable, plan, self.night_s, opts.launch,
                                        allocation)

            def fitted(heading: str = "forecast", fixed: frozenset[str] = frozenset()) \
                    -> tuple[forecast.Forecast | None, list[str]]:
                """The forecast, and what it says, once the night is fitted to leave the confirmation its reserve:
                fewer screen pairs, and before any point is screened fewer suspects (a refusal, exit 2, where
                nothing fits)."""
                nonlocal plan
                predicted = forecast_night()
                if predicted is None:
                    return None, []
                costs = {point.key: cost.process_s for point, cost in zip(runnable, predicted.points)}
                fit = forecast.fit_night(costs, allocation, plan, self.night_s, plan.point_spreads, fixed,
                                         fewer_suspects=not fixed)
                line = forecast.fit_line(fit, runnable, plan, self.night_s, history)
                allocation.update(fit.pairs)
                plan = replace(plan, max_suspects=fit.suspects)
                predicted = forecast_night()
                return predicted, ([line] if line else []) + predicted.lines(heading)

            def record(stage: str, side: str, point_record: PointRecord) -> None:
                nonlocal predicted
                store.record_point(self.runs[(stage, side)], point_record)
                if predicted is None and stage == "screen" and side == SIDES[-1]:
                    # a machine the store knew nothing of: from this point on
                    predicted, lines = fitted("forecast from the screen's first point",
                                              frozenset({point_record.point_key}))
                    for line in lines:
                        self.say(line)

            predicted, foreword = fitted()  # from the runs before tonight's
            foreword = foreword or [forecast.unknown(store, machine_key(current))]
            create("screen")
            self.say(f"gate: suite {suite.name}, {len(suite.points)} points, against {self.baseline} "
                     f"({commit[:10]}); runs {self.runs[('screen', 'ref')]} and {self.runs[('screen', 'new')]}, "
                     f"store {store.path}")
            for line in [allocation_line(runnable, allocation, history, plan), *foreword]:
                self.say(line)
            started = time.monotonic()
            night = Night(plan, self.say, screen_pairs=allocation)
            try:
                night.run(list(suite.points), runners, record, lambda p: machine.skip_reason(p.config),
                          lambda p: machine.gpu_uuids(p.config), self.night_s, start_stage=create)
                if predicted is not None:
                    self.say(predicted.review(store, self.runs, time.monotonic() - started))
                measure_run_peaks(store, machine_key(current), self.runs[("screen", "new")], self.say)
            except (KeyboardInterrupt, BadInput):  # interrupted, or refused once the first point forecast the night
                for run_id in self.runs.values():
                    store.finish_run(run_id, "interrupted")
                raise
            for run_id in self.runs.values():
                store.finish_run(run_id, "complete")
        return plan

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
        if self.summary is not None:
            write_summary(self.summary, {
                "store": str(store_path), "runs": {f"{stage}_{side}": run for (stage, side), run in self.runs.items()},
                "baseline": self.baseline, "report": str(report_dir), "exit_code": code,
                "conclusion": rules.conclusion(found), "points": [rules.summary_row(v) for v in found]})
        self.say(rules.conclusion(found))
        return code


def allocation_line(points: list[suites.Point], allocation: dict[str, int], history: dict[str, list[tuple]],
                    plan: rules.GatePlan) -> str:
    """What the screen gives each point, and from how many earlier nights."""
    nights = max((len(found) for found in history.values()), default=0)
    if not plan.point_spreads:
        why = ("no earlier screen here to weigh the points' noise by" if not nights else
               f"the pairs of {nights} earlier night{'s' if nights > 1 else ''} here do not tell the points' "
               f"noise apart")
        return f"screen: {plan.screen_pairs} pairs a point ({why})"
    counts = Counter(allocation.values())
    most = max(points, key=lambda point: allocation[point.key])
    given = ", ".join(f"{pairs} for {counts[pairs]} point{'s' if counts[pairs] > 1 else ''}"
                      for pairs in sorted(counts))
    return (f"screen: pairs shared, and each point's pairs weighed, by its pair spread on up to {nights} earlier "
            f"nights here, {plan.screen_pairs} a point on average: {given}; the most for {most.label}")


def write_summary(path: Path, content: dict) -> None:
    with written_whole(path) as partial:
        partial.write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n")


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
    parser.add_argument("--night-s", type=timeout_seconds, default=NIGHT_S, metavar="S",
                        help=f"seconds of the whole night, screen to confirmation: the confirmation of the suspects "
                             f"gets what the screen and refinement leave, above 0 and at most {MAX_TIMEOUT_S:g} "
                             f"(default {NIGHT_S:g})")
    parser.add_argument("--screen-pairs", type=positive_int, default=SCREEN_PAIRS, metavar="N",
                        help=f"pairs of processes a point gets in the screen on average, at least 2: shared out by "
                             f"each point's pair spread in the store's earlier screens on this machine, every point "
                             f"the same until they tell the points apart (default {SCREEN_PAIRS})")
    parser.add_argument("--refine-points", type=non_negative_int, default=REFINE_POINTS, metavar="N",
                        help=f"the points with the strongest screen that get {REFINE_PAIRS} more pairs before the "
                             f"suspects are chosen; 0 chooses from the screen alone (default {REFINE_POINTS})")
    parser.add_argument("--max-suspects", type=positive_int, default=MAX_SUSPECTS, metavar="N",
                        help=f"the suspects confirmed, the strongest evidence first: the first at {LEAD_SHARE:.0%}% of "
                             f"alpha, the others splitting the rest, a claim passing its level on (default "
                             f"{MAX_SUSPECTS})")
    add_max_repeats(parser, "at most N pairs in one suspect's confirmation")
    add_threshold(parser, "the smallest slowdown of SPS that counts: the screen weighs each point's pairs for a "
                          "slowdown of twice this against none, and a confirmation stops a point shown not slower "
                          "by this", DEFAULT_THRESHOLD)
    add_alpha(parser, "the chance of flagging any point on a night where nothing got slower", DEFAULT_ALPHA)
    add_label(parser, "gate")
    parser.add_argument("--summary", type=Path, metavar="PATH",
                        help="also write the outcome as JSON: the runs, each point's verdict, the conclusion and the "
                             "exit code (default: none)")


def run(args: argparse.Namespace) -> int:
    from rlperf.terminal import default_console

    gate = Gate(ProcessOptions.from_args(args), args.baseline, default_console(), screen_pairs=args.screen_pairs,
                max_suspects=args.max_suspects, summary=args.summary, refine_points=args.refine_points,
                night_s=args.night_s)
    with stop_signals_interrupt():
        return gate.run()
