"""Draws the pictures the docs show, from stores shipped in results/, with the report's own figure code:
`python docs/images/draw.py` from the repository root rewrites every PNG here."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from decisions.rundata import load, phase_us_per_step  # noqa: E402
from reports import figures  # noqa: E402

PICTURES = {  # PNG name: the store (PATH or PATH::RUN_ID) whose phase breakdown it shows
    "h200-gpu-smoke-phases.png": "results/nvidia-h200-2026-11-28/part2/smoke/results.sqlite",
}


def main() -> int:
    for name, store in PICTURES.items():
        path = ROOT / "docs" / "images" / name

        def save_png(figure, path=path) -> str:
            # The report embeds each figure as SVG; the same figure object is saved as a PNG here instead.
            figure.savefig(path, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
            return ""

        figures.to_svg = save_png
        figures.phase_breakdown(phase_us_per_step(load(str(ROOT / store))))
        print(f"{path.relative_to(ROOT)}: from {store}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
