"""Time to solve: when a run's smoothed episode return first reached its target, in agent steps and seconds.

Smoothed over the most recent whole epochs holding `target_window` episodes; a run that never reached the target is
censored, its time known only to exceed the run (docs/sweeps-and-reports.md#time-to-solve-beside-sps).
"""

from __future__ import annotations

from collections import deque

from reference_trainer.config import TrainConfig


def smoothed_returns(epochs: list[dict], window: int) -> list[float | None]:
    """Per epoch, the smoothed return; None until `window` episodes have finished."""
    recent: deque[tuple[float, int]] = deque()  # (sum of returns, episodes) of the epochs in the window
    total, count, smoothed = 0.0, 0, []
    for epoch in epochs:
        episodes = epoch["episodes"]
        if episodes:
            recent.append((epoch["mean_episode_return"] * episodes, episodes))
            total, count = total + recent[-1][0], count + episodes
            while count - recent[0][1] >= window:
                oldest_total, oldest_count = recent.popleft()
                total, count = total - oldest_total, count - oldest_count
        smoothed.append(total / count if count >= window else None)
    return smoothed


def time_to_solve(cfg: TrainConfig, epochs: list[dict], sps: float) -> dict | None:
    """The run's time to solve (docs/results-format.md), None when no target was set.

    `steps` and `seconds` (from process start to the end of the epoch, so set-up, compilation and warm-up
    are in it) are those of the first epoch whose smoothed return reached the target, or of the last epoch
    when none did. `steady_seconds` is `steps / sps`: the time the run would have needed at its steady speed,
    with no set-up, compilation or warm-up."""
    if cfg.target_return is None:
        return None
    smoothed = smoothed_returns(epochs, cfg.target_window)
    reached = [i for i, value in enumerate(smoothed) if value is not None and value >= cfg.target_return]
    at = reached[0] if reached else len(epochs) - 1
    steps = sum(epoch["steps"] for epoch in epochs[:at + 1])
    return {"target_return": cfg.target_return, "window": cfg.target_window, "solved": bool(reached),
            "epoch": at if reached else None, "steps": steps, "seconds": epochs[at]["end_seconds"],
            "steady_seconds": steps / sps, "smoothed_return": smoothed[at]}
