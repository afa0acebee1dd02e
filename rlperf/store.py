"""The SQLite results store: every run, point and sample the harness measured, written as it happens.

Writes are one transaction per finished point, in WAL mode with full syncs, so killing the writer at any
moment loses at most the point in flight and leaves a store that opens cleanly. Readers (reports,
comparisons, pandas users) use the reading methods here and never write SQL of their own.
The schema is documented in docs/results-format.md, "Results store".
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator
from urllib.parse import quote

import pandas as pd

from rlperf.errors import BadInput, fault, is_machine_fault, output_dir
from rlperf.summary import RunSummary

# "RLPF": marks a SQLite file as an rlperf store, so a stray database is refused rather than misread.
APPLICATION_ID = 0x524C5046
SCHEMA_VERSION = 1
RUN_STATUSES = ("running", "complete", "interrupted")
POINT_STATUSES = ("ok", "failed", "skipped", "timeout")

# Added after version 1 was first written, as a table older readers never look at: a store without it is
# still version 1 (it gains the table when opened for writing), and reads as having no peaks.
PEAKS_TABLE = """
CREATE TABLE IF NOT EXISTS peaks (
    machine_key TEXT NOT NULL,
    run_id TEXT REFERENCES runs(run_id),
    measured_at TEXT NOT NULL,
    device_name TEXT NOT NULL,
    threads INTEGER NOT NULL,
    op TEXT NOT NULL,
    dtype TEXT NOT NULL,
    shape TEXT NOT NULL,
    value REAL NOT NULL,
    unit TEXT NOT NULL,
    samples TEXT NOT NULL,
    method TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS peaks_by_machine ON peaks (machine_key);
"""
# Added to `samples` after version 1 was first written: a store without it is still version 1, gains it when
# opened for writing, and reads each sample's memory from its summary (none in summaries written before it).
SAMPLES_MEMORY_COLUMN = "ALTER TABLE samples ADD COLUMN memory TEXT"
SCHEMA = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    suite TEXT NOT NULL,
    suite_hash TEXT NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    status TEXT NOT NULL CHECK (status IN ('running', 'complete', 'interrupted')),
    fingerprint TEXT NOT NULL,
    machine_key TEXT NOT NULL,
    git_commit TEXT,
    git_dirty INTEGER,
    label TEXT
);
CREATE TABLE points (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    point_key TEXT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed', 'skipped', 'timeout')),
    reason TEXT,
    started_at TEXT NOT NULL,
    seconds REAL NOT NULL,
    PRIMARY KEY (run_id, point_key)
);
CREATE TABLE samples (
    run_id TEXT NOT NULL,
    point_key TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    sps REAL,
    sps_end_to_end REAL,
    warmup_seconds REAL,
    wall_seconds REAL,
    phases TEXT NOT NULL,
    mean_episode_return REAL,
    summary TEXT NOT NULL,
    memory TEXT,
    PRIMARY KEY (run_id, point_key, repeat),
    FOREIGN KEY (run_id, point_key) REFERENCES points(run_id, point_key)
);
CREATE TABLE utilization (
    run_id TEXT NOT NULL,
    point_key TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    t_ns INTEGER NOT NULL,
    source TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL
);
CREATE INDEX utilization_by_point ON utilization (run_id, point_key, repeat);
CREATE TABLE collectives (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    op TEXT NOT NULL,
    backend TEXT NOT NULL,
    world_size INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    repeat INTEGER NOT NULL,
    time_us REAL NOT NULL,
    algbw_gbps REAL,
    busbw_gbps REAL
);
CREATE TABLE traces (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    point_key TEXT NOT NULL,
    path TEXT NOT NULL,
    summary TEXT NOT NULL
);
""" + PEAKS_TABLE

EXPORT_EXTENSIONS = (".csv", ".parquet", ".json")
PEAK_COLUMNS = ("device_name", "threads", "op", "dtype", "shape", "value", "unit", "samples", "method")
PEAK_JSON_COLUMNS = ("shape", "samples", "method")
COLLECTIVE_COLUMNS = ("op", "backend", "world_size", "bytes", "repeat", "time_us", "algbw_gbps", "busbw_gbps")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def point_label(values: dict[str, Any] | str) -> str:
    """A point's name wherever one is shown: `dtype=bf16, num_envs=64` from its swept values, or from its
    stored key (their canonical JSON); `default` when nothing is swept."""
    if isinstance(values, str):
        values = json.loads(values) if values else {}
    return ", ".join(f"{name}={plain(value)}" for name, value in values.items()) or "default"


def plain(value: Any) -> str:
    """A setting's value as a point label shows it: `true`, `4,84,84`, `{learn=5.0}`."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={plain(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


@dataclass
class PointRecord:
    """One finished point: its row, its samples (repeat, trainer summary) and its utilization series."""

    point_key: str
    config: dict[str, Any]
    status: str
    started_at: str
    seconds: float
    reason: str | None = None
    samples: list[tuple[int, RunSummary | dict[str, Any]]] = field(default_factory=list)
    utilization: list[tuple[int, int, str, str, float]] = field(default_factory=list)


class Store:
    """A results store file. Open it with `Store.open`; `readonly=True` for readers."""

    def __init__(self, path: Path, connection: sqlite3.Connection, readonly: bool):
        self.path = path
        self._db = connection
        self.readonly = readonly

    # ---- opening ---------------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path, readonly: bool = False) -> "Store":
        path = Path(path)
        if path.is_dir():
            raise not_a_store(path, f"a directory; name the store file in it, e.g. {path / 'results.sqlite'}")
        if not path.is_file() and (readonly or path.exists()):
            raise not_a_store(path, "no such file")
        with faults(path):
            try:
                if readonly:
                    db = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
                else:
                    db = sqlite3.connect(path, timeout=30)
                app_id = db.execute("PRAGMA application_id").fetchone()[0]
                version = db.execute("PRAGMA user_version").fetchone()[0]
                tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            except sqlite3.DatabaseError as exc:
                if is_machine_fault(exc):
                    raise
                raise not_a_store(path, str(exc)) from None
            if app_id == 0 and not tables and not readonly:
                cls._create_schema(db)
            elif app_id != APPLICATION_ID:
                db.close()
                raise not_a_store(path, "a SQLite file that rlperf did not write")
            elif version != SCHEMA_VERSION:
                db.close()
                raise not_a_store(path, f"schema version {version}; this rlperf reads version {SCHEMA_VERSION}")
            if not readonly:
                db.execute("PRAGMA journal_mode = WAL")
                db.execute("PRAGMA synchronous = FULL")
                if "peaks" not in tables and tables:
                    db.executescript(PEAKS_TABLE)
                if tables and "memory" not in table_columns(db, "samples"):
                    with db:
                        db.execute(SAMPLES_MEMORY_COLUMN)
            db.execute("PRAGMA foreign_keys = ON")
        return cls(path, db, readonly)

    @staticmethod
    def _create_schema(db: sqlite3.Connection) -> None:
        with db:
            db.executescript(
                "BEGIN;" + SCHEMA + f"PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"
                "COMMIT;"
            )

    def close(self) -> None:
        if not self.readonly:
            # Back to a single self-contained file, which readers open without leaving -wal/-shm files
            # behind; while another connection still reads, the switch is refused and WAL stays.
            try:
                self._db.execute("PRAGMA journal_mode = DELETE")
            except sqlite3.OperationalError:
                pass
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- writing ---------------------------------------------------------------------------------------

    def create_run(self, suite: str, suite_hash: str, fingerprint: dict[str, Any], machine_key: str,
                   label: str | None = None) -> str:
        """Starts a run (status `running`) and returns its id."""
        run_id = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{suite}-{uuid.uuid4().hex[:6]}"
        git = fingerprint.get("git") or {}
        dirty = git.get("dirty")
        with faults(self.path), self._db:
            self._db.execute(
                "INSERT INTO runs (run_id, suite, suite_hash, started_at, status, fingerprint, machine_key,"
                " git_commit, git_dirty, label) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)",
                (run_id, suite, suite_hash, utc_now(), json.dumps(fingerprint), machine_key, git.get("commit"),
                 None if dirty is None else int(dirty), label),
            )
        return run_id

    def record_point(self, run_id: str, record: PointRecord) -> None:
        """Writes a point with all its samples and utilization rows in one transaction."""
        if record.status not in POINT_STATUSES:
            raise ValueError(f"point status must be one of {POINT_STATUSES}, not {record.status!r}")
        with faults(self.path), self._db:
            self._db.execute(
                "INSERT INTO points (run_id, point_key, config, status, reason, started_at, seconds)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, record.point_key, json.dumps(record.config), record.status, record.reason,
                 record.started_at, record.seconds),
            )
            self._db.executemany(
                "INSERT INTO samples (run_id, point_key, repeat, sps, sps_end_to_end, warmup_seconds, wall_seconds,"
                " phases, mean_episode_return, summary, memory) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (run_id, record.point_key, repeat, summary.sps, summary.sps_end_to_end, summary.warmup_seconds,
                     summary.wall_seconds, json.dumps(summary.phases), summary.mean_episode_return,
                     json.dumps(summary.to_dict()), None if summary.memory is None else json.dumps(summary.memory))
                    for repeat, summary in ((repeat, RunSummary.read(given)) for repeat, given in record.samples)
                ],
            )
            self._db.executemany(
                "INSERT INTO utilization (run_id, point_key, repeat, t_ns, source, metric, value)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(run_id, record.point_key, *row) for row in record.utilization],
            )

    def finish_run(self, run_id: str, status: str) -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {RUN_STATUSES}, not {status!r}")
        with faults(self.path), self._db:
            self._db.execute("UPDATE runs SET status = ?, finished_at = ? WHERE run_id = ?", (status, utc_now(), run_id))

    def reopen_run(self, run_id: str) -> None:
        """Marks an unfinished run as running again (`--resume`)."""
        with faults(self.path), self._db:
            self._db.execute("UPDATE runs SET status = 'running', finished_at = NULL WHERE run_id = ?", (run_id,))

    def add_collectives(self, run_id: str, rows: Iterable[dict[str, Any]]) -> None:
        """Writes collective-bandwidth measurements (keys: COLLECTIVE_COLUMNS) in one transaction."""
        self.require_run(run_id)
        with faults(self.path), self._db:
            self._db.executemany(
                f"INSERT INTO collectives (run_id, {', '.join(COLLECTIVE_COLUMNS)})"
                f" VALUES (?, {', '.join('?' for _ in COLLECTIVE_COLUMNS)})",
                [(run_id, *(row[name] for name in COLLECTIVE_COLUMNS)) for row in rows],
            )

    def add_peaks(self, machine_key: str, rows: Iterable[dict[str, Any]], run_id: str | None = None) -> None:
        """Writes measured peaks (keys: PEAK_COLUMNS) of the machine `machine_key` in one
        transaction; `run_id` names the run they were measured for (none for `rlperf probe`)."""
        if run_id is not None:
            self.require_run(run_id)
        measured_at = utc_now()
        with faults(self.path), self._db:
            self._db.executemany(
                f"INSERT INTO peaks (machine_key, run_id, measured_at, {', '.join(PEAK_COLUMNS)})"
                f" VALUES (?, ?, ?, {', '.join('?' for _ in PEAK_COLUMNS)})",
                [(machine_key, run_id, measured_at,
                  *(json.dumps(row[name]) if name in PEAK_JSON_COLUMNS else row[name] for name in PEAK_COLUMNS))
                 for row in rows],
            )

    def add_trace(self, run_id: str, point_key: str, path: str, summary: dict[str, Any]) -> None:
        self.require_run(run_id)
        with faults(self.path), self._db:
            self._db.execute("INSERT INTO traces (run_id, point_key, path, summary) VALUES (?, ?, ?, ?)",
                             (run_id, point_key, path, json.dumps(summary)))

    # ---- reading ---------------------------------------------------------------------------------------

    def runs(self) -> pd.DataFrame:
        frame = self._frame("SELECT * FROM runs ORDER BY started_at, rowid")
        return parse_json_columns(frame, "fingerprint")

    def latest_run(self, suite: str | None = None) -> str:
        sql, params = "SELECT run_id FROM runs", ()
        if suite is not None:
            sql, params = sql + " WHERE suite = ?", (suite,)
        row = self._db.execute(sql + " ORDER BY started_at DESC, rowid DESC LIMIT 1", params).fetchone()
        if row is None:
            which = f"of suite {suite!r} " if suite else ""
            raise BadInput(f"store: {self.path} has no runs {which}yet (run `rlperf bench` first)")
        return row[0]

    def resumable_run(self, suite: str, suite_hash: str, machine_key: str) -> str | None:
        """The newest unfinished run of this exact suite file on this kind of machine, if any."""
        row = self._db.execute(
            "SELECT run_id FROM runs WHERE suite = ? AND suite_hash = ? AND machine_key = ?"
            " AND status != 'complete' ORDER BY started_at DESC, rowid DESC LIMIT 1",
            (suite, suite_hash, machine_key),
        ).fetchone()
        return None if row is None else row[0]

    def finished_point_keys(self, run_id: str) -> set[str]:
        return {row[0] for row in self._db.execute("SELECT point_key FROM points WHERE run_id = ?", (run_id,))}

    def stored_repeats(self, run_id: str) -> int | None:
        """Repeats per point of the run's finished points (None before any point finished): a resumed run
        must keep it, or its points would not be alike."""
        row = self._db.execute(
            "SELECT MAX(s.repeat) + 1 FROM samples s JOIN points p USING (run_id, point_key)"
            " WHERE s.run_id = ? AND p.status = 'ok'", (run_id,)).fetchone()
        return row[0]

    def fingerprint(self, run_id: str) -> dict[str, Any]:
        self.require_run(run_id)
        return json.loads(self._db.execute("SELECT fingerprint FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0])

    def points(self, run_id: str) -> pd.DataFrame:
        self.require_run(run_id)
        frame = self._frame("SELECT * FROM points WHERE run_id = ? ORDER BY rowid", (run_id,))
        return parse_json_columns(frame, "config")

    def samples(self, run_id: str) -> pd.DataFrame:
        """Every sample of the run, `summary` read as a RunSummary; `memory` is the summary's (None where not
        measured), also in stores opened read-only from before the column was added."""
        self.require_run(run_id)
        frame = self._frame("SELECT * FROM samples WHERE run_id = ? ORDER BY rowid", (run_id,))
        frame = parse_json_columns(frame, "phases", "summary")
        frame["summary"] = frame["summary"].map(RunSummary.read)
        stored = frame["memory"] if "memory" in frame else pd.Series(None, index=frame.index, dtype=object)
        memory = [json.loads(text) if isinstance(text, str) else summary.memory
                  for text, summary in zip(stored, frame["summary"])]
        frame["memory"] = pd.Series(memory, index=frame.index, dtype=object)
        return frame

    def utilization(self, run_id: str) -> pd.DataFrame:
        self.require_run(run_id)
        return self._frame("SELECT * FROM utilization WHERE run_id = ? ORDER BY rowid", (run_id,))

    def collectives(self, run_id: str) -> pd.DataFrame:
        self.require_run(run_id)
        return self._frame("SELECT * FROM collectives WHERE run_id = ? ORDER BY rowid", (run_id,))

    def traces(self, run_id: str) -> pd.DataFrame:
        self.require_run(run_id)
        frame = self._frame("SELECT * FROM traces WHERE run_id = ? ORDER BY rowid", (run_id,))
        return parse_json_columns(frame, "summary")

    def peaks(self, machine_key: str | None = None) -> pd.DataFrame:
        """Every peak measured on the machine `machine_key` (all machines' when None), oldest first; `shape`,
        `samples` and `method` parsed. A store written before peaks were kept has none."""
        if not self._has_table("peaks"):
            return pd.DataFrame(columns=["machine_key", "run_id", "measured_at", *PEAK_COLUMNS])
        sql, params = "SELECT * FROM peaks", ()
        if machine_key is not None:
            sql, params = sql + " WHERE machine_key = ?", (machine_key,)
        return parse_json_columns(self._frame(sql + " ORDER BY rowid", params), *PEAK_JSON_COLUMNS)

    def row_counts(self) -> dict[str, int]:
        tables = ("runs", "points", "samples", "utilization", "collectives", "traces", "peaks")
        return {table: self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] if self._has_table(table) else 0
                for table in tables}

    def export(self, run_id: str, path: str | Path) -> Path:
        """Writes one row per sample (failed and skipped points as rows without figures), with the point's
        config and phases as flat columns, as .csv, .parquet or .json (records) by the path's extension."""
        path = Path(path)
        check_export_path(path)
        table = self.flat_table(run_id)
        try:
            if path.suffix == ".csv":
                table.to_csv(path, index=False)
            elif path.suffix == ".parquet":
                table.to_parquet(path, index=False)
            else:
                table.to_json(path, orient="records", indent=1)
        except OSError as exc:
            path.unlink(missing_ok=True)  # half a table would read as a whole one
            raise fault(path, exc) from None
        return path

    def flat_table(self, run_id: str) -> pd.DataFrame:
        points = self.points(run_id)
        samples = self.samples(run_id).drop(columns=["run_id", "summary"])
        table = points.drop(columns=["config"]).merge(samples, on="point_key", how="left")
        phases = pd.json_normalize(table.pop("phases").map(lambda p: p if isinstance(p, dict) else {}).tolist())
        memory = pd.json_normalize(table.pop("memory").map(lambda m: m if isinstance(m, dict) else {}).tolist(),
                                   max_level=0)
        configs = pd.json_normalize(points.set_index("point_key").loc[table["point_key"], "config"].tolist(),
                                    max_level=0)
        flat = pd.concat([table.reset_index(drop=True), phases.add_prefix("phase."), memory.add_prefix("memory."),
                          configs.add_prefix("config.")], axis=1)
        for column in flat.columns:
            if flat[column].map(lambda v: isinstance(v, (dict, list))).any():
                flat[column] = flat[column].map(json.dumps)
        return flat

    # ---- internals -------------------------------------------------------------------------------------

    def _has_table(self, name: str) -> bool:
        return self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() \
            is not None

    def _frame(self, sql: str, params: tuple = ()) -> pd.DataFrame:
        return pd.read_sql_query(sql, self._db, params=params)

    def require_run(self, run_id: str) -> None:
        if self._db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
            known = [row[0] for row in self._db.execute("SELECT run_id FROM runs ORDER BY rowid DESC LIMIT 5")]
            raise BadInput(f"run: no run {run_id!r} in {self.path} (newest: {', '.join(known) or 'none'})")


def table_columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def parse_json_columns(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    for column in columns:
        frame[column] = frame[column].map(lambda text: None if text is None else json.loads(text))
    return frame


def check_export_path(path: Path) -> None:
    """Refuses an export that could not be written, before anything is measured."""
    if path.suffix not in EXPORT_EXTENSIONS:
        raise BadInput(f"export: {path} has an unknown extension (allowed: {', '.join(EXPORT_EXTENSIONS)})")
    if path.is_dir():
        raise BadInput(f"export: {path} is a directory; name a file")
    output_dir(path.parent, "export")


@contextmanager
def faults(path: Path) -> Iterator[None]:
    """A write the machine refuses (read-only file system, disk full) ends as one MachineFault naming the
    store; SQLite has rolled the transaction back, so the store keeps its last committed state."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if is_machine_fault(exc):
            raise fault(path, exc) from None
        raise


def not_a_store(path: Path, why: str) -> BadInput:
    return BadInput(f"store: {path} is not an rlperf results store ({why})")


def open_results(argument: str) -> tuple[Store, str]:
    """Opens a RESULTS argument (`PATH` or `PATH::RUN_ID`) read-only; returns the store and the run to use
    (the latest one when none is named)."""
    path, sep, run_id = argument.partition("::")
    store = Store.open(path, readonly=True)
    if sep and run_id:
        store.require_run(run_id)
        return store, run_id
    return store, store.latest_run()
