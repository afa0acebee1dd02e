"""A sweep from suite file to stored run: check everything, record the points this machine cannot run,
run the rest one by one with live progress, then print their summary and export it; `rlperf bench` renders the
report after."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from benches import suite as suites
from benches.options import ProcessOptions
from benches.peak_probe import measure_run_peaks
from benches.runner import Launcher, PointRunner, UtilizationProbe, trainer_command
from reference_trainer.config import EVERY_PHASE
from rlperf.summary import OTHER
from decisions.intervals import fewest_repeats
from decisions.rundata import summarize_points
from reports.memory import fmt_bytes, peak_of
from rlperf.errors import BadInput, MachineFault, fault, is_machine_fault, output_dir
from rlperf.layout import STORE_FILE
from rlperf.lock import MeasurementLock
from rlperf.machine import Machine, collect, machine_key, measured_repository
from rlperf.store import PointRecord, Store, check_export_path, plain, utc_now
from rlperf.terminal import default_console, say_on

# Phases under this share in every point are left out of the terminal table (they stay in the store).
MIN_SHOWN_SHARE = 0.005
# Space held beside the store while a sweep runs and given back when the disk fills, so the run can still
# be marked interrupted (one row update, a few WAL pages).
RESERVE_BYTES = 256 * 1024


class Sweep:
    """A sweep of `options.suite`; with `resume`, the newest unfinished run of the suite continued; with
    `export`, its samples also written as a flat table."""

    def __init__(self, options: ProcessOptions, console: Console | None = None,
                 command_for: Callable[[dict[str, Any], Path], list[str]] = trainer_command,
                 machine: Machine | None = None, resume: bool = False, export: Path | None = None):
        self.options = options
        self.resume = resume
        self.export = export
        self.console = console or default_console()
        self.say = say_on(self.console)
        self.command_for = command_for
        self.machine = machine
        self.store_path: Path | None = None  # where run() stored its run, and the run's id
        self.run_id: str | None = None

    def run(self) -> int:
        opts = self.options
        suite = suites.load(opts.suite)  # a bad suite stops here, before the machine or the store is touched
        suite.refuse_against("a sweep of one side")
        if self.export is not None:
            check_export_path(self.export)
        output_dir(opts.out_dir, "out")
        store_path = opts.out_dir / STORE_FILE
        with MeasurementLock() as lock, Launcher(opts.launch_for(suite)) as launcher:
            lock.acquire(opts.wait, self.say, suite=suite.name, store=str(store_path.resolve()))
            return self.measure_suite(launcher, lock, store_path)

    def measure_suite(self, launcher: Launcher, lock: MeasurementLock, store_path: Path) -> int:
        """The suite measured under the machine's lock, from the probe on: the probe and the server's imports are
        work on the machine too, and they must not load a measurement that holds the lock."""
        opts = self.options
        machine = self.machine or launcher.probe_machine()
        suite, overrides = opts.suite_on(machine)
        fingerprint = collect(machine, suite.suite_hash, overrides)
        key = machine_key(fingerprint)
        with Reserve(opts.out_dir) as reserve, Store.open(store_path) as store:
            run_id, done = self.start_run(store, suite, fingerprint, key)
            lock.update(run_id=run_id)
            try:
                self.record_skipped(store, run_id, suite, machine, done)
                self.run_points(store, run_id, suite, machine, done, launcher)
                measure_run_peaks(store, key, run_id, self.say)
            except KeyboardInterrupt:
                store.finish_run(run_id, "interrupted")
                stored = len(store.finished_point_keys(run_id))
                self.console.print(f"interrupted: {stored} of {len(suite.points)} points are stored; "
                                   f"`{self.resume_command()}` continues")
                raise
            except (MachineFault, OSError, sqlite3.OperationalError) as exc:
                if not isinstance(exc, MachineFault) and not is_machine_fault(exc):
                    raise
                raise self.interrupted_by_fault(store, run_id, suite, reserve, exc) from None
            store.finish_run(run_id, "complete")
            failed = self.print_summary(store, run_id, suite)
            if self.export is not None:
                self.console.print(f"exported {store.export(run_id, self.export)}")
        self.store_path, self.run_id = store_path, run_id
        return 1 if failed else 0

    def resume_command(self) -> str:
        return f"rlperf bench --suite {self.options.suite} --out {self.options.out_dir} --resume"

    def interrupted_by_fault(self, store: Store, run_id: str, suite: suites.Suite, reserve: "Reserve",
                             exc: BaseException) -> MachineFault:
        """Marks the run interrupted after the machine refused a write; the fault's one line says so."""
        problem = exc if isinstance(exc, MachineFault) else fault(None, exc)
        reserve.release()
        try:
            store.finish_run(run_id, "interrupted")
        except MachineFault as again:
            return MachineFault(f"{problem}; run {run_id} could not be marked interrupted either ({again})")
        stored = len(store.finished_point_keys(run_id))
        return MachineFault(f"{problem}; run {run_id} is marked interrupted with {stored} of {len(suite.points)} "
                            f"points stored; `{self.resume_command()}` continues it")

    def start_run(self, store: Store, suite: suites.Suite, fingerprint: dict[str, Any],
                  key: str) -> tuple[str, set[str]]:
        if self.resume:
            run_id = store.resumable_run(suite.name, suite.suite_hash, key)
            if run_id is not None:
                repeats = self.options.repeats or suite.repeats
                stored = store.stored_repeats(run_id)
                if stored is not None and stored != repeats:
                    raise BadInput(f"repeats: run {run_id} was measured with {stored} repeats per point; resume it "
                                   f"with --repeats {stored}, or start a new run without --resume")
                store.reopen_run(run_id)
                done = store.finished_point_keys(run_id)
                self.console.print(f"resuming run {run_id}: {len(done)} of {len(suite.points)} points already stored")
                return run_id, done
            self.console.print(f"--resume: no unfinished run of suite {suite.name} (hash {suite.suite_hash}) "
                               f"on this machine in {store.path}; starting a new run")
        run_id = store.create_run(suite.name, suite.suite_hash, fingerprint, key, self.options.label)
        self.console.print(f"run {run_id}: suite {suite.name}, {len(suite.points)} points, store {store.path}")
        return run_id, set()

    def record_skipped(self, store: Store, run_id: str, suite: suites.Suite, machine: Machine, done: set[str]) -> None:
        for point in suite.points:
            reason = machine.skip_reason(point.config)
            if reason is not None and point.key not in done:
                store.record_point(run_id, PointRecord(point_key=point.key, config=point.config, status="skipped",
                                                       started_at=utc_now(), seconds=0.0, reason=reason))
                done.add(point.key)
                self.console.print(f"skipped {point.label}: {reason}")

    def run_points(self, store: Store, run_id: str, suite: suites.Suite, machine: Machine, done: set[str],
                   launcher: Launcher) -> None:
        opts = self.options
        todo = [(index, point) for index, point in enumerate(suite.points) if point.key not in done]
        utilization = UtilizationProbe(opts.sample_hz_for(suite))
        if not todo:
            return
        runner = PointRunner(opts.out_dir / run_id, opts.repeats or suite.repeats, opts.timeout_for(suite),
                             utilization, self.command_for, launcher)
        self.measure_points(store, run_id, suite, machine, todo, runner, utilization)

    def measure_points(self, store: Store, run_id: str, suite: suites.Suite, machine: Machine,
                       todo: list[tuple[int, suites.Point]], runner: PointRunner,
                       utilization: UtilizationProbe) -> None:
        reported_unavailable = False
        started = time.monotonic()
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("ETA {task.fields[eta]}"), TextColumn("{task.fields[last]}"))
        with Progress(*columns, console=self.console) as progress:
            task = progress.add_task("", total=len(todo), eta="?", last="")
            for number, (index, point) in enumerate(todo, start=1):
                progress.update(task, description=f"point {number}/{len(todo)} {point.label}")
                record = runner.run(index, point, machine.gpu_uuids(point.config))
                store.record_point(run_id, record)
                if suite.profile and record.status == "ok":
                    self.profile_point(store, run_id, point, runner.point_dir(index, point) / "profile",
                                       machine.gpu_uuids(point.config), progress.console, runner.timeout_s)
                elapsed = time.monotonic() - started
                remaining = elapsed / number * (len(todo) - number)
                last = point_result_text(record)
                progress.update(task, advance=1, eta=format_seconds(remaining), last=f"last: {last}")
                progress.console.print(f"[{number}/{len(todo)}] {point.label}: {last} ({record.seconds:.1f} s)")
                if record.status != "ok":
                    progress.console.print(f"    {record.reason.splitlines()[-1] if record.reason else ''}",
                                           markup=False)
                if utilization.unavailable and not reported_unavailable:
                    progress.console.print(f"utilization: {utilization.unavailable}")
                    reported_unavailable = True

    def profile_point(self, store: Store, run_id: str, point: suites.Point, out_dir: Path, gpu_uuids: list[str],
                      console: Console, timeout_s: float) -> None:
        """One extra traced run of the point (the suite's `profile = true`): the reference trainer's, or a
        command's, attached and traced through rlperf.phases; its trace and summary go to the traces table, its
        SPS nowhere."""
        from profilers.profile_run import profile_command, profile_run
        from reference_trainer.config import from_dict

        out_dir.mkdir(parents=True, exist_ok=True)
        if "command" in point.config:
            try:
                # twice a repeat's time: the traced run also imports torch and starts its profiler
                result = profile_command(point.config, out_dir, gpu_uuids=gpu_uuids, timeout_s=2 * timeout_s,
                                         cwd=measured_repository(), log=out_dir / "command.log")
            except BadInput as exc:  # a command that is not found: its measured repeats have said so
                console.print(f"    profile: {exc}", markup=False)
                return
        else:
            result = profile_run(from_dict(point.config), out_dir, gpu_uuids=gpu_uuids)
        for message in result.messages:
            console.print(f"    profile: {message}", markup=False)
        if result.returncode == 0:
            store.add_trace(run_id, point.key, result.profile["trace"], result.profile)

    def print_summary(self, store: Store, run_id: str, suite: suites.Suite) -> int:
        """Prints the per-point tables; returns how many points failed or timed out."""
        order = {point.key: index for index, point in enumerate(suite.points)}
        points = store.points(run_id)
        points = points.iloc[points["point_key"].map(lambda key: order.get(key, len(order))).argsort(kind="stable")]
        table_data = summarize_points(points, store.samples(run_id), self.options.threshold, self.options.alpha)
        axes = list(suite.axis_names)
        shown_phases = [phase for phase in (*EVERY_PHASE, OTHER) if f"share.{phase}" in table_data
                        and (table_data[f"share.{phase}"] >= MIN_SHOWN_SHARE).any()]
        # two tables, each of a width a CI log's 160 columns hold: one table of every column cut its headers to
        # "num_e…" and "detec…" and wrapped each row over three lines
        rates = Table(title=f"run {run_id} ({suite.name}): steady SPS per point, median of the repeats")
        shares = Table(title="where the steady time goes (share of each phase) and what the rollout copies")
        for table in (rates, shares):
            for name in axes:
                table.add_column(name)
        for column in ("status", "n", "SPS", "spread", "e2e SPS", "contended", "detects", "peak mem"):
            rates.add_column(column, justify="left" if column == "status" else "right", no_wrap=True)
        for column in ("h2d B/step", "h2d MB/s", *shown_phases):
            shares.add_column(column, justify="right", no_wrap=True)
        for row in table_data.to_dict("records"):
            swept = json.loads(row["point_key"])
            point = [plain(swept[name]) if name in swept else "" for name in axes]
            rates.add_row(*point, row["status"], str(row["repeats"]), format_count(row["sps_median"]),
                          format_spread(row["spread"]), format_count(row["sps_end_to_end"]),
                          format_contended(row["contended"], row["repeats"]),
                          format_detects(row["detects"], self.options.alpha), fmt_bytes(peak_of(row)))
            shares.add_row(*point, format_count(row["h2d_bytes_per_step"]), format_megabytes(row["h2d_mb_per_s"]),
                           *(format_share(row.get(f"share.{phase}")) for phase in shown_phases))
        self.console.print(rates)
        self.console.print(shares)
        self.console.print("spread: (max - min) / median of the repeats; contended: repeats during which other "
                           "processes used the CPU or GPU (left out of verdicts); detects: the smallest slowdown "
                           "these repeats would catch 95% of the time against as many as noisy; h2d: bytes the "
                           "rollout copies host->device per agent step and per second at the median SPS; phase "
                           f"columns: share of steady time. Logs: {self.options.out_dir / run_id / 'points'}", soft_wrap=True)
        contended = int(table_data["contended"].fillna(0).sum())
        if contended:
            self.console.print(f"warning: {contended} repeats ran on a contended machine (another process used the "
                               "CPU or GPU); their figures are not trustworthy and verdicts leave them out. The "
                               "report's 'Was the machine quiet?' section says which and why.", soft_wrap=True)
        return int(table_data["status"].isin(["failed", "timeout"]).sum())


class Reserve:
    """RESERVE_BYTES of disk held in a file beside the store for as long as a sweep runs (see RESERVE_BYTES).
    A disk too full for it fails here, before a run is started."""

    def __init__(self, directory: Path):
        self.path = directory / ".rlperf-reserve"

    def __enter__(self) -> "Reserve":
        try:
            with open(self.path, "wb") as file:
                os.posix_fallocate(file.fileno(), 0, RESERVE_BYTES)
        except OSError as exc:
            self.release()
            raise fault(self.path.parent, exc) from None
        return self

    def release(self) -> None:
        self.path.unlink(missing_ok=True)

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def point_result_text(record: PointRecord) -> str:
    if record.status != "ok":
        return record.status
    sps = pd.Series([summary.sps for _, summary in record.samples])
    return f"{format_count(sps.median())} SPS"


def format_count(value: float | None) -> str:
    return "" if value is None or pd.isna(value) else f"{value:,.0f}"


def format_megabytes(value: float | None) -> str:
    return "" if value is None or pd.isna(value) else f"{value:,.1f}"


def format_spread(value: float | None) -> str:
    return "" if value is None or pd.isna(value) else f"{100 * value:.1f}%"


def format_share(value: float | None) -> str:
    return "" if value is None or pd.isna(value) else f"{100 * value:.0f}%"


def format_contended(count: float | None, repeats: int) -> str:
    return "" if not repeats or count is None or pd.isna(count) else f"{int(count)}/{repeats}"


def format_detects(fraction: float | None, alpha: float) -> str:
    if fraction is None or pd.isna(fraction):
        return ""
    return f"≥{fraction:.0%}" if np.isfinite(fraction) else f"none (<{fewest_repeats(alpha)} repeats)"


def format_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}:{secs:02d}"
