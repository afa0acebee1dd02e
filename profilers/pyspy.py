"""py-spy around the trainer: a speedscope profile, and a flame graph SVG drawn from the same samples.

py-spy must start the trainer itself: sampling a process it launched needs no extra privileges, while
attaching to a running one needs ptrace rights that containers and CI machines often withhold. One
py-spy run writes one format, so the SVG is rendered here from the speedscope samples with matplotlib
rather than by sampling the trainer a second time.
"""

from __future__ import annotations

import json
import shutil
import sys
import zlib
from pathlib import Path

SPEEDSCOPE_NAME = "pyspy.speedscope.json"
SVG_NAME = "pyspy.flamegraph.svg"
LABEL_MIN_FRACTION = 0.012
# boxes narrower than this share of the samples are left out, as flame graph tools do, to keep the SVG small
BOX_MIN_FRACTION = 0.001


def find_pyspy() -> str | None:
    """py-spy next to this interpreter (a virtualenv's bin), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def record_command(pyspy: str, out_dir: Path, rate_hz: int, follow_subprocesses: bool, target: list[str]) -> list[str]:
    # --function: a frame is its function, not the line executing, so boxes merge as a reader expects
    command = [pyspy, "record", "--output", str(out_dir / SPEEDSCOPE_NAME), "--format", "speedscope",
               "--rate", str(rate_hz), "--function"]
    if follow_subprocesses:
        command.append("--subprocesses")
    return command + ["--", *target]


def stack_counts(speedscope_path: Path) -> dict[tuple[str, ...], float]:
    """Root-first stacks of frame labels -> seconds sampled, over every thread py-spy recorded."""
    data = json.loads(speedscope_path.read_text())
    frames = [f"{frame['name']} ({Path(frame.get('file') or '?').name}:{frame.get('line')})"
              for frame in data["shared"]["frames"]]
    counts: dict[tuple[str, ...], float] = {}
    for profile in data["profiles"]:
        thread = profile.get("name", "thread")
        for sample, weight in zip(profile["samples"], profile["weights"]):
            stack = (thread, *(frames[i] for i in sample))
            counts[stack] = counts.get(stack, 0.0) + weight
    return counts


def write_flamegraph(speedscope_path: Path, image_path: Path) -> int:
    """Draws the flame graph (root at the bottom, width = time sampled) in the format the suffix names;
    returns the number of distinct stacks."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, and far smaller than glyph paths
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    counts = stack_counts(speedscope_path)
    total = sum(counts.values())
    if not total:
        raise ValueError(f"{speedscope_path} holds no samples")
    boxes = _layout(counts)
    depth = max(level for _, level, _, _ in boxes) + 1
    fig, ax = plt.subplots(figsize=(16, 1.2 + 0.22 * depth))
    for label, level, start, width in boxes:
        if width / total < BOX_MIN_FRACTION:
            continue
        hue = zlib.crc32(label.split(" (")[-1].encode()) % 1000 / 1000.0
        ax.add_patch(Rectangle((start / total, level), width / total, 0.92,
                               facecolor=(0.95, 0.35 + 0.5 * hue, 0.15 + 0.2 * hue), edgecolor="white", linewidth=0.3))
        if width / total >= LABEL_MIN_FRACTION:
            ax.text(start / total + 0.002, level + 0.45, label, fontsize=6, va="center", clip_on=True)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, depth)
    ax.set_yticks([])
    ax.set_xlabel(f"share of {total:.2f} s sampled (py-spy)")
    ax.set_title(f"Python stacks of the trainer ({speedscope_path.name})")
    fig.tight_layout()
    fig.savefig(image_path)
    plt.close(fig)
    return len(counts)


def _layout(counts: dict[tuple[str, ...], float]) -> list[tuple[str, int, float, float]]:
    """(label, depth, start, width) boxes: stacks sorted so equal prefixes sit together and merge."""
    boxes: list[tuple[str, int, float, float]] = []
    open_boxes: list[list] = []  # per depth: [label, start, width]
    position = 0.0
    for stack in sorted(counts):
        weight = counts[stack]
        shared = 0
        while shared < min(len(stack), len(open_boxes)) and open_boxes[shared][0] == stack[shared]:
            shared += 1
        for level in range(len(open_boxes) - 1, shared - 1, -1):
            label, start, width = open_boxes.pop()
            boxes.append((label, level, start, width))
        for level in range(shared):
            open_boxes[level][2] += weight
        for label in stack[shared:]:
            open_boxes.append([label, position, weight])
        position += weight
    for level in range(len(open_boxes) - 1, -1, -1):
        label, start, width = open_boxes.pop()
        boxes.append((label, level, start, width))
    return boxes
