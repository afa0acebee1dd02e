"""`rlperf bench --against REF`: the suite measured at REF and at the working tree in pairs of processes,
point by point, so that drift and neighbours land on both sides alike (docs/gate.md, `--against`). A suite of
commands with an [against] table is measured the same way at one commit: each point as the suite sets it against
the same point with [against]'s settings (two virtualenvs, two configs; docs/any-trainer.md).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from benches import suite as suites
from benches.options import ProcessOptions
from benches.pairing import Pairing
from benches.peak_probe import measure_run_peaks
from benches.runner import Launcher, PointRunner, UtilizationProbe, trainer_command
from benches.worktrees import resolve_commit, twin_worktrees
from decisions.sequential import Design, pairing_entry
from decisions.verdicts import PointVerdict
from rlperf.errors import BadInput, output_dir
from rlperf.layout import STORE_FILE
from rlperf.lock import MeasurementLock
from rlperf.machine import Machine, collect, commit_state, machine_key
from rlperf.store import PointRecord, Store, plain, utc_now
from rlperf.terminal import say_on


class Against:
    """The suite of `options` at commit `ref` and at the working tree, or (`ref` None) the suite's points against
    its [against] settings at the working tree; `options.repeats` pairs a point, or pairs added until decided with
    `until_decided`."""

    def __init__(self, options: ProcessOptions, ref: str | None, console: Console, until_decided: bool = False,
                 machine: Machine | None = None):
        self.options = options
        self.ref = ref
        self.until_decided = until_decided
        self.console = console
        self.say = say_on(self.console)
        self.machine = machine

    def run(self) -> int:
        opts = self.options
        suite = suites.load(opts.suite)  # a bad suite stops here, before git or the machine is asked
        if self.ref is not None:
            suite.refuse_against("--against REF, which compares commits")
        elif suite.against is None:
            raise BadInput(f"suite: {opts.suite} has no [against] table: name the reference with --against REF")
        commit = resolve_commit(self.ref) if self.ref is not None else None
        output_dir(opts.out_dir, "out")
        store_path = opts.out_dir / STORE_FILE
        with MeasurementLock() as lock, Launcher(opts.launch_for(suite)) as working:
            lock.acquire(opts.wait, self.say, suite=suite.name, store=str(store_path.resolve()))
            ref_run, new_run, verdicts = self.measure_suite(commit, working, lock, store_path)
        return self.conclude(store_path, ref_run, new_run, verdicts)

    def sides(self, suite: suites.Suite, commit: str | None) -> dict[str, tuple[dict, str]]:
        """Each side's fingerprint entry and how the run's label and the progress lines name it."""
        if commit is None:
            settings = ", ".join(f"{name}={plain(value)}" for name, value in suite.against.items())
            return {"ref": ({"side": "ref", "settings": suite.against}, f"[against] {settings}"),
                    "new": ({"side": "suite"}, "the suite as set")}
        return {"ref": ({"side": "ref", "ref": self.ref}, f"{self.ref} ({commit[:10]})"),
                "new": ({"side": "working tree", "ref": self.ref}, "working tree")}

    def measure_suite(self, commit: str | None, working: Launcher, lock: MeasurementLock,
                      store_path: Path) -> tuple[str, str, list[PointVerdict]]:
        """Both sides measured under the machine's lock, from the probe on (the probe and the server's imports
        are work on the machine too); the reference's run, the working tree's, and the verdicts as measured."""
        opts = self.options
        machine = self.machine or working.probe_machine()
        suite, overrides = opts.suite_on(machine)
        current = collect(machine, suite.suite_hash, overrides)
        reference = current if commit is None else {**current, "git": commit_state(commit, self.ref)}
        key = machine_key(current)
        runnable = [point for point in suite.points if machine.skip_reason(point.config) is None]
        design = self.design(len(runnable), suite.repeats)
        sides = self.sides(suite, commit)
        with self.reference_tree(commit) as trees, Store.open(store_path) as store:
            label = opts.label or (f"against {self.ref}" if commit else "against")
            ref_run = store.create_run(suite.name, suite.suite_hash,
                                       {**reference, "against": sides["ref"][0],
                                        **pairing_entry("ref", None, design)}, key, f"{label}: {sides['ref'][1]}")
            new_run = store.create_run(suite.name, suite.suite_hash,
                                       {**current, "against": {**sides["new"][0], "ref_run": ref_run},
                                        **pairing_entry("new", ref_run, design)}, key, f"{label}: {sides['new'][1]}")
            lock.update(run_id=new_run)
            self.console.print(f"runs {ref_run} ({sides['ref'][1]}) and {new_run} ({sides['new'][1]}): "
                               f"suite {suite.name}, {len(suite.points)} points, store {store.path}", markup=False)
            try:
                verdicts = self.measure(store, suite, machine, trees, working, ref_run, new_run, design)
                measure_run_peaks(store, key, new_run, self.say)
            except KeyboardInterrupt:
                for run_id in (ref_run, new_run):
                    store.finish_run(run_id, "interrupted")
                raise
            for run_id in (ref_run, new_run):
                store.finish_run(run_id, "complete")
        return ref_run, new_run, verdicts

    @contextlib.contextmanager
    def reference_tree(self, commit: str | None) -> Iterator[dict[str, Path] | None]:
        """Checkouts of the reference commit and of the working tree's state side by side (twin_worktrees); None
        where both sides run the working tree ([against])."""
        if commit is None:
            yield None
            return
        with twin_worktrees(commit, self.say) as trees:
            yield trees

    def conclude(self, store_path: Path, ref_run: str, new_run: str, verdicts: list[PointVerdict]) -> int:
        """The report of the working tree against the reference, its verdicts printed; the exit code."""
        opts = self.options
        from reports.formatting import print_verdicts
        from reports.render import render
        from decisions.rundata import load_run

        # the verdicts shown are the report's, judged from the store by the design stored there
        report_dir = opts.out_dir / new_run / "report"
        with Store.open(store_path, readonly=True) as store:
            candidate, baseline = load_run(store, new_run), load_run(store, ref_run, "baseline")
        code, judged, _ = render(candidate, str(report_dir), baseline, opts.threshold, opts.alpha,
                                 fail_on_inconclusive=opts.fail_on_inconclusive)
        print_verdicts(self.console, judged)
        reference = self.ref if self.ref is not None else "its [against] settings"
        self.console.print(f"report: {report_dir} (the {'working tree' if self.ref else 'suite'} against {reference}); "
                           f"`rlperf report {store_path}::{new_run} --baseline {store_path}::{ref_run}` judges again",
                           markup=False)
        return 1 if any(v.status == "failed" for v in verdicts) else code

    def design(self, points: int, suite_repeats: int) -> Design:
        """How each point's pairs are judged: alpha / points each (so the chance of any false claim in the
        run stays within alpha), looks up to `max_repeats` pairs with until_decided, else one look after the
        suite's repeats (or --repeats) in pairs."""
        opts = self.options
        alpha = opts.alpha / max(1, points)
        if self.until_decided:
            return Design.plan(opts.max_repeats, alpha, sides=2, threshold=opts.threshold)
        pairs = opts.repeats or suite_repeats
        return Design((pairs,), alpha, sides=2, threshold=opts.threshold, futility_from=pairs)

    def measure(self, store: Store, suite: suites.Suite, machine: Machine, trees: dict[str, Path] | None,
                working: Launcher, ref_run: str, new_run: str, design: Design) -> list[PointVerdict]:
        """Each point's pairs: each side's processes start in its checkout (both in the working tree, as the
        suite's, where the sides differ by [against]'s settings), from one server."""
        opts = self.options
        utilization = UtilizationProbe(opts.sample_hz_for(suite))
        timeout = opts.timeout_for(suite)
        trees = trees or {"ref": working.cwd, "new": working.cwd}
        with working.beside(trees["ref"]) as baseline, working.beside(trees["new"]) as new:
            sides = {"ref": PointRunner(opts.out_dir / ref_run, design.max_pairs, timeout, utilization,
                                        trainer_command, baseline, side="ref"),
                     "new": PointRunner(opts.out_dir / new_run, design.max_pairs, timeout, utilization,
                                        trainer_command, new, side="new")}
            return self.measure_pairs(store, suite, machine, ref_run, new_run, design, sides)

    def measure_pairs(self, store: Store, suite: suites.Suite, machine: Machine, ref_run: str, new_run: str,
                      design: Design, sides: dict[str, PointRunner]) -> list[PointVerdict]:
        opts = self.options
        pairing = Pairing(sides, design, self.say)
        if math.isinf(pairing.fewest_decisive()):
            self.console.print(f"note: {design.max_pairs} pairs a point cannot reach alpha {design.alpha:.2g} "
                               f"(alpha / points) with the exact paired test: no claim is possible; "
                               f"--until-decided or more --repeats make one possible")
        verdicts = []
        budget = opts.budget_s if self.until_decided else math.inf
        for index, point in enumerate(suite.points):
            reason = machine.skip_reason(point.config)
            if reason is not None:
                for side, run_id in (("ref", ref_run), ("new", new_run)):
                    store.record_point(run_id, PointRecord(point.key, point.config_for(side), "skipped", utc_now(),
                                                           0.0, reason=reason))
                self.console.print(f"skipped {point.label}: {reason}")
                continue
            records = {side: PointRecord(point.key, point.config_for(side), "ok", utc_now(), 0.0) for side in sides}
            verdict = pairing.measure(index, point, records, machine.gpu_uuids(point.config),
                                      time.monotonic() + budget)
            for side, run_id in (("ref", ref_run), ("new", new_run)):
                store.record_point(run_id, records[side])
            verdicts.append(verdict)
        return verdicts
