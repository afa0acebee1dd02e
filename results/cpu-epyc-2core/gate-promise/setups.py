"""Each study row's night as set up (the promise kept or not) without its nights: cheap."""
import json
from dataclasses import replace
from pathlib import Path
import numpy as np
from benches import suite as suites
from benches.night import Night, gate_plan, set_up_night
from benches.options import ProcessOptions
from studies import night_forecast, gate_power
from studies.simulated import SimulatedMachine, parse_noise
points = [p for p in suites.load("nightly").points if p.config["world_size"] <= 1]
plan = replace(gate_plan(ProcessOptions(max_repeats=40)), night_end_undecided=True)
walls = {k: p["interference"]["wall_s"] for k, p in night_forecast.modelled_processes(
    Path(__import__("os").environ.get("H100_MEASUREMENTS", "H100_MEASUREMENTS")), points, 0.5).items()}
for scale in (1, 2):
    for offset in (0.0, 0.008, 0.012):
        for seed in (21, 22):
            w = {k: v * scale for k, v in walls.items()}
            machine = SimulatedMachine(replace(parse_noise("h200-eager"), side_night=offset),
                                       np.random.default_rng(seed), graphed_noise=parse_noise("h200-graphed"),
                                       walls=w, process_s=0)
            night = Night(plan, say=lambda t: None, clock=machine.clock)
            hist = gate_power.drawn_history(night, machine, points, 30, seed)
            setup = set_up_night(plan, hist, w, 3600, labels={p.key: p.label for p in points})
            print(json.dumps({"walls": scale, "offset": offset, "seed": seed, "kept": setup.promise.kept,
                              "suspects": setup.promise.confirmed, "cut": len(setup.fit.cut),
                              "refused": setup.refused}), flush=True)
