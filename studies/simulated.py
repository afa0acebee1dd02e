"""A machine whose trainer processes are drawn, not run: the error rates of the gate, `--until-decided` and
bisect are measured by driving their own code with runners that answer like `PointRunner`, steady SPS drawn from
a model of the measured noise (docs/decision-rules.md#the-simulated-machine-studiessimulatedpy).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benches.suite import Point
from rlperf.store import PointRecord
from rlperf.summary import RunSummary

STEADY_STEPS = 10_000
# shares of a step each phase takes in the drawn summaries; only their sum (the step) matters to SPS
PHASE_SHARES = {"env": 0.1, "eval_forward": 0.4, "train_forward": 0.2, "learn": 0.3}


@dataclass(frozen=True)
class Noise:
    process: float  # log SD of one process's steady SPS
    drift: float = 0.0  # correlation of one process's luck with the one before it
    tail_df: float | None = 4.0  # Student-t degrees of freedom of the luck; None for normal
    night: float = 0.0  # log SD of a night's offset, shared by every point
    point_night: float = 0.0  # log SD of one point's offset on one night
    contended: float = 0.0  # share of processes that meet a neighbour
    unflagged: float = 0.2  # share of those the interference monitor misses
    wide_share: float = 0.0  # share of processes whose luck is drawn at `wide` SD instead of `process`
    wide: float = 0.0  # log SD of those processes' luck
    side_night: float = 0.0  # log SD of an offset one side's processes share for a night


# The named noises, and what each was measured from: docs/decision-rules.md#the-simulated-machine-studiessimulatedpy.
GPU_RUNNER = Noise(process=0.02, drift=0.3, night=0.03, point_night=0.01, contended=0.01)
H100 = Noise(process=0.036, drift=0.3, tail_df=4.0, night=0.03, point_night=0.01, contended=0.01,
             wide_share=0.2, wide=0.12)
H100_EAGER = Noise(process=0.2, drift=0.88, tail_df=4.0, night=0.03, point_night=0.01, contended=0.01)
H100_GRAPHED = Noise(process=0.04, drift=0.65, tail_df=4.0, night=0.03, point_night=0.01, contended=0.01)
H200_EAGER = Noise(process=0.082, drift=0.54, tail_df=4.0, night=0.03, point_night=0.01, contended=0.01)
H200_GRAPHED = Noise(process=0.032, drift=0.0, tail_df=4.0, night=0.03, point_night=0.01, contended=0.01)
NOISES = {"gpu": GPU_RUNNER, "h100": H100, "h100-eager": H100_EAGER, "h100-graphed": H100_GRAPHED,
          "h200-eager": H200_EAGER, "h200-graphed": H200_GRAPHED}


def parse_noise(text: str) -> Noise:
    """A named noise (NOISES) or Noise fields, e.g. process=0.06,drift=0.6,contended=0.02."""
    return NOISES.get(text) or Noise(**{k: float(v) for k, v in (item.split("=") for item in text.split(","))})


@dataclass
class SimulatedMachine:
    """One machine over one night: `slowdowns` maps (side, point key) to the fraction of SPS that side's code
    loses at that point. Processes are drawn in the order they are run, across every runner of the night; each
    moves the machine's clock (`clock()`, what a budget in seconds is spent on) by its point's wall, `walls` by
    point key, else `process_s`. A graphed point's processes draw their luck at `graphed_noise` where it is given
    (a CUDA graph's step is the device's, an eager step is paced by the host's launches)."""

    noise: Noise
    rng: np.random.Generator
    graphed_noise: Noise | None = None
    slowdowns: dict[tuple[str, str], float] = field(default_factory=dict)
    base_sps: float = 10_000.0
    luck: float = 0.0
    night_offset: float = 0.0
    point_offsets: dict[str, float] = field(default_factory=dict)
    side_offsets: dict[str, float] = field(default_factory=dict)
    walls: dict[str, float] = field(default_factory=dict)
    process_s: float = 0.0
    now: float = 0.0

    def clock(self) -> float:
        return self.now

    def __post_init__(self):
        self.new_night()

    def new_night(self, rng: np.random.Generator | None = None) -> None:
        """A new night's offsets. With `rng`, the night draws from it alone and its first process's luck is drawn
        afresh, so two gates simulated on the same nights meet the same processes until their choices differ."""
        if rng is not None:
            self.rng = rng
            self.luck = self._shock()
        self.night_offset = self.rng.normal(0, self.noise.night)
        self.point_offsets = {}
        # drawn only where the model has them, so nights without side offsets draw what they always drew
        self.side_offsets = {side: self.rng.normal(0, self.noise.side_night) for side in ("ref", "new")} \
            if self.noise.side_night else {}

    def noise_of(self, point: Point) -> Noise:
        return self.graphed_noise if self.graphed_noise and point.config.get("cuda_graphs") else self.noise

    def _shock(self, noise: Noise | None = None) -> float:
        """A process's luck before drift: Student-t scaled to unit variance, or normal."""
        noise = noise or self.noise
        if not noise.tail_df:
            return self.rng.normal()
        return self.rng.standard_t(noise.tail_df) * math.sqrt((noise.tail_df - 2) / noise.tail_df)

    def runner(self, side: str, run_dir: Path) -> "SimulatedRunner":
        return SimulatedRunner(self, side, run_dir)

    def draw(self, side: str, point: Point) -> tuple[float, bool]:
        """One process's steady SPS, and whether the monitor flagged it contended."""
        noise = self.noise_of(point)
        if point.key not in self.point_offsets:
            self.point_offsets[point.key] = self.rng.normal(0, noise.point_night)
        self.luck = noise.drift * self.luck + math.sqrt(1 - noise.drift ** 2) * self._shock(noise)
        level = (math.log(self.base_sps) + _point_level(point.key) + self.night_offset + self.point_offsets[point.key]
                 + self.side_offsets.get(side, 0.0))
        luck = noise.process * self.luck
        if noise.wide_share and self.rng.random() < noise.wide_share:
            luck = noise.wide * self.rng.normal()
        log_sps = level + math.log1p(-self.slowdowns.get((side, point.key), 0.0)) + luck
        contended = self.rng.random() < noise.contended
        if contended:
            log_sps -= math.log(self.rng.uniform(1.3, 3.0))
        return math.exp(log_sps), contended and self.rng.random() >= noise.unflagged


def _point_level(key: str) -> float:
    """Points differ in SPS (a fixed spread of levels, by key)."""
    digest = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return (digest / 0xFFFFFFFF - 0.5) * 2


@dataclass
class SimulatedRunner:
    """Answers `run_repeat` like benches/runner.PointRunner, with a drawn summary."""

    machine: SimulatedMachine
    side: str
    run_dir: Path

    def point_dir(self, index: int, point: Point) -> Path:
        return self.run_dir

    def run_repeat(self, point: Point, repeat: int, directory: Path, gpu_uuids: list[str],
                   record: PointRecord) -> tuple[str, str | None, RunSummary]:
        sps, flagged = self.machine.draw(self.side, point)
        self.machine.now += self.machine.walls.get(point.key, self.machine.process_s)
        seconds = STEADY_STEPS / sps
        summary = {"sps": sps, "steady_steps": STEADY_STEPS, "steady_seconds": seconds,
                   "phases": {phase: share * seconds for phase, share in PHASE_SHARES.items()},
                   "interference": {"contended": flagged, "why": "drawn" if flagged else ""}}
        return "ok", None, RunSummary.read(summary)
