"""results/ ships stores, not rendered reports: a report is made again from its store whenever it is wanted, so the
stores must keep rendering with today's code, and rendering must leave them as they were."""

from __future__ import annotations

import hashlib

import pytest

from command.cli import main
from rlperf.machine import REPO_ROOT

# a store whose rendered report results/ no longer carries, and figures its README quotes from that report
SHIPPED = {
    "results/cpu-xeon-2core/results.sqlite": ["suite hardware", "57,039", "73,165", "## Phase breakdown"],
    "results/nvidia-h200-2026-11-28/part2/smoke/results.sqlite": [
        "suite gpu-smoke", "934,694", "2,419,044", "NVIDIA H200", "## Phase breakdown"],
}


@pytest.mark.parametrize("store", sorted(SHIPPED))
def test_a_shipped_store_renders_its_report_and_stays_unchanged(store, tmp_path, capsys):
    path = REPO_ROOT / store
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    assert main(["report", str(path), "--out", str(tmp_path)]) == 0
    markdown = (tmp_path / "report.md").read_text()
    for text in SHIPPED[store]:
        assert text in markdown, f"{store}: the report lacks {text!r}"
    assert "<svg" in (tmp_path / "report.html").read_text()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
