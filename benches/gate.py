"""The gate's night (`rlperf gate`): the working tree against a baseline commit in pairs of processes, screened and
confirmed (benches/night.py), every process stored as it lands, then the verdicts, the report and the exit code."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from benches import forecast, suite as suites
from benches.night import MAX_SUSPECTS, NIGHT_S, REFINE_POINTS, SCREEN_PAIRS, Night, gate_plan
from benches.options import ProcessOptions
from benches.pairing import SIDES
from benches.peak_probe import measure_run_peaks
from benches.runner import Launcher, PointRunner, UtilizationProbe, trainer_command
from benches.worktrees import resolve_commit, worktree
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
        fingerprints = {"ref": {**current, "git": commit_state(commit, self.baseline)},
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
        from reports.formatting import print_gate
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
