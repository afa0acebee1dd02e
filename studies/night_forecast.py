"""What will a night of `rlperf gate --suite nightly` take on one H100? The gate's own forecast
(benches/forecast.py) over a store holding processes modelled from the walls measured on an H100.

`python -m studies.night_forecast --measurements DIR`; how a process is modelled:
docs/decision-rules.md#a-nights-forecast-on-one-h100-studiesnight_forecastpy.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
import tempfile
from pathlib import Path

from benches import forecast
from benches import suite as suites
from benches.night import MAX_SUSPECTS, NIGHT_S, SCREEN_PAIRS, gate_plan
from benches.options import ProcessOptions
from rlperf.store import PointRecord, Store

MACHINE = "h100-modelled"
# point settings -> (the summary whose warm-up it pays, the summary whose steady epoch it runs): the nearest
# configuration measured on the H100 (trainer/; fp16 was not measured, bf16 stands in; every knob at once was
# not measured, compile+graphs' warm-up and the graphed copy knobs' or bf16 graphs' epoch stand in)
NEAREST = [
    ({"encoder": "cnn", "cuda_graphs": True}, "t_cnn_pinned_graphs", "t_cnn_pinned_graphs"),
    ({"encoder": "cnn"}, "t_cnn", "t_cnn"),
    ({"hidden_size": 1024, "cuda_graphs": True}, "t_h1024_graphs", "t_h1024_graphs"),
    ({"hidden_size": 1024}, "t_h1024", "t_h1024"),
    ({"compile": True, "cuda_graphs": True, "copy_stream": True, "dtype": "bf16"}, "t_compile_graphs",
     "t_bf16_graphs"),
    ({"compile": True, "cuda_graphs": True, "copy_stream": True}, "t_compile_graphs", "t_graphs_copy"),
    ({"compile": True, "cuda_graphs": True}, "t_compile_graphs", "t_compile_graphs"),
    ({"compile": True}, "t_compile", "t_compile"),
    ({"num_envs": 1024, "cuda_graphs": True}, "t_graphs1024", "t_graphs1024"),
    ({"num_envs": 1024}, "t_eager1024", "t_eager1024"),
    ({"cuda_graphs": True}, "t_graphs", "t_graphs"),
    ({"dtype": "bf16"}, "t_bf16", "t_bf16"),
    ({"dtype": "fp16"}, "t_bf16", "t_bf16"),
    ({"lstm": False}, "t_nolstm", "t_nolstm"),
    ({"pinned": True}, "t_pinned_nb", "t_pinned_nb"),
    ({}, "t_eager", "t_eager"),
]


def nearest(config: dict) -> tuple[str, str]:
    for settings, warm, steady in NEAREST:
        if all(config[name] == value for name, value in settings.items()):
            return warm, steady
    raise AssertionError("NEAREST ends with a rule for every point")


def outside_trainer_s(gate_store: Path) -> float:
    """The median of the harness's wall around a process less the trainer's own wall, in the shipped gate store."""
    with sqlite3.connect(f"file:{gate_store}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT json_extract(summary, '$.interference.wall_s'), wall_seconds FROM samples").fetchall()
    return statistics.median(outer - inner for outer, inner in rows)


def modelled_process(config: dict, warm: dict, steady: dict, outside_s: float) -> dict:
    epoch_s = statistics.median(e["seconds"] for e in steady["epochs"] if not e["warmup"])
    cap = max(1, -(-config["total_steps"] // (config["num_envs"] * config["horizon"]))) - config["warmup_epochs"]
    wanted = config.get("steady_seconds", 0.0)
    epochs = min(cap, max(2, math.ceil(wanted / epoch_s))) if wanted > 0 else cap
    wall = outside_s + warm["warmup_seconds"] + epochs * epoch_s
    return {"sps": steady["sps"], "wall_seconds": wall - outside_s, "steady_epochs": epochs,
            "steady_seconds": epochs * epoch_s, "warmup_seconds": warm["warmup_seconds"],
            "interference": {"wall_s": wall}}


def modelled_processes(measurements: Path, points: list[suites.Point],
                       outside_s: float | None = None) -> dict[str, dict]:
    """Each point's modelled process (`modelled_process`, its wall at ["interference"]["wall_s"]), by point key;
    `outside_s` the harness's wall outside the trainer, None for the median measured (`outside_trainer_s`)."""
    if outside_s is None:
        outside_s = outside_trainer_s(measurements / "gate" / "results.sqlite")
    summaries = {path.stem: json.loads(path.read_text()) for path in (measurements / "trainer").glob("t_*.json")}
    modelled = {}
    for point in points:
        warm, steady = nearest(point.config)
        process = modelled_process(point.config, summaries[warm], summaries[steady], outside_s)
        modelled[point.key] = {"label": point.label, "warm-up from": warm, "steady epoch from": steady, **process}
    return modelled


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measurements", type=Path, required=True,
                        help="the H100 measurements' folder (trainer/, gate/results.sqlite)")
    parser.add_argument("--suite", default="nightly")
    parser.add_argument("--screen-pairs", type=int, default=SCREEN_PAIRS)
    parser.add_argument("--max-suspects", type=int, default=MAX_SUSPECTS)
    parser.add_argument("--max-repeats", type=int, default=ProcessOptions.max_repeats)
    parser.add_argument("--night-s", type=float, default=NIGHT_S)
    parser.add_argument("--outside-s", type=float,
                        help="the harness's wall outside the trainer per process (default: the median measured in "
                             "gate/results.sqlite, fresh processes)")
    parser.add_argument("--pairs-confirmed", type=float, default=0.0,
                        help="pairs a night confirms on average (studies/gate_power.py), costed at the median "
                             "process of the suite")
    parser.add_argument("--peaks-s", type=float, default=49.8, help="seconds of peaks, the first night only")
    return parser


def main() -> None:
    args = build_parser().parse_args()

    suite = suites.load(args.suite)
    points = [point for point in suite.points if point.config["world_size"] == 1]
    outside_s = outside_trainer_s(args.measurements / "gate" / "results.sqlite") if args.outside_s is None \
        else args.outside_s
    modelled = modelled_processes(args.measurements, points, outside_s)
    plan = gate_plan(ProcessOptions(suite=args.suite, max_repeats=args.max_repeats), args.screen_pairs,
                     args.max_suspects)
    with tempfile.TemporaryDirectory() as scratch, Store.open(Path(scratch) / "results.sqlite") as store:
        run_id = store.create_run(suite.name, suite.suite_hash, {}, MACHINE, "modelled from the H100's walls")
        for point in points:
            process = modelled[point.key]
            record = PointRecord(point.key, point.config, "ok", "modelled", process["interference"]["wall_s"])
            record.samples = [(0, process)]
            store.record_point(run_id, record)
        store.finish_run(run_id, "complete")
        night = forecast.predict(store, MACHINE, points, plan, args.night_s, launch="fresh")  # as the H100's were
    median_process = statistics.median(cost.process_s for cost in night.points)
    confirm_s = 2 * args.pairs_confirmed * median_process
    refine_s = 2 * plan.refine_pairs * plan.refine_points * median_process if plan.refine_pairs else 0.0
    for process in modelled.values():
        print(f"{process['interference']['wall_s']:6.1f} s  {process['label']}  (warm-up {process['warmup_seconds']:.1f} s from "
              f"{process['warm-up from']}, {process['steady_epochs']} steady epochs of {process['steady epoch from']})")
    print(f"outside the trainer: {outside_s:.1f} s a process"
          + (" (median, gate/results.sqlite)" if args.outside_s is None else " (--outside-s)"))
    for line in night.lines():
        print(line)
    expected = night.screen_s + refine_s + confirm_s
    print(f"expected refinement at the median process: {forecast.duration(refine_s)}; expected confirmation at "
          f"{args.pairs_confirmed:g} pairs a night: {forecast.duration(confirm_s)}; "
          f"peaks (first night on a store): {forecast.duration(args.peaks_s)}; the night: "
          f"{forecast.duration(expected)} of processes, {forecast.duration(expected + args.peaks_s)} with the peaks, "
          f"at most {forecast.duration(max(night.night_s, night.screen_s + night.refine_s[1]) + args.peaks_s)}")


if __name__ == "__main__":
    main()
