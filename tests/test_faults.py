"""Faults and first-run mistakes end in one line, never a traceback: bad input exits 2, a fault of the machine
(read-only file system, disk full) exits 1; the store is left unchanged and usable, and a run that was
started is marked interrupted. Every case runs the real command line (`python -m rlperf`) on real stores;
read-only and full file systems are real tmpfs mounts (skipped where mounting is not permitted)."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from rlperf.store import Store
from rlperf.lock import MeasurementLock

TINY_TRAIN = ["--env", "synthetic", "--num-envs", "16", "--horizon", "8", "--minibatch-size", "64",
              "--total-steps", "512"]
FIXED = """
    [fixed]
    device = "cpu"
    env = "synthetic"
    num_envs = 16
    horizon = 8
    minibatch_size = 64
    total_steps = 512
"""
# Two axes of one value each: a point label long enough that an 80-column table would split it.
SUITE = "description = \"faults\"\nrepeats = 1\ntimeout_s = 120\nsample_hz = 0\n" + FIXED + """
    [axes]
    hidden_size = [16]
    update_epochs = [1]
    anneal_lr = [false]
"""
# The second point sleeps a minute in `learn`, so it is always killed at the 15 s timeout: the window in
# which the test fills the disk after the first point is stored.
SLOW_SECOND_POINT = "description = \"disk full\"\nrepeats = 1\ntimeout_s = 15\nsample_hz = 0\n" + FIXED + """
    [[sweep]]
    [[sweep]]
    inject_delay = [{learn = 60000.0}]
"""


def rlperf(*args, lock: Path, cwd: Path | None = None, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLPERF_LOCK": str(lock)}
    return subprocess.run([sys.executable, "-m", "rlperf", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=240, **popen)


def start(*args, lock: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLPERF_LOCK": str(lock)}
    return subprocess.Popen([sys.executable, "-m", "rlperf", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def one_line(done, code: int) -> str:
    """The command failed with `code` and said why in one line on stderr, without a traceback."""
    assert done.returncode == code, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("rlperf"), done.stderr
    return lines[-1]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_suite(directory: Path, text: str, name: str = "faults") -> Path:
    path = directory / f"{name}.toml"
    path.write_text(textwrap.dedent(text))
    return path


@contextmanager
def tmpfs(path: Path, size: str = "8m"):
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def remount_readonly(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def fill(directory: Path) -> Path:
    """Writes a file until the file system is full; tmpfs allocates whole pages, so none are left."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as out:
        for chunk in (1 << 20, 4096):
            try:
                while True:
                    out.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return filler


@pytest.fixture(scope="module")
def lock(tmp_path_factory) -> Path:
    """A lock file of these tests' own, so they neither wait for nor block another sweep on this machine."""
    return tmp_path_factory.mktemp("lock") / "bench.lock"


@pytest.fixture(scope="module")
def stored(tmp_path_factory, lock):
    """A store holding two complete runs of one commit (run ids in order) and the suite they ran."""
    directory = tmp_path_factory.mktemp("stored")
    suite = write_suite(directory, SUITE)
    for _ in range(2):
        done = rlperf("bench", "--suite", str(suite), "--out", str(directory / "runs"), lock=lock)
        assert done.returncode == 0, done.stdout + done.stderr
    store = directory / "runs" / "results.sqlite"
    with Store.open(store, readonly=True) as opened:
        runs = list(opened.runs()["run_id"])
    return store, runs, suite


# ---- output directories and stores on a read-only file system, or an existing file as --out -----------

def out_commands(store: Path, suite: Path, out: Path) -> dict[str, list[str]]:
    return {
        "report": ["report", str(store), "--out", str(out)],
        "compare": ["compare", str(store), str(store), "--out", str(out)],
        "bench": ["bench", "--suite", str(suite), "--out", str(out)],
        "profile": ["profile", *TINY_TRAIN, "--out", str(out)],
    }


@pytest.mark.parametrize("command", ["report", "compare", "bench", "profile"])
def test_out_on_a_read_only_file_system_is_a_fault(command, stored, lock, tmp_path):
    store, runs, suite = stored
    with tmpfs(tmp_path / "ro") as ro:
        remount_readonly(ro)
        before = digest(store)
        line = one_line(rlperf(*out_commands(store, suite, ro / "out")[command], lock=lock), 1)
    assert f"{ro / 'out'}: Read-only file system" in line
    assert digest(store) == before


@pytest.mark.parametrize("command", ["report", "compare", "bench", "profile"])
def test_an_existing_file_as_out_is_refused(command, stored, lock, tmp_path):
    store, runs, suite = stored
    existing = tmp_path / "a-file"
    existing.write_text("mine")
    line = one_line(rlperf(*out_commands(store, suite, existing)[command], lock=lock), 2)
    assert f"out: {existing} exists and is not a directory" in line
    assert existing.read_text() == "mine"


@pytest.mark.parametrize("command", ["bench", "collectives"])
def test_a_store_on_a_read_only_file_system_is_a_fault_and_stays_usable(command, stored, lock, tmp_path):
    store, runs, suite = stored
    with tmpfs(tmp_path / "ro") as ro:
        (ro / "results.sqlite").write_bytes(store.read_bytes())
        remount_readonly(ro)
        args = {"bench": ["bench", "--suite", str(suite), "--out", str(ro)],
                "collectives": ["collectives", "--store", str(ro / "results.sqlite"), "--world-size", "1"]}[command]
        line = one_line(rlperf(*args, lock=lock), 1)
        assert re.search(rf"{re.escape(str(ro))}.*: (Read-only file system|attempt to write a readonly database)",
                         line), line
        assert digest(ro / "results.sqlite") == digest(store)
        done = rlperf("report", str(ro / "results.sqlite"), "--out", str(tmp_path / "report"), lock=lock)
    assert done.returncode == 0, done.stderr


def test_an_export_that_cannot_be_written_is_refused_before_any_point_runs(stored, lock, tmp_path):
    store, runs, suite = stored
    before = digest(store)
    with tmpfs(tmp_path / "ro") as ro:
        remount_readonly(ro)
        line = one_line(rlperf("bench", "--suite", str(suite), "--out", str(store.parent),
                               "--export", str(ro / "x.csv"), lock=lock), 1)
    assert f"export: {ro}: Read-only file system" in line
    assert digest(store) == before  # no run was started


# ---- profile: the trainer's refusal is the whole answer ---------------------------------------------------

@pytest.mark.parametrize("train, field", [(TINY_TRAIN + ["--device", "cuda"], "device"),
                                          (["--env", "gym:NoSuch-v0", "--total-steps", "4096"], "env")],
                         ids=["cuda-on-cpu", "unknown-gym-env"])
def test_profile_ends_with_the_trainers_one_line_error(train, field, lock, tmp_path):
    if field == "device":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    done = rlperf("profile", *train, "--out", str(tmp_path / "p"), lock=lock)
    line = one_line(done, 2)
    assert line.startswith(f"rlperf train: error: {field}:")
    assert "KeyError" not in done.stderr
    assert not (tmp_path / "p").exists()


# ---- bad input: exit 2, the store untouched ---------------------------------------------------------------

def test_a_label_that_is_not_utf8_is_refused_and_the_store_keeps_its_bytes(stored, lock):
    store, runs, suite = stored
    before = digest(store)
    done = subprocess.run([sys.executable, "-m", "rlperf", "bench", "--suite", str(suite), "--out",
                           str(store.parent), "--label", b"\xff\xfe"], capture_output=True, text=True,
                          env={**os.environ, "RLPERF_LOCK": str(lock)})
    assert "argument --label: must be UTF-8 text" in one_line(done, 2)
    assert digest(store) == before
    for label in ("night\nof 28", "\x1b[2Jcleared"):
        refused = rlperf("bench", "--suite", str(suite), "--out", str(store.parent), "--label", label, lock=lock)
        assert "argument --label: must be one line of text without control characters" in one_line(refused, 2)
    collectives = rlperf("collectives", "--label", b"\xff\xfe", "--store", str(store), lock=lock)
    assert "argument --label: must be UTF-8 text" in one_line(collectives, 2)
    assert digest(store) == before


@pytest.mark.parametrize("args, message", [
    (["--timeout", "inf"], "argument --timeout: must be a number above 0 and at most 86400 (got 'inf')"),
    (["--timeout", "1e308"], "argument --timeout: must be a number above 0 and at most 86400 (got '1e308')"),
    (["--timeout", "0"], "argument --timeout: must be a number above 0 and at most 86400 (got '0')"),
    (["--timeout", "-5"], "argument --timeout: must be a number above 0 and at most 86400 (got '-5')"),
    (["--sample-hz", "1e9"], "argument --sample-hz: must be a number from 0 to 100 (got '1e9')"),
])
def test_bench_bounds_name_the_flag_and_the_range(args, message, stored, lock):
    store, runs, suite = stored
    assert message in one_line(rlperf("bench", "--suite", str(suite), "--out", str(store.parent), *args,
                                      lock=lock), 2)


def test_tracing_more_epochs_than_the_run_has_is_refused(lock, tmp_path):
    line = one_line(rlperf("profile", *TINY_TRAIN, "--trace-epochs", "1000", "--out", str(tmp_path / "p"),
                           lock=lock), 2)
    assert "trace_epochs: must be at most the run's 3 steady epochs (got 1000)" in line


def test_a_repeated_axis_value_is_refused(lock, tmp_path):
    suite = write_suite(tmp_path, "repeats = 1\n" + FIXED + "\n[axes]\nnum_envs = [16, 16]\n", "twice")
    line = one_line(rlperf("bench", "--suite", str(suite), "--out", str(tmp_path / "runs"), lock=lock), 2)
    assert "twice.toml: axes.num_envs[1]: repeats the value 16" in line
    assert not (tmp_path / "runs").exists()


def test_a_directory_given_as_the_store_is_named_a_directory(stored, lock):
    store, runs, suite = stored
    line = one_line(rlperf("report", str(store.parent), "--out", str(store.parent / "r"), lock=lock), 2)
    assert f"{store.parent} is not an rlperf results store (a directory;" in line


def test_reporting_a_run_still_running_says_so(stored, lock, tmp_path):
    store, runs, suite = stored
    copy = tmp_path / "results.sqlite"
    copy.write_bytes(store.read_bytes())
    with Store.open(copy) as opened:
        run_id = opened.create_run("faults", "0" * 16, {"git": {}}, "machine")
    line = one_line(rlperf("report", str(copy), "--out", str(tmp_path / "r"), lock=lock), 2)
    assert f"run {run_id} in {copy} is still running" in line


# ---- disk full -------------------------------------------------------------------------------------------

def test_a_full_disk_before_a_bench_starts_no_run(stored, lock, tmp_path):
    store, runs, suite = stored
    with tmpfs(tmp_path / "full", "2m") as full:
        (full / "results.sqlite").write_bytes(store.read_bytes())
        fill(full)
        line = one_line(rlperf("bench", "--suite", str(suite), "--out", str(full), lock=lock), 1)
        assert "No space left on device" in line
        assert digest(full / "results.sqlite") == digest(store)


def test_a_report_on_a_full_disk_leaves_nothing_behind(stored, lock, tmp_path):
    store, runs, suite = stored
    with tmpfs(tmp_path / "full", "1m") as full:
        fill(full)
        line = one_line(rlperf("report", str(store), "--out", str(full / "report"), lock=lock), 1)
        assert "No space left on device" in line
        assert not (full / "report").exists()


def test_a_trainers_outputs_on_a_full_disk_are_one_line_and_leave_no_half_file(lock, tmp_path):
    with tmpfs(tmp_path / "full", "1m") as full:
        fill(full)
        for flag, name in (("--json", "summary.json"), ("--save-policy", "policy.pt")):
            line = one_line(rlperf("train", *TINY_TRAIN, "--quiet", flag, str(full / name), lock=lock), 1)
            assert f"{full / name}: No space left on device" in line
        assert sorted(path.name for path in full.iterdir()) == ["filler"]
    line = one_line(rlperf("train", *TINY_TRAIN, "--quiet", "--save-policy", str(tmp_path), lock=lock), 2)
    assert f"save_policy: {tmp_path} is a directory; name a file" in line


def points_stored(store: Path) -> int:
    if not store.exists():
        return 0
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM points").fetchone()[0]
    except sqlite3.OperationalError:  # the schema is not written yet
        return 0
    finally:
        db.close()


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, lock):
    """A bench whose disk fills while its second point runs: the finished result, the store (on a tmpfs that
    stays full until the fixture ends) and the suite."""
    directory = tmp_path_factory.mktemp("interrupted")
    suite = write_suite(directory, SLOW_SECOND_POINT, "slow")
    with tmpfs(directory / "disk", "16m") as disk:
        store = disk / "results.sqlite"
        bench = start("bench", "--suite", str(suite), "--out", str(disk), lock=lock)
        while bench.poll() is None and not points_stored(store):
            time.sleep(0.1)
        filler = fill(disk)
        out, err = bench.communicate(timeout=120)
        yield subprocess.CompletedProcess(bench.args, bench.returncode, out, err), store, suite, filler


def test_a_full_disk_during_a_bench_marks_the_run_interrupted(interrupted, lock, tmp_path):
    done, store, suite, filler = interrupted
    line = one_line(done, 1)
    assert re.search(r"(database or disk is full|No space left on device); run \S+ is marked interrupted "
                     r"with 1 of 2 points stored", line), line
    with Store.open(store, readonly=True) as opened:
        run = opened.runs().iloc[-1]
        assert run["status"] == "interrupted"
        assert list(opened.points(run["run_id"])["status"]) == ["ok"]
    report = rlperf("report", f"{store}::{run['run_id']}", "--out", str(tmp_path / "r"), lock=lock)
    assert report.returncode == 0, report.stderr


def test_resuming_with_other_repeats_is_refused(interrupted, lock):
    done, store, suite, filler = interrupted
    filler.unlink()
    line = one_line(rlperf("bench", "--suite", str(suite), "--out", str(store.parent), "--resume", "--repeats", "2",
                           lock=lock), 2)
    assert re.search(r"repeats: run \S+ was measured with 1 repeats per point; resume it with --repeats 1", line)


def test_two_resumes_of_one_run_take_turns(interrupted, lock):
    """Both start while the machine is held; each says it waits, and each then runs alone: the interrupted run
    is finished once, and the other, finding nothing left to resume, measures a run of its own."""
    done, store, suite, filler = interrupted
    filler.unlink(missing_ok=True)
    with Store.open(store, readonly=True) as opened:
        interrupted_run = opened.runs().iloc[-1]["run_id"]
    args = ("bench", "--suite", str(suite), "--out", str(store.parent), "--resume", "--timeout", "5")
    with MeasurementLock(lock) as held:
        held.acquire(False, print, suite="held by the test", store="none", run_id="HELD-RUN")
        benches = [start(*args, lock=lock) for _ in range(2)]
        for bench in benches:
            assert "waiting: another rlperf bench is measuring on this machine (pid" in bench.stdout.readline()
    results = [bench.communicate(timeout=200) for bench in benches]
    for bench, (out, err) in zip(benches, results):
        assert bench.returncode == 1, out + err  # the slow point timed out: a failed point, not a fault
        assert "Traceback" not in out + err and "IntegrityError" not in out + err
    with Store.open(store, readonly=True) as opened:
        statuses = dict(zip(opened.runs()["run_id"], opened.runs()["status"]))
        assert statuses[interrupted_run] == "complete"
        assert len(statuses) == 2 and set(statuses.values()) == {"complete"}
        # The first point was measured once, before the disk filled, and not again by either resume.
        assert list(opened.points(interrupted_run)["status"]) == ["ok", "timeout"]
        assert len(opened.samples(interrupted_run)) == 1
        (other,) = set(statuses) - {interrupted_run}
        assert len(opened.points(other)) == 2


# ---- the machine lock ---------------------------------------------------------------------------------------

def test_a_long_wait_for_the_lock_says_how_long_it_has_waited_and_when_the_lock_came(tmp_path, monkeypatch):
    import rlperf.lock

    monkeypatch.setattr(rlperf.lock, "WAIT_REPORTS_S", (0.4,))
    monkeypatch.setattr(rlperf.lock, "WAIT_REPORT_EVERY_S", 0.4)
    said: list[str] = []
    with MeasurementLock(tmp_path / "lock") as held:
        held.acquire(False, print, suite="nightly", run_id="HELD-RUN")
        releaser = threading.Timer(1.5, held.release)
        releaser.start()
        with MeasurementLock(tmp_path / "lock") as waiting:
            waiting.acquire(True, said.append, suite="smoke")
            assert waiting.fd is not None
        releaser.join()
    assert said[0].startswith("waiting: another rlperf bench is measuring on this machine (pid")
    still = [line for line in said if line.startswith("still waiting after ")]
    assert len(still) >= 2 and all("run HELD-RUN, suite nightly" in line for line in still), said
    assert said == [said[0], *still, said[-1]]
    assert re.fullmatch(r"the lock came after [12] s of waiting, at \d\d:\d\d:\d\d", said[-1]), said
    assert [rlperf.lock.duration(s) for s in (42.4, 1023, 7500)] == ["42 s", "17 min 3 s", "2 h 5 min"]


def test_a_second_bench_waits_for_the_first_or_is_refused(stored, lock, tmp_path):
    store, runs, suite = stored
    out = tmp_path / "runs"
    with MeasurementLock(lock) as held:
        held.acquire(False, print, suite="nightly", store="/data/results.sqlite")
        held.update(run_id="20260101T000000-nightly-abcdef")
        line = one_line(rlperf("bench", "--suite", str(suite), "--out", str(out), "--no-wait", lock=lock), 1)
        assert re.search(r"another rlperf bench is measuring on this machine \(pid \d+, run "
                         r"20260101T000000-nightly-abcdef, suite nightly, store /data/results.sqlite, since", line)
        assert not (out / "results.sqlite").exists()
        bench = start("bench", "--suite", str(suite), "--out", str(out), lock=lock)
        assert "run 20260101T000000-nightly-abcdef" in bench.stdout.readline()
        assert not (out / "results.sqlite").exists()  # the store is opened only once the lock is held
        # nor has it started its machine probe or its fork server, whose imports would load the measurement
        assert psutil.Process(bench.pid).children() == []
    stdout, stderr = bench.communicate(timeout=200)
    assert bench.returncode == 0, stdout + stderr


# ---- what a new user reads ------------------------------------------------------------------------------------

def test_every_flag_of_every_subcommand_has_help_with_its_default(lock):
    import importlib

    from command.cli import SUBCOMMANDS, OneLineParser

    for name in SUBCOMMANDS:
        module_name = SUBCOMMANDS[name][0]
        parser = OneLineParser(prog=f"rlperf {name}")
        importlib.import_module(module_name).configure(parser)
        for action in parser._actions:
            if action.dest == "help" or not action.option_strings:
                continue
            text = action.help or ""
            assert "default" in text or action.required, f"rlperf {name} {action.option_strings[0]}: {text!r}"
        if name == "profile":
            assert "--trace-dir" not in parser.format_help()
    done = rlperf("train", "--help", lock=lock)
    assert re.search(r"--threads THREADS\s+torch CPU threads per process; 0 leaves", done.stdout)


def stored_label(store: Path, run_id: str) -> str:
    """The label reports give the run's one point (about 50 characters: wider than an 80-column cell)."""
    from rlperf.store import point_label

    with Store.open(store, readonly=True) as opened:
        return point_label(opened.points(run_id)["point_key"].iloc[0])


def test_piped_verdict_table_keeps_point_names_whole(stored, lock, tmp_path):
    store, runs, suite = stored
    done = rlperf("report", f"{store}::{runs[1]}", "--baseline", f"{store}::{runs[0]}", "--out", str(tmp_path / "r"),
                  lock=lock)
    assert done.returncode in (0, 1), done.stderr
    assert stored_label(store, runs[1]) in done.stdout


def test_compare_and_history_print_a_summary(stored, lock, tmp_path):
    store, runs, suite = stored
    done = rlperf("compare", f"{store}::{runs[0]}", f"{store}::{runs[1]}", "--out", str(tmp_path / "c"), lock=lock)
    assert done.returncode == 0, done.stderr
    assert re.search(rf"{re.escape(stored_label(store, runs[0]))}\W+[\d,]+\W+[\d,]+\W+[\d.]+×",
                     done.stdout), done.stdout
    done = rlperf("report", "--history", str(store), "--out", str(tmp_path / "h"), lock=lock)
    assert done.returncode == 0, done.stderr
    assert re.search(rf"faults\W.*\W2\W+{runs[1]}", done.stdout), done.stdout
    # Two runs of one commit: each tick of the history plot is told apart by its start time.
    ticks = set(re.findall(r"[0-9a-f]{7} \d\d-\d\d \d\d:\d\d:\d\d", (tmp_path / "h" / "report.html").read_text()))
    assert len(ticks) == 2, ticks
