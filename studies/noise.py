"""Which way of running trainer processes gives the most decisions per minute on this machine?

`python -m studies.noise --rounds 12` (on a GPU `--device cuda`); the levers and what it reports:
docs/decision-rules.md#the-machines-noise-and-what-lowers-it-studiesnoisepy.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

POINT = {"env": "synthetic", "hidden_size": 128, "num_envs": 64, "horizon": 16, "minibatch_size": 256,
         "total_steps": 32768}
CALIBRATION = (384, 30)  # matmul size and timed repetitions: about 0.1 s
LEVERS = {
    "default": ([], {}),
    "one thread": ([], {"threads": 1}),
    "pinned": (["taskset", "-c", "0"], {"threads": 1}),
    "no aslr": (["setarch", platform.machine(), "-R"], {"threads": 1}),
    "shorter": ([], {"threads": 1, "total_steps": POINT["total_steps"] // 2}),
}


def one_process(settings: dict) -> dict:
    """Runs inside a fresh interpreter: the calibration kernel, then the trainer; prints SPS and GFLOP/s."""
    import torch

    from reference_trainer.config import from_dict
    from reference_trainer.train import train

    cfg = from_dict(settings)
    torch.set_num_threads(cfg.threads or torch.get_num_threads())
    size, repetitions = CALIBRATION
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.matmul(a, b)
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - start)
    summary = train(cfg)
    return {"sps": summary["sps"], "calibration_gflops": 2 * size ** 3 / float(np.median(times)) / 1e9,
            "wall_seconds": summary["wall_seconds"]}


GPU_POINT = {"env": "synthetic", "hidden_size": 128, "num_envs": 4096, "horizon": 64, "minibatch_size": 16384,
             "update_epochs": 1, "total_steps": 2097152, "warmup_epochs": 2}
GPU_LEVERS = {"eager": {}, "graphs": {"cuda_graphs": True}}
GPU_SAMPLE_HZ = 5.0


def measure_gpu(rounds: int, out: Path, device: str, seconds: float | None = None) -> dict:
    """Pairs of trainer processes at GPU_LEVERS' points, the levers in turn round after round, stored with
    their NVML readings; each process's SPS and what its GPU's clock did. With `seconds`, no round is started
    that the slowest round so far says would end past it: the rounds done are stored and analysed."""
    from benches.runner import PointRunner, UtilizationProbe
    from benches.suite import Point
    from reference_trainer.config import from_dict
    from rlperf.machine import collect, machine_key, probe
    from rlperf.store import PointRecord, Store, canonical_json, utc_now

    machine = probe()
    points = [Point(key=canonical_json({"lever": name}), axes={"lever": name},
                    config=from_dict({**GPU_POINT, **extra, "device": device}).to_dict())
              for name, extra in GPU_LEVERS.items()]
    refusal = machine.skip_reason(points[0].config)
    if refusal:
        sys.exit(f"noise: {refusal}")
    fingerprint = collect(machine, "noise-gpu")
    out.mkdir(parents=True, exist_ok=True)
    with Store.open(out / "results.sqlite") as store:
        run_id = store.create_run("noise-gpu", "noise-gpu", fingerprint, machine_key(fingerprint),
                                  f"studies.noise: {rounds} pairs a lever")
        runner = PointRunner(out / run_id, 2 * rounds, 600.0, UtilizationProbe(GPU_SAMPLE_HZ))
        records = {point.key: PointRecord(point.key, point.config, "ok", utc_now(), 0.0) for point in points}
        started, slowest_round = time.monotonic(), 0.0
        for round_ in range(rounds):
            if seconds is not None and round_ and time.monotonic() - started + slowest_round > seconds:
                done = f"{round_} round" + ("s" if round_ != 1 else "")
                print(f"stopped after {done}: another would end past --seconds {seconds:g}", flush=True)
                break
            round_started = time.monotonic()
            for index, point in enumerate(points):
                directory = runner.point_dir(index, point)
                directory.mkdir(parents=True, exist_ok=True)
                for repeat in (2 * round_, 2 * round_ + 1):
                    status, reason, summary = runner.run_repeat(point, repeat, directory,
                                                                machine.gpu_uuids(point.config), records[point.key])
                    if status != "ok":
                        sys.exit(f"noise: a process failed: {reason}")
                    records[point.key].samples.append((repeat, summary))
            slowest_round = max(slowest_round, time.monotonic() - round_started)
            print(f"round {round_ + 1}/{rounds}: " + ", ".join(
                f"{point.axes['lever']} {records[point.key].samples[-2][1].sps:,.0f}/"
                f"{records[point.key].samples[-1][1].sps:,.0f}" for point in points), flush=True)
        for record in records.values():
            store.record_point(run_id, record)
        store.finish_run(run_id, "complete")
    levers = {}
    for point in points:
        record = records[point.key]
        processes = [{"sps": summary.sps, "process_seconds": summary.interference["wall_s"],
                      **gpu_readings(record.utilization, repeat)} for repeat, summary in record.samples]
        levers[point.axes["lever"]] = {**analyse(list(zip(processes[::2], processes[1::2]))),
                                       "processes": processes}
    return {"store": str(out / "results.sqlite"), "run": run_id, "levers": levers,
            "report": f"rlperf report {out / 'results.sqlite'}::{run_id}"}


def gpu_readings(rows: list[tuple], repeat: int) -> dict:
    """One process's SM clock (mean, min, max), clock-event reasons (each one's share of samples) and
    temperature (mean, max), from the harness's NVML rows."""
    from profilers.sampler import CLOCK_EVENT_REASONS

    def values(metric: str) -> np.ndarray:
        return np.array([row[4] for row in rows if row[0] == repeat and row[2].startswith("gpu:") and row[3] == metric])

    clock, reasons, heat = values("sm_clock_mhz"), values("clock_event_reasons").astype(int), values("temperature_c")
    if not len(clock):
        return {"nvml": "no readings"}
    return {"sm_clock_mhz": {"mean": float(clock.mean()), "min": float(clock.min()), "max": float(clock.max())},
            "clock_events": {name: float(np.mean(reasons & bit != 0)) for bit, name in CLOCK_EVENT_REASONS.items()
                             if np.any(reasons & bit)},
            "temperature_c": {"mean": float(heat.mean()), "max": float(heat.max())} if len(heat) else None}


def run_lever(prefix: list[str], settings: dict) -> dict:
    command = prefix + [sys.executable, "-m", "studies.noise", "--one", json.dumps(settings)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"noise: a process failed: {done.stderr.strip().splitlines()[-1:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_seconds": time.monotonic() - started}


def robust_sd(values: np.ndarray) -> float:
    return float(stats.median_abs_deviation(values, scale="normal"))


def analyse(pairs: list[tuple[dict, dict]]) -> dict:
    first = np.log([a["sps"] for a, _ in pairs])
    second = np.log([b["sps"] for _, b in pairs])
    ratios = second - first
    every = np.concatenate([first, second])
    found = {"sps_median": float(np.exp(np.median(every))), "process_log_sd": robust_sd(every),
             "pair_log_sd": robust_sd(ratios), "pair_correlation": float(stats.spearmanr(first, second).statistic),
             "seconds_per_pair": float(np.median([a["process_seconds"] + b["process_seconds"] for a, b in pairs]))}
    if "calibration_gflops" not in pairs[0][0]:
        return found
    calib = np.log([p["calibration_gflops"] for pair in pairs for p in pair])
    calib_ratios = np.log([b["calibration_gflops"] / a["calibration_gflops"] for a, b in pairs])
    slope = float(np.polyfit(calib_ratios, ratios, 1)[0]) if np.std(calib_ratios) > 0 else 0.0
    return {**found, "calibration_vs_sps_spearman": float(stats.spearmanr(calib, every).statistic),
            "pair_log_sd_adjusted_by_calibration": robust_sd(ratios - slope * calib_ratios)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="pairs of processes per lever (default 12)")
    parser.add_argument("--out", type=Path, default=Path("runs/noise.json"),
                        help="the JSON's path; on a GPU, the folder of the store and the JSON (default runs/noise)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (the levers above), or cuda / cuda:N: an eager and a graphed point on that GPU")
    parser.add_argument("--seconds", type=float,
                        help="on a GPU, start no round that would end past this many seconds (default: no limit)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # inside a measured process
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if args.one:
        print(json.dumps(one_process(json.loads(args.one))))
        return
    if args.device != "cpu":
        directory = args.out.with_suffix("") if args.out.suffix == ".json" else args.out
        report = measure_gpu(args.rounds, directory, args.device, args.seconds)
        print(json.dumps({name: {k: v for k, v in lever.items() if k != "processes"}
                          for name, lever in report["levers"].items()}, indent=1))
        (directory / "noise.json").write_text(json.dumps(report, indent=1))
        print(f"every process's SM clock, clock events and temperature: `{report['report']}`")
        return
    measured: dict[str, list[tuple[dict, dict]]] = {name: [] for name in LEVERS}
    started = time.monotonic()
    for round_ in range(args.rounds):
        for name, (prefix, extra) in LEVERS.items():
            settings = {**POINT, **extra}
            measured[name].append((run_lever(prefix, settings), run_lever(prefix, settings)))
        print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(
            f"{name} {pairs[-1][0]['sps']:,.0f}/{pairs[-1][1]['sps']:,.0f}" for name, pairs in measured.items()),
            flush=True)
    results = {name: analyse(pairs) for name, pairs in measured.items()}
    base = results["default"]
    for result in results.values():
        result["decisions_per_minute_vs_default"] = (base["pair_log_sd"] ** 2 * base["seconds_per_pair"]) / \
            (result["pair_log_sd"] ** 2 * result["seconds_per_pair"])
    report = {"point": POINT, "rounds": args.rounds, "seconds": time.monotonic() - started, "levers": results,
              "raw": measured}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "raw"}, indent=1))


if __name__ == "__main__":
    main()
