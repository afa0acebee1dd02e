"""Each SPS change point of a store's history measured again (`rlperf confirm`): the commits either side of it in
pairs of processes, stored as runs naming the change point they confirm."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rich.console import Console

from benches.pairing import Pairing
from benches.options import ProcessOptions
from benches.runner import Launcher, PointRunner, UtilizationProbe, trainer_command
from benches.suite import Point
from benches.traced_against import follow_up
from benches.worktrees import checkouts, resolve_commit
from decisions import changepoints
from reports.history import FINISHED, measures_its_moment
from decisions.rundata import load_run
from decisions.sequential import Design, pairing_entry
from rlperf.errors import BadInput
from rlperf.lock import MeasurementLock
from rlperf.machine import REPOSITORY_VARIABLE, collect, commit_state, machine_key, probe
from rlperf.store import PointRecord, Store, utc_now
from rlperf.terminal import say_on


def candidates(store: Store, threshold: float, alpha: float) -> list[tuple[changepoints.ChangePoint, list]]:
    """Every SPS change point of the store's history not yet confirmed, with the history's runs it lies in."""
    runs = store.runs()
    night = runs[runs["status"].isin(FINISHED) & runs["fingerprint"].map(measures_its_moment)]
    confirmed = {(entry["run"], entry["point"]) for entry in
                 (f.get(changepoints.CONFIRMS) for f in runs["fingerprint"]) if entry}
    found = []
    for _, group in night.groupby(["suite", "machine_key"], sort=False):
        loaded = [load_run(store, run_id, "history") for run_id in group["run_id"]]
        for change in changepoints.find(loaded, threshold, alpha):
            if change.metric == changepoints.SPS and (change.run_id, change.key) not in confirmed:
                found.append((change, loaded))
    return found


class Confirm:
    """Every SPS change point of the store at `store_path` not yet confirmed, measured again with `options`."""

    def __init__(self, options: ProcessOptions, store_path: Path, console: Console):
        self.options = options
        self.store_path = store_path
        self.console = console
        self.say = say_on(self.console)
        self.confirmed: list[tuple[dict, dict]] = []  # (point config, commits) of each change confirmed with a phase

    def run(self) -> int:
        opts, store_path = self.options, self.store_path
        with Store.open(store_path, readonly=True) as store:
            found = candidates(store, opts.threshold, opts.alpha)
        if not found:
            self.say("confirm: no change point left to confirm")
            return 0
        outcomes = []
        with MeasurementLock() as lock:
            lock.acquire(opts.wait, self.say, suite="confirm", store=str(store_path.resolve()))
            machine = probe()  # the probe is work on the machine too: under the lock
            for change, runs in found:
                outcomes.append(self.confirm(store_path, machine, change, runs))
        for line in outcomes:
            self.say(line)
        for config, commits in self.confirmed:  # the traced diff that says which operator: the last lines
            follow_up(self.say, config, commits["ref"][:10], commits["new"][:10],
                      str(opts.out_dir / f"traced-diff-{commits['new'][:10]}"), opts.diff, None)
        return 0 if all(line.split(": ", 2)[1].startswith("confirmed") for line in outcomes) else 1

    def confirm(self, store_path: Path, machine, change: changepoints.ChangePoint, runs: list) -> str:
        """One change point measured again; a line saying how it ended."""
        opts = self.options
        before_run, after_run = runs[change.order - 1], runs[change.order]
        name = f"{change.point} at {change.run_id}"
        if before_run.info.get("git_dirty") or after_run.info.get("git_dirty"):
            return f"{name}: undecided: a run either side measured uncommitted changes, which cannot be checked out"
        repository = (after_run.fingerprint.get("git") or {}).get("repository")
        if repository:  # a suite of commands' runs: their commits are its repository's
            os.environ[REPOSITORY_VARIABLE] = repository
        try:
            commits = {side: resolve_commit(run.info["git_commit"] or "", "store")
                       for side, run in (("ref", before_run), ("new", after_run))}
        except BadInput as missing:
            return f"{name}: undecided: {missing}"
        if commits["ref"] == commits["new"]:
            return f"{name}: undecided: both runs measured commit {commits['new'][:10]}: the shift is the machine's"
        points = after_run.points.set_index("point_key")
        point_key = next(key for key in points.index
                         if changepoints.match_key(key, points.loc[key, "config"]) == change.key)
        config = points.loc[point_key, "config"]
        point = Point(point_key, json.loads(point_key), config)
        reason = machine.skip_reason(config)
        if reason is not None:
            return f"{name}: undecided: this machine cannot run it ({reason})"
        design = Design.plan(opts.max_repeats, opts.alpha, sides=2, threshold=opts.threshold)
        fingerprint = collect(machine, after_run.info["suite_hash"])
        key = machine_key(fingerprint)
        # twin checkouts in one folder, as the gate's: the two sides' paths differ in nothing but the code
        with checkouts(dict(commits), self.say) as trees, Launcher(opts.launch, trees["ref"]) as ref_launcher, \
                ref_launcher.beside(trees["new"]) as new_launcher, Store.open(store_path) as store:
            created = {}
            for side, tree_commit in commits.items():
                entry = {**fingerprint, "git": commit_state(tree_commit),
                         **changepoints.confirms_entry(change, point_key),
                         **pairing_entry(side, created.get("ref"), design)}
                created[side] = store.create_run(after_run.suite, after_run.info["suite_hash"], entry, key,
                                                 f"confirm {change.point} at {change.run_id}: {tree_commit[:10]}")
            self.say(f"confirming {name} ({change.sentence()}): {commits['ref'][:10]} against {commits['new'][:10]}")
            runners = {side: PointRunner(opts.out_dir / created[side], design.max_pairs, opts.timeout_s,
                                         UtilizationProbe(0), trainer_command, launcher)
                       for side, launcher in (("ref", ref_launcher), ("new", new_launcher))}
            records = {side: PointRecord(point.key, config, "ok", utc_now(), 0.0) for side in runners}
            try:
                verdict = Pairing(runners, design, self.say).measure(0, point, records,
                                                                      machine.gpu_uuids(config),
                                                                      time.monotonic() + opts.budget_s)
            except KeyboardInterrupt:
                for run_id in created.values():
                    store.finish_run(run_id, "interrupted")
                raise
            for side, run_id in created.items():
                store.record_point(run_id, records[side])
                store.finish_run(run_id, "complete")
        text = changepoints.confirmation_text(change, verdict)
        if text.startswith("confirmed") and verdict.phases_grew:
            self.confirmed.append((config, commits))
        return f"{name}: {text}"
