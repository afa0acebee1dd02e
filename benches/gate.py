"""The gate's night (`rlperf gate`): the working tree against a baseline commit in pairs of processes, screened and
confirmed (benches/night.py), every process stored as it lands, then the verdicts, the report and the exit code."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from benches import forecast, suite as suites
from benches.night import (MAX_SUSPECTS, NIGHT_S, REFINE_POINTS, SCREEN_PAIRS, Night, NightSetup, fitted_night,
                           gate_plan, set_up_night)
from benches.options import ProcessOptions
from benches.pairing import SIDES
from benches.peak_probe import measure_run_peaks
from benches.promise import promise_line, weaker_line
from benches.runner import Launcher, PointRunner, UtilizationProbe, trainer_command
from benches.traced_against import follow_up
from benches.worktrees import resolve_commit, twin_worktrees
from decisions import screening as rules
from rlperf.errors import BadInput, output_dir, output_file, written_whole
from rlperf.layout import STORE_FILE
from rlperf.lock import MeasurementLock
from rlperf.machine import Machine, collect, commit_state, machine_key
from rlperf.store import PointRecord, Store
from rlperf.terminal import say_on


class Gate:
    """`rlperf gate`: a Night of trainer processes, the working tree's against commit `baseline`'s, stored,
    then the verdicts and the report; with `summary`, the outcome also written there as JSON, for the steps of
    a workflow."""

    def __init__(self, options: ProcessOptions, baseline: str, console: Console, screen_pairs: int = SCREEN_PAIRS,
                 max_suspects: int = MAX_SUSPECTS, summary: Path | None = None, machine: Machine | None = None,
                 refine_points: int = REFINE_POINTS, night_s: float = NIGHT_S, accept_weaker: bool = False):
        self.options = options
        self.accept_weaker = accept_weaker
        self.weaker: str | None = None  # the last line of a night run weaker than its promise
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
        self.started = time.monotonic()  # the night's budget, a traced diff's included, counts from here

    def run(self) -> int:
        opts = self.options
        if self.screen_pairs < 2:
            raise BadInput(f"screen-pairs: at least 2 pairs a point (got {self.screen_pairs})")
        if self.summary is not None:
            output_file(self.summary, "summary")
        suite = suites.load(opts.suite)  # a bad suite stops here, before git or the machine is asked
        suite.refuse_against("the gate, which compares commits")
        commit = resolve_commit(self.baseline, "baseline")
        output_dir(opts.out_dir, "out")
        store_path = opts.out_dir / STORE_FILE
        with MeasurementLock() as lock, Launcher(opts.launch_for(suite)) as working:
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
        fingerprints = {"ref": {**current, "git": commit_state(commit, self.baseline)}, "new": current}
        plan = gate_plan(opts, self.screen_pairs, self.max_suspects, self.refine_points)
        with twin_worktrees(commit, self.say) as trees, working.beside(trees["ref"]) as baseline, \
                working.beside(trees["new"]) as new, Store.open(store_path) as store:
            runnable = [p for p in suite.points if machine.skip_reason(p.config) is None]
            tonight = Tonight(commit, suite, machine, machine_key(current), runnable, fingerprints,
                              {"ref": baseline, "new": new},
                              forecast.screen_history(store, machine_key(current), runnable, plan))
            setup = set_up_night(plan, tonight.history, None, self.night_s)
            setup, predicted, foreword = self.fitted(store, tonight, setup)  # from the runs before tonight's
            foreword = foreword or [forecast.unknown(store, tonight.machine_key)]
            measuring = Measuring(self, store, lock, tonight, setup, predicted)
            measuring.create("screen")
            self.say(f"gate: suite {suite.name}, {len(suite.points)} points, against {self.baseline} "
                     f"({commit[:10]}); runs {self.runs[('screen', 'ref')]} and {self.runs[('screen', 'new')]}, "
                     f"store {store.path}")
            for line in [allocation_line(runnable, setup.screen_pairs, tonight.history, setup.plan), *foreword]:
                self.say(line)
            measuring.run()
        return measuring.setup.plan

    def forecast_night(self, store: Store, tonight: "Tonight", setup: NightSetup) -> forecast.Forecast | None:
        return forecast.predict(store, tonight.machine_key, tonight.runnable, setup.plan, self.night_s,
                                self.options.launch, setup.screen_pairs)

    def fitted(self, store: Store, tonight: "Tonight", setup: NightSetup, heading: str = "forecast",
               screened: frozenset[str] = frozenset()) -> tuple[NightSetup, forecast.Forecast | None, list[str]]:
        """The night fitted to leave the confirmation its reserve (fewer screen pairs, and before any point is
        screened fewer suspects; a refusal, exit 2, where nothing fits), its forecast and what that says: `setup`
        as it was, None and nothing where the store knows no process of these points here."""
        predicted = self.forecast_night(store, tonight, setup)
        if predicted is None:
            return setup, None, []
        costs = {point.key: cost.process_s for point, cost in zip(tonight.runnable, predicted.points)}
        labels = {point.key: point.label for point in tonight.runnable}
        fitted = fitted_night(setup, costs, self.night_s, screened, tonight.history, self.accept_weaker, labels)
        if fitted.refused:
            raise BadInput(fitted.refused)
        if fitted.plan.beyond_undecided:
            self.weaker = weaker_line(fitted.promise, fitted.fit, labels)
        line = forecast.fit_line(fitted.fit, tonight.runnable, setup.plan, self.night_s, tonight.history)
        predicted = self.forecast_night(store, tonight, fitted)
        return fitted, predicted, ([line] if line else []) + [promise_line(fitted.promise)] + predicted.lines(heading)

    def conclude(self, plan: rules.GatePlan, store_path: Path) -> int:
        """The verdicts rebuilt from the store, as every later report will show them, and the exit code."""
        from reports.formatting import print_gate
        from reports.memory import changes, growth_line
        from reports.render import render
        from decisions.rundata import load_run, point_table

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
        memory = changes(point_table(baseline), point_table(candidate))
        if memory:
            self.say(growth_line(memory))
        if self.summary is not None:
            write_summary(self.summary, {
                "store": str(store_path), "runs": {f"{stage}_{side}": run for (stage, side), run in self.runs.items()},
                "baseline": self.baseline, "report": str(report_dir), "exit_code": code,
                "conclusion": rules.conclusion(found), "points": [rules.summary_row(v) for v in found],
                "memory": memory})
        self.say(rules.conclusion(found))
        self.which_operator(found, candidate)
        if self.weaker:  # the last line: what a weaker night promised
            self.say(self.weaker)
        return code

    def which_operator(self, found: list[rules.GateVerdict], candidate) -> None:
        """Each regressed point with a phase named: the traced diff that says which operator, run with --diff
        within what is left of the night."""
        configs = candidate.points.set_index("point_key")["config"]
        named = [v for v in found if v.status == rules.REGRESSED and v.confirmation.phases_grew]
        for index, verdict in enumerate(named, 1):
            follow_up(self.say, configs[verdict.screen.point_key], self.baseline, None,
                      str(self.options.out_dir / f"traced-diff-{index}"), self.options.diff,
                      self.started + self.night_s)


@dataclass(frozen=True)
class Tonight:
    """What the gate's night measures on: the baseline commit, the suite, the machine and the points it can run,
    each side's fingerprint and launcher, and the points' pairs on earlier nights here."""

    commit: str
    suite: suites.Suite
    machine: Machine
    machine_key: str
    runnable: list[suites.Point]
    fingerprints: dict[str, dict]  # by side
    launchers: dict[str, Launcher]  # by side
    history: dict[str, list[tuple]]  # by point key (benches/forecast.py screen_history)


class Measuring:
    """The gate's night in progress: its runs created as each stage starts, each point stored as it lands, and on a
    machine the store knew nothing of, the night fitted again after the screen's first point."""

    def __init__(self, gate: Gate, store: Store, lock: MeasurementLock, tonight: Tonight, setup: NightSetup,
                 predicted: forecast.Forecast | None):
        self.gate, self.store, self.lock, self.tonight = gate, store, lock, tonight
        self.setup, self.predicted = setup, predicted
        self.night = Night(setup.plan, gate.say, screen_pairs=setup.screen_pairs)
        self.utilization = UtilizationProbe(gate.options.sample_hz_for(tonight.suite))

    def run(self) -> None:
        gate, store, tonight = self.gate, self.store, self.tonight
        started = time.monotonic()
        try:
            self.night.run(list(tonight.suite.points), self.runners, self.record,
                           lambda p: tonight.machine.skip_reason(p.config),
                           lambda p: tonight.machine.gpu_uuids(p.config), gate.night_s, start_stage=self.create)
            if self.predicted is not None:
                gate.say(self.predicted.review(store, gate.runs, time.monotonic() - started))
            measure_run_peaks(store, tonight.machine_key, gate.runs[("screen", "new")], gate.say)
        except (KeyboardInterrupt, BadInput):  # interrupted, or refused once the first point forecast the night
            for run_id in gate.runs.values():
                store.finish_run(run_id, "interrupted")
            raise
        for run_id in gate.runs.values():
            store.finish_run(run_id, "complete")

    def create(self, stage: str) -> None:
        """The stage's two runs, each naming the plan and the runs before it."""
        gate, tonight = self.gate, self.tonight
        for side in SIDES:
            entry = {"stage": stage, "side": side, "baseline": gate.baseline, "plan": self.setup.plan.to_dict(),
                     "screen_pairs": self.setup.screen_pairs,
                     "runs": {f"{s}_{d}": r for (s, d), r in gate.runs.items()}}
            label = f"{gate.options.label or 'gate'} {stage}: " + \
                (f"{gate.baseline} ({tonight.commit[:10]})" if side == "ref" else "working tree")
            gate.runs[(stage, side)] = self.store.create_run(
                tonight.suite.name, tonight.suite.suite_hash, {**tonight.fingerprints[side], rules.GATE: entry},
                tonight.machine_key, label)
        self.lock.update(run_id=gate.runs[(stage, "new")])

    def runners(self, stage: str) -> dict[str, PointRunner]:
        opts, suite = self.gate.options, self.tonight.suite
        return {side: PointRunner(opts.out_dir / self.gate.runs[(stage, side)], self.setup.plan.max_pairs,
                                  opts.timeout_for(suite), self.utilization, trainer_command,
                                  self.tonight.launchers[side])
                for side in SIDES}

    def record(self, stage: str, side: str, point_record: PointRecord) -> None:
        self.store.record_point(self.gate.runs[(stage, side)], point_record)
        if self.predicted is None and stage == "screen" and side == SIDES[-1]:
            # a machine the store knew nothing of: from this point on
            self.setup, self.predicted, lines = self.gate.fitted(
                self.store, self.tonight, self.setup, "forecast from the screen's first point",
                frozenset({point_record.point_key}))
            self.night.screen_pairs = self.setup.screen_pairs
            for line in lines:
                self.gate.say(line)


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
