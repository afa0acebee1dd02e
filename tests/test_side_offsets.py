"""The study of offsets one side's processes share (studies/side_offsets.py): its analyses see an offset that is
there and none that is not, and the A/A nights shipped under results/ read as they were measured, an offset with a
server for each side and none with one server for both."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from studies.side_offsets import csv_nights, detection_power, night_offsets, offset_in_rounds

SHIPPED = Path(__file__).resolve().parents[1] / "results" / "cpu-epyc-2core" / "gate-offsets"


def drawn_nights(rng: np.random.Generator, side_offset: float, nights: int = 40) -> list[dict[str, list[float]]]:
    """Nights of six points' pairs at 5% noise, each night's pairs sharing a drawn offset of `side_offset` SD."""
    found = []
    for _ in range(nights):
        offset = rng.normal(0, side_offset)
        found.append({f"p{point}": list(offset + rng.normal(0, 0.05, 5)) for point in range(6)})
    return found


def test_the_nights_analysis_sees_an_offset_one_side_shares_and_none_where_there_is_none():
    rng = np.random.default_rng(3)
    shared = night_offsets(drawn_nights(rng, 0.03))
    assert shared["p"] < 0.001 and 0.02 < shared["offset_sd"] < 0.04 <= shared["offset_sd_upper95"] + 0.01
    clean = night_offsets(drawn_nights(rng, 0.0))
    assert clean["p"] > 0.05 and clean["offset_sd"] < 0.01
    assert abs(clean["allowed_spread"] - 0.05 / np.sqrt(30)) < 0.002  # 30 pairs a night at 5%


def test_the_rounds_analysis_sees_an_offset_lasting_a_round_and_its_mean():
    rng = np.random.default_rng(4)
    rounds = [rng.normal(0.02, 0.02) + rng.normal(0, 0.04, 8) for _ in range(40)]
    found = offset_in_rounds(rounds)
    assert found["p"] < 0.01 and found["mean_low"] < 0.02 < found["mean_high"]
    assert found["offset_sd"] < found["offset_sd_upper95"]
    flat = offset_in_rounds([rng.normal(0, 0.04, 8) for _ in range(40)])
    assert flat["p"] > 0.01 and flat["mean_low"] < 0 < flat["mean_high"]
    # the sizing the study prints: more rounds see more
    assert detection_power(10, 8, 0.045, 0.015) < detection_power(30, 8, 0.045, 0.015) < 1


def test_the_shipped_a_a_nights_show_an_offset_with_a_server_a_side_and_none_with_one_server():
    before = night_offsets(csv_nights(SHIPPED / "before-aa-pairs.csv", ("screen", "refine")))
    after = night_offsets(csv_nights(SHIPPED / "after-aa-pairs.csv", ("screen", "refine")))
    assert before["nights"] == 8 and before["p"] < 0.01 and round(before["offset_sd"], 4) == 0.0169
    assert after["nights"] == 20 and after["variance_ratio"] < 1 and after["offset_sd"] == 0.0
