"""Reports rendered from a real store: every section, hostile strings escaped, the HTML checked in a real
headless browser, comparisons, the nightly trend, and bad input refused with one line and exit code 2.

The store holds one real trainer summary, copied per point with its times scaled, plus utilization,
collective and trace rows, so every section of the report has something to draw."""

import copy
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys

import pytest

from rlperf.machine import machine_key
from benches.runner import trainer_command
from benches.peak_probe import measure
from rlperf.peaks import needs_for_work
from rlperf.store import PointRecord, Store, utc_now
from reference_trainer.config import TrainConfig
from reports.render import render
from decisions.rundata import load
from command.cli import main

HOSTILE = "<script>alert('pwned')</script>"
HOSTILE_ENV = "gym:" + HOSTILE.replace(" ", "")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SWEEP = [{"num_envs": n, "dtype": d} for n in (16, 32) for d in ("fp32", "bf16")]


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    config = {**TrainConfig().to_dict(), "env": "synthetic", "num_envs": 16, "horizon": 16, "minibatch_size": 128,
              "update_epochs": 1, "hidden_size": 32, "total_steps": 16 * 16 * 6, "threads": 1, "device": "cpu"}
    path = tmp_path_factory.mktemp("summary") / "summary.json"
    subprocess.run(trainer_command(config, path), check=True, capture_output=True, timeout=120)
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def measured_peaks(summary):
    """This machine's peaks for the summary's work, measured for real: every run stored below gets them."""
    return measure(needs_for_work("cpu", "cpu", summary["work"]["threads"], summary["work"]))


def fingerprint(gpu: str | None = None, torch: str = "2.13.0+cpu") -> dict:
    gpus = [{"index": 0, "name": gpu, "uuid": "GPU-1", "driver": "560", "sm_clock_max_mhz": 2520,
             "mem_clock_max_mhz": 10501, "power_limit_w": 450.0}] if gpu else []
    return {"git": {"commit": "0123456789abcdef", "dirty": False}, "python": platform.python_version(),
            "torch": torch, "cuda": "12.8" if gpu else None, "gpus": gpus, "cuda_devices": gpus,
            "cpu": {"model": "Test CPU", "cores_logical": 2, "cores_physical": 2}, "hostname": "bench-host",
            "thread_env": {"OMP_NUM_THREADS": "1"}, "suite_hash": "h"}


def scaled(summary: dict, speed: float, config: dict, slow_phase: str | None = None) -> dict:
    """The summary as if every timed second had been 1/speed as long, and `slow_phase` twice as long on top."""
    out = copy.deepcopy(summary)
    out["config"] = config

    def retime(phases: dict) -> dict:
        return {phase: seconds / speed * (2 if phase == slow_phase else 1) for phase, seconds in phases.items()}

    for epoch in out["epochs"]:
        epoch["phases"] = retime(epoch["phases"])
        epoch["seconds"] = sum(epoch["phases"].values())
    out["phases"] = retime(out["phases"])
    out["steady_seconds"] = sum(out["phases"].values())
    out["sps"] = out["steady_steps"] / out["steady_seconds"]
    return out


def with_ranks(summary: dict, world_size: int) -> dict:
    out = copy.deepcopy(summary)
    out["world_size"] = world_size
    out["ranks"] = [{"rank": rank, "sps": out["sps"] / world_size,
                     "phases": {p: s * (1 + 0.3 * rank) for p, s in out["phases"].items()}} for rank in range(world_size)]
    return out


def add_run(path, summary, speed=1.0, suite="smoke", print_=None, label=None, extras=True, slow_phase=None,
            peaks=()) -> str:
    """A complete run of the sweep (and, with extras, world sizes, a failed hostile point, utilization,
    collectives and a trace) at `speed` times the real summary's speed, `slow_phase` taking twice as long,
    with `peaks` stored for its machine."""
    print_ = print_ or fingerprint()
    with Store.open(path) as db:
        run_id = db.create_run(suite, "h", print_, machine_key(print_), label)
        db.add_peaks(machine_key(print_), peaks, run_id)
        points = [(values, speed * (values["num_envs"] / 16) * (0.8 if values["dtype"] == "bf16" else 1.0))
                  for values in SWEEP]
        if extras:
            points += [({"world_size": n}, speed * n * 0.9) for n in (1, 2)]
        for values, point_speed in points:
            config = {**summary["config"], **values}
            samples = []
            for repeat in range(5):  # 4 a side is the fewest that a 95% interval can decide with
                sample = scaled(summary, point_speed * (1 + 0.01 * repeat), config, slow_phase)
                samples.append((repeat, with_ranks(sample, values["world_size"]) if "world_size" in values else sample))
            utilization = [(0, 10**18 + i * 2 * 10**8, "cpu", "cpu_util_percent", 40.0 + i % 7) for i in range(20)]
            db.record_point(run_id, PointRecord(json.dumps(values, sort_keys=True), config, "ok", utc_now(), 5.0,
                                                samples=samples, utilization=utilization if extras else []))
        if extras:
            db.record_point(run_id, PointRecord(json.dumps({"env": HOSTILE_ENV}), {**summary["config"], "env": HOSTILE_ENV},
                                                "failed", utc_now(), 1.0, reason=f"gymnasium: no env {HOSTILE}"))
            db.add_collectives(run_id, [{"op": "all_reduce", "backend": "gloo", "world_size": 2, "bytes": 2**k,
                                         "repeat": 0, "time_us": 50.0 + 2**k / 1e3, "algbw_gbps": 2**k / (50e3 + 2**k),
                                         "busbw_gbps": 2**k / (50e3 + 2**k)} for k in range(10, 22, 2)])
            db.add_trace(run_id, json.dumps({"num_envs": 16, "dtype": "fp32"}, sort_keys=True), "traces/t.json.gz",
                         {"trace_summary": {"kind": "cpu", "bytes": 3 * 2**20, "cpu_ops_per_env_step": 42.7,
                                            "top_operators": [{"name": "aten::mm"}, {"name": "aten::addmm"}],
                                            "gpu": None}})
        db.finish_run(run_id, "complete")
    return run_id


@pytest.fixture(scope="module")
def store(summary, measured_peaks, tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "results.sqlite"
    baseline = add_run(path, summary, label="base", peaks=measured_peaks)
    candidate = add_run(path, summary, label=HOSTILE, slow_phase="learn")
    return path, baseline, candidate


@pytest.fixture(scope="module")
def rendered(store, tmp_path_factory):
    path, baseline, candidate = store
    out = tmp_path_factory.mktemp("report")
    code, _, _ = render(load(f"{path}::{candidate}"), str(out), load(f"{path}::{baseline}"))
    return code, (out / "report.md").read_text(), out / "report.html"


def test_report_has_every_section_and_regressions_fail(rendered):
    code, markdown, html_path = rendered
    assert code == 1
    for title in ("Verdict against the baseline", "Steps per second", "Phase breakdown", "Which side waits",
                  "How far from the machine's limits", "Scaling with world size", "Per-rank stragglers",
                  "Utilization over time", "Collectives", "Traces", "Machine fingerprint"):
        assert f"## {title}" in markdown
    assert "ever taken from a profiled run" in markdown
    assert "| dtype=fp32, num_envs=16 | cpu | 3.0 | 42.7 | – | – | – | aten::mm, aten::addmm | traces/t.json.gz |" \
        in markdown
    html = html_path.read_text()
    # sps per point, phases, a roofline per measured point (6), two swept axes (num_envs, dtype), peak memory
    # against num_envs, scaling, utilization, collectives
    assert html.count('<figure class="plot"><svg') == 14


def test_each_knob_is_compared_with_its_baseline_phase_by_phase(summary, tmp_path):
    # a nightly-style run: a baseline block, then knobs swept alone on top of it
    points = [({"num_envs": 16}, 1.0, None), ({"num_envs": 16, "dtype": "bf16"}, 1.0, "learn"),
              ({"num_envs": 16, "lstm": False}, 1.5, None), ({"num_envs": 16, "threads": 2}, 1.0, None)]
    path = tmp_path / "results.sqlite"
    with Store.open(path) as db:
        run_id = db.create_run("nightly", "h", fingerprint(), machine_key(fingerprint()), None)
        for values, speed, slow_phase in points:
            config = {**summary["config"], **values}
            samples = [(r, scaled(summary, speed * (1 + 0.01 * r), config, slow_phase)) for r in range(5)]
            db.record_point(run_id, PointRecord(json.dumps(values, sort_keys=True), config, "ok", utc_now(), 5.0,
                                                samples=samples))
        db.finish_run(run_id, "complete")
    render(load(f"{path}::{run_id}"), str(tmp_path / "out"))
    markdown = (tmp_path / "out" / "report.md").read_text()
    section = markdown.split("## What each knob changed")[1].split("\n## ")[0]
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in section.splitlines() if line.startswith("| ") and not line.startswith(("| knobs", "| ---"))}
    assert set(rows) == {"dtype=bf16", "lstm=false", "threads=2"}
    assert all(row[0] == "num_envs=16" for row in rows.values())
    bf16, no_lstm, threads = rows["dtype=bf16"], rows["lstm=false"], rows["threads=2"]
    assert bf16[3] == "slower" and bf16[5] == "" and bf16[6].startswith("learn +")
    assert no_lstm[3] == "faster" and no_lstm[2].startswith("+50.0% [")
    assert "learn -" in no_lstm[5] and no_lstm[6] == ""
    assert threads[3] == "no clear change" and threads[5] == threads[6] == ""


def test_report_is_self_contained(rendered):
    html = rendered[2].read_text()
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html, re.I)
    assert "@import" not in html and not re.search(r"url\((?!#)", html)


def test_hostile_strings_are_escaped(rendered):
    _, markdown, html_path = rendered
    html = html_path.read_text()
    assert HOSTILE not in html and HOSTILE_ENV not in html
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in html
    assert HOSTILE not in markdown


def test_regressed_points_are_named_with_their_phases(rendered):
    markdown = rendered[1]
    row = next(line for line in markdown.splitlines() if line.startswith("| dtype=fp32, num_envs=16 |"))
    assert "| regressed |" in row and "| learn +100.0% |" in row
    failed = next(line for line in markdown.splitlines() if "gym:" in line and "| failed |" in line)
    assert "gymnasium: no env" in failed


BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom"]
# Injected into a copy of the page: records resource and script errors, and after load writes each figure's
# rendered size and drawn element count where --dump-dom can read them.
PROBE = """<script>
window.__errors = [];
window.addEventListener('error', e => __errors.push(e.message || ('failed to load ' + (e.target.src || e.target.href))), true);
window.addEventListener('load', () => {
  const figures = [...document.querySelectorAll('figure')].map(f => {
    const svg = f.querySelector('svg'); const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
    return {width: box.width, height: box.height, drawn: svg ? svg.querySelectorAll('path, text, use').length : 0};
  });
  const out = document.createElement('pre'); out.id = 'rlperf-probe';
  out.textContent = JSON.stringify({figures, errors: __errors}); document.body.appendChild(out);
});
</script>"""


def open_in_browser(html_path, tmp_path) -> dict:
    """Loads a copy of the page (with the probe) in headless chromium: figure sizes, page errors and every
    console message chromium logged."""
    probed = tmp_path / "probed.html"
    probed.write_text(html_path.read_text().replace("<head>", "<head>" + PROBE, 1))
    result = subprocess.run([CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", probed.as_uri()],
                            capture_output=True, text=True, timeout=120)
    match = re.search(r'<pre id="rlperf-probe">(.*?)</pre>', result.stdout, re.S)
    assert match, f"the page did not finish loading: {result.stderr[-2000:]}"
    found = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    found["console"] = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    return found


def needs_browser(test):
    """Skips without chromium on a developer's machine; under CI (CI=true, as .ci/run and GitHub Actions
    set it) a missing browser fails the test, so the HTML check cannot silently stop running."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        if CHROMIUM is None:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail("no chromium installed under CI: the HTML report goes unchecked (.ci/run installs it)")
            pytest.skip("no chromium installed (.ci/run installs it)")
        return test(*args, **kwargs)

    return wrapper


@needs_browser
def test_report_loads_in_a_real_browser_with_every_figure_drawn(rendered, tmp_path):
    found = open_in_browser(rendered[2], tmp_path)
    assert found["errors"] == [] and found["console"] == []
    assert len(found["figures"]) == 14
    for figure in found["figures"]:
        assert figure["width"] > 200 and figure["height"] > 100 and figure["drawn"] > 10, figure


@needs_browser
def test_browser_check_catches_a_broken_page(tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text('<!DOCTYPE html><html><head></head><body><figure class="plot"><svg width="0" height="0">'
                      '</svg></figure><img src="missing.png"><script>console.error("boom"); nope();</script>'
                      "</body></html>")
    found = open_in_browser(broken, tmp_path)
    assert found["figures"] == [{"width": 0, "height": 0, "drawn": 0}]
    assert any("missing.png" in error for error in found["errors"])
    assert len(found["console"]) == 2


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line_error(capsys, field: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"error: {field}" in err, err
    return err


def test_corrupt_or_missing_store_is_refused(tmp_path, capsys):
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"not a database at all" * 100)
    before = digest(corrupt)
    assert main(["report", str(corrupt), "--out", str(tmp_path / "r")]) == 2
    assert "not an rlperf results store" in one_line_error(capsys, "results")
    assert digest(corrupt) == before
    assert main(["report", str(tmp_path / "nothing.sqlite"), "--out", str(tmp_path / "r")]) == 2
    one_line_error(capsys, "results")


def test_empty_run_is_refused(summary, tmp_path, capsys):
    path = tmp_path / "results.sqlite"
    with Store.open(path) as db:
        run_id = db.create_run("smoke", "h", fingerprint(), machine_key(fingerprint()))
        db.finish_run(run_id, "interrupted")  # a run still running is refused as such (tests/test_faults.py)
    assert main(["report", f"{path}::{run_id}", "--out", str(tmp_path / "r")]) == 2
    assert "is empty" in one_line_error(capsys, "results")


def test_baseline_of_another_suite_is_refused_and_nothing_changes(store, summary, tmp_path, capsys):
    path, baseline, candidate = store
    other = tmp_path / "other.sqlite"
    other_run = add_run(other, summary, suite="nightly", extras=False)
    before = digest(path), digest(other)
    assert main(["report", f"{path}::{candidate}", "--baseline", f"{other}::{other_run}",
                 "--out", str(tmp_path / "r")]) == 2
    assert "of suite 'nightly', not 'smoke'" in one_line_error(capsys, "baseline")
    assert (digest(path), digest(other)) == before


def test_other_machine_is_refused_unless_allowed(store, summary, tmp_path, capsys):
    path, _, candidate = store
    gpu_store = tmp_path / "gpu.sqlite"
    gpu_run = add_run(gpu_store, summary, print_=fingerprint(gpu="NVIDIA GeForce RTX 4090"), extras=False)
    args = ["report", f"{path}::{candidate}", "--baseline", f"{gpu_store}::{gpu_run}", "--out", str(tmp_path / "r")]
    assert main(args) == 2
    err = one_line_error(capsys, "baseline")
    assert "GPU models: ['NVIDIA GeForce RTX 4090'] vs none" in err and "--allow-cross-machine" in err
    # allowed, the comparison goes ahead: the candidate's doubled learn phase is a regression
    assert main([*args, "--allow-cross-machine"]) == 1
    assert "another machine" in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.parametrize("flag, value, allowed", [("--threshold", "-0.1", "above 0 and at most 1"),
                                                   ("--threshold", "2", "above 0 and at most 1"),
                                                   ("--alpha", "1.5", "above 0 and at most 0.5")])
def test_bad_criteria_are_refused_as_every_measuring_command_refuses_them(store, tmp_path, capsys, flag, value,
                                                                          allowed):
    path, baseline, candidate = store
    with pytest.raises(SystemExit) as refused:
        main(["report", f"{path}::{candidate}", "--baseline", f"{path}::{baseline}", flag, value,
              "--out", str(tmp_path / "r")])
    assert refused.value.code == 2
    assert capsys.readouterr().err == (f"rlperf report: error: argument {flag}: must be a number {allowed} "
                                       f"(got {value!r})\n")


def test_bad_input_prints_no_traceback_from_the_console_script(tmp_path):
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_text("garbage")
    result = subprocess.run([sys.executable, "-m", "rlperf", "report", str(corrupt)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0


def flops(text: str) -> float:
    """`480 MFLOP/s` as 4.8e8."""
    number, unit = text.split()
    return float(number) * 1000 ** max(" kMGT".find(unit[0]), 0)


def test_compare_two_machines_with_prices(store, summary, measured_peaks, tmp_path, capsys):
    path, baseline, _ = store
    gpu_store = tmp_path / "gpu.sqlite"
    gpu_run = add_run(gpu_store, summary, speed=3.0, print_=fingerprint(gpu="NVIDIA H100"), extras=False,
                      peaks=measured_peaks)
    out = tmp_path / "cmp"
    assert main(["compare", f"{path}::{baseline}", f"{gpu_store}::{gpu_run}", "--label", f"A={HOSTILE}",
                 "--label", "B=h100", "--price", "A=0.35", "--price", "B=8", "--out", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    row = next(line for line in markdown.splitlines() if line.startswith("| dtype=fp32, num_envs=16 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[3] == "3.00×"
    sps_a, sps_b = (float(cell.replace(",", "")) for cell in cells[1:3])
    assert float(cells[6]) == pytest.approx(sps_a * 3600 / 0.35 / 1e6, rel=0.01)
    assert float(cells[7]) == pytest.approx(sps_b * 3600 / 8 / 1e6, rel=0.01)
    assert "## Phase shares" in markdown
    # each machine against its own stored peaks (both measured here, so the faster one reaches 3x the share);
    # the shares print to a tenth of a percent, too coarse for a ratio where the peaks are high (0.4% and 1.1%
    # of a 16-core host's 127 GFLOP/s read 2.75), so the ratio is taken from the rates, printed to 3 figures
    headline = next(line for line in markdown.splitlines() if line.startswith("dtype=fp32, num_envs=16: h100 runs"))
    assert headline.startswith("dtype=fp32, num_envs=16: h100 runs 3.00× as fast as")
    (achieved_a, roof_a), (achieved_b, roof_b) = (
        (flops(achieved), flops(roof)) for achieved, roof in re.findall(r"\(([\d.]+ [kMGT]?FLOP/s) of ([\d.]+ [kMGT]?FLOP/s)\)",
                                                                       headline))
    assert roof_a == roof_b and achieved_b / achieved_a == pytest.approx(3.0, rel=0.02)
    assert HOSTILE not in (out / "report.html").read_text()
    assert main(["compare", str(path), str(gpu_store), "--price", "A=free", "--out", str(out)]) == 2
    one_line_error(capsys, "price")
    # a side priced twice is a mistake in the command, not a choice of the last value
    assert main(["compare", str(path), str(gpu_store), "--price", "A=1", "--price", "A=2", "--out", str(out)]) == 2
    one_line_error(capsys, "price")


def test_history_marks_the_run_that_regressed(summary, tmp_path):
    path = tmp_path / "nightly.sqlite"
    for speed in (1.0, 1.01, 0.7, 0.7):
        add_run(path, summary, speed=speed, suite="nightly", extras=False)
    out = tmp_path / "history"
    assert main(["report", "--history", str(path), "--out", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    rows = [line for line in markdown.splitlines() if line.startswith("| 2")]
    assert len(rows) == 4
    assert [("regressed" not in row.split("|")[4]) and ("–" in row.split("|")[4]) for row in rows] == \
        [True, True, False, True]
    assert "dtype=fp32, num_envs=16 -30" in rows[2]
    # Runs are the unit of change points: four runs cannot tell a level from a night's offset.
    assert "No change points" in markdown
    assert (out / "report.html").read_text().count("<svg") == 2  # SPS and phase time over runs
    # Eight nights, then eight at 70%: the slowdown is a change point of each point's SPS at the ninth run.
    longer = tmp_path / "longer.sqlite"
    for speed in (1.0, 0.99, 1.02, 1.0, 1.01, 0.98, 1.0, 1.01) + (0.7, 0.71, 0.7, 0.69, 0.7, 0.7, 0.71, 0.7):
        add_run(longer, summary, speed=speed, suite="nightly", extras=False)
    assert main(["report", "--history", str(longer), "--out", str(out / "longer")]) == 0
    markdown = (out / "longer" / "report.md").read_text()
    rows = [line for line in markdown.splitlines() if line.startswith("| 2")]
    changes = [line for line in markdown.splitlines() if re.match(r"\| [^|]+ \| SPS \| regressed \|", line)]
    assert len(changes) == len(SWEEP) and all(f"| {rows[8].split('|')[1].strip()} |" in row for row in changes)


def as_whole_calls(summary: dict) -> dict:
    """The summary as a run of graph_scope both reports it: each whole call's phases merged into one."""
    from reference_trainer.config import LOG_PHASE, ROLLOUT_PHASES, UPDATE_PHASES

    out = copy.deepcopy(summary)
    out["config"] = {**summary["config"], "env": "synthetic-device", "graph_scope": "both"}

    def merged(phases: dict) -> dict:
        return {"rollout_graph": sum(phases[p] for p in ROLLOUT_PHASES),
                "update_graph": sum(phases[p] for p in UPDATE_PHASES), LOG_PHASE: phases[LOG_PHASE]}

    for epoch in out["epochs"]:
        epoch["phases"] = merged(epoch["phases"])
    out["phases"] = merged(out["phases"])
    return out


def test_a_whole_call_run_reports_where_each_graphs_time_goes_and_no_roofline(summary, tmp_path):
    path = tmp_path / "results.sqlite"
    whole = as_whole_calls(summary)
    with Store.open(path) as db:
        run_id = db.create_run("graphs", "h", fingerprint(), machine_key(fingerprint()), None)
        db.record_point(run_id, PointRecord(json.dumps({"graph_scope": "both"}), whole["config"], "ok", utc_now(), 5.0,
                                            samples=[(r, scaled(whole, 1 + 0.01 * r, whole["config"]))
                                                     for r in range(3)]))
        db.finish_run(run_id, "complete")
    render(load(f"{path}::{run_id}"), str(tmp_path / "out"))
    markdown = (tmp_path / "out" / "report.md").read_text()
    phases = markdown.split("## Phase breakdown")[1].split("\n## ")[0]
    assert "| point | rollout_graph | update_graph | log |" in phases
    assert "inside one call the phases are not timed apart" in phases
    assert "No roofline for graph_scope=both: a whole rollout or update (graph_scope) is one call" in markdown
